"""Process environment for the OpenHands SDK, applied before the SDK is imported.

LiteLLM (imported by the SDK) downloads a model-cost map at import time unless
``LITELLM_LOCAL_MODEL_COST_MAP`` is set; on a machine without network that is three failed
attempts and ~7 s of back-off per process, and in production it is an outbound connection we
never want. Laminar tracing stays off because none of its variables are set.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Set in every process (worker or agent server) that imports the OpenHands SDK.
SDK_ENVIRONMENT: Mapping[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENHANDS_SUPPRESS_BANNER": "1",
    "LITELLM_LOG": "ERROR",
    # The task's context limit is given to the SDK as max_input_tokens (the condenser's token
    # trigger); the SDK refuses windows below 16k unless this is set (tests use small ones).
    "ALLOW_SHORT_CONTEXT_WINDOWS": "true",
}


def prepare_sdk_environment() -> None:
    """Apply :data:`SDK_ENVIRONMENT` to ``os.environ`` (values already set are kept).

    Must run before the first ``import openhands``/``import litellm`` of the process; the
    modules of this package that import the SDK call it at the top.
    """
    for key, value in SDK_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


#: readline settings for the agent's interactive bash. Bash >= 5.1 turns bracketed paste on,
#: which wraps every command's output in ``ESC[?2004l`` / ``ESC[?2004h`` escape codes in the
#: subprocess terminal's PTY; those would end up in every observation the policy is trained on.
INPUTRC_TEXT = "set enable-bracketed-paste off\n"


def local_inputrc() -> str:
    """Path of an inputrc with :data:`INPUTRC_TEXT` on this machine (written once)."""
    path = Path(tempfile.gettempdir()) / "swerl-openhands-inputrc"
    if not path.is_file() or path.read_text() != INPUTRC_TEXT:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(INPUTRC_TEXT)
        tmp.replace(path)
    return str(path)
