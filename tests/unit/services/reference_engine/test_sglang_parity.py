"""The reference engine's SGLang 0.5.23 facts, checked against the installed ``sglang``
package's own source (read as text, not imported: most of it needs a GPU), and the pure parts
that build its answers."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

import pytest

from services.protocol.sglang import SamplingParams
from services.reference_engine.distributed_weights import (
    GROUP_DESTROYED,
    GROUP_MISSING,
    LOAD_FAILED,
    RECEIVE_FAILED,
)
from services.reference_engine.engine import FLUSH_BUSY_MESSAGE, EngineRequest
from services.reference_engine.outputs import QUEUED_ABORT_MESSAGE, queued_abort_output
from services.reference_engine.routes.control import FLUSH_FAILED_TEXT, FLUSH_TIMED_OUT
from services.reference_engine.routes.weights import (
    DISK_LOADED,
    DISTRIBUTED_LOADED,
    GET_WEIGHTS_FAILED,
)
from services.reference_engine.state import (
    SGLANG_GET_WEIGHTS_BY_NAME_ARCHITECTURES,
    reads_weights_by_name,
)
from services.reference_engine.weight_session import (
    ALREADY_OPEN,
    DISTRIBUTED_OUTSIDE,
    NOT_OPEN,
    SESSION_OK,
    WeightUpdateSession,
)


@cache
def sglang_srt() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the sglang package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "srt"


@cache
def literals(relative: str) -> tuple[str, ...]:
    """Every string literal of one SGLang source file: plain strings (implicit concatenation
    joined) and the literal parts of f-strings."""
    tree = ast.parse((sglang_srt() / relative).read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
    return tuple(found)


@pytest.mark.parametrize(
    ("message", "source"),
    [
        (ALREADY_OPEN, "managers/scheduler_components/weight_updater.py"),
        (NOT_OPEN, "managers/scheduler_components/weight_updater.py"),
        (DISTRIBUTED_OUTSIDE, "managers/scheduler_components/weight_updater.py"),
        (FLUSH_BUSY_MESSAGE, "managers/scheduler_components/weight_updater.py"),
        (SESSION_OK, "managers/scheduler_components/weight_updater.py"),
        (DISTRIBUTED_LOADED, "managers/scheduler_components/weight_updater.py"),
        (DISK_LOADED, "managers/scheduler_components/weight_updater.py"),
        (GROUP_DESTROYED, "model_executor/model_runner_components/weight_updater.py"),
        (GROUP_MISSING, "model_executor/model_runner_components/weight_updater.py"),
        (GET_WEIGHTS_FAILED, "entrypoints/http_server.py"),
        (FLUSH_FAILED_TEXT, "entrypoints/http_server.py"),
        (FLUSH_TIMED_OUT, "managers/scheduler_components/flush_wrapper.py"),
        (QUEUED_ABORT_MESSAGE, "managers/tokenizer_manager.py"),
    ],
)
def test_messages_are_sglangs(message: str, source: str) -> None:
    assert message in literals(source)


@pytest.mark.parametrize(
    ("template", "source"),
    [
        (LOAD_FAILED, "model_executor/model_runner_components/weight_updater.py"),
        (RECEIVE_FAILED, "managers/scheduler_components/weight_updater.py"),
    ],
)
def test_message_templates_are_sglangs(template: str, source: str) -> None:
    """The literal parts around ``{}`` are the literal parts of SGLang's f-string."""
    found = literals(source)
    for part in template.split("{}"):
        if part:
            assert any(part in literal for literal in found), part


def _classes_with_get_weights_by_name(models: Path) -> set[str]:
    """Registered model classes (``EntryClass``) that define or inherit
    ``get_weights_by_name``, by class name across SGLang's model files."""
    bases: dict[str, set[str]] = {}
    defines: set[str] = set()
    entries: set[str] = set()
    for path in models.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                names = {
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                }
                bases.setdefault(node.name, set()).update(names)
                if any(
                    isinstance(f, ast.FunctionDef) and f.name == "get_weights_by_name"
                    for f in node.body
                ):
                    defines.add(node.name)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            ):
                items = (
                    node.value.elts
                    if isinstance(node.value, (ast.List, ast.Tuple))
                    else [node.value]
                )
                entries.update(i.id for i in items if isinstance(i, ast.Name))
    having = set(defines)
    grown = True
    while grown:
        grown = False
        for name, parents in bases.items():
            if name not in having and parents & having:
                having.add(name)
                grown = True
    return having & entries


def test_get_weights_by_name_architectures_are_sglangs() -> None:
    found = _classes_with_get_weights_by_name(sglang_srt() / "models")
    assert found == SGLANG_GET_WEIGHTS_BY_NAME_ARCHITECTURES
    assert "Qwen3ForCausalLM" not in found and "Qwen3MoeForCausalLM" not in found


def test_reads_weights_by_name_follows_the_served_architecture() -> None:
    assert reads_weights_by_name(["LlamaForCausalLM"], "sglang")
    assert not reads_weights_by_name(["Qwen3ForCausalLM"], "sglang")
    assert not reads_weights_by_name(["Qwen3MoeForCausalLM"], "sglang")
    assert not reads_weights_by_name(None, "sglang")
    assert reads_weights_by_name(["Qwen3ForCausalLM"], "always")


def test_the_session_opens_once_and_closes_once() -> None:
    session = WeightUpdateSession()
    assert not session.is_open and session.end() == (False, NOT_OPEN)
    assert session.begin("all") == (True, "Success") and session.is_open
    assert session.begin("target") == (False, ALREADY_OPEN)
    assert session.selector == "all"  # the refused begin changed nothing
    session.mark_loaded()
    assert session.loaded_weights
    assert session.end() == (True, "Success") and not session.is_open
    assert not session.loaded_weights


def _request(return_logprob: bool, top: int) -> EngineRequest:
    request = EngineRequest(
        rid="q-1",
        prompt=[1, 2, 3],
        sampling=SamplingParams(),
        sink=lambda _output, _finished: None,
        return_logprob=return_logprob,
        top_logprobs_num=top,
    )
    request.finish = {"type": "abort", "message": QUEUED_ABORT_MESSAGE}
    return request


@pytest.mark.parametrize(
    ("return_logprob", "top", "keys"),
    [
        (False, 0, ["id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens"]),
        (
            True,
            0,
            [
                "id",
                "finish_reason",
                "weight_version",
                "e2e_latency",
                "input_token_logprobs",
                "output_token_logprobs",
                "output_token_logprobs_length",
                "completion_tokens",
            ],
        ),
        (
            True,
            3,
            [
                "id",
                "finish_reason",
                "weight_version",
                "e2e_latency",
                "input_token_logprobs",
                "output_token_logprobs",
                "output_token_logprobs_length",
                "input_top_logprobs",
                "output_top_logprobs",
                "completion_tokens",
            ],
        ),
    ],
)
def test_a_queued_abort_is_answered_as_handle_abort_req_builds_it(
    return_logprob: bool, top: int, keys: list[str]
) -> None:
    answer = queued_abort_output(_request(return_logprob, top), "v7", scripted=False)
    assert answer["text"] == "" and answer["output_ids"] == []
    meta = answer["meta_info"]
    assert list(meta) == keys  # no prompt_tokens, no cached_tokens
    assert meta["id"] == "q-1" and meta["weight_version"] == "v7"
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert meta["completion_tokens"] == 0 and meta["e2e_latency"] >= 0
    assert all(meta[k] == [] for k in keys if k.endswith("logprobs"))
