"""SCRIPTED gold solutions: a reference-engine script that makes the agent apply the gold patch.

Test machinery. A tiny random model cannot solve a task, so the end-to-end tests that need an
agent which *succeeds* run the reference engine in scripted mode
(``python -m services.reference_engine.server --script FILE``, see
:mod:`services.reference_engine.script`): the engine replays given assistant outputs (with the
model's real logprobs) instead of sampling. This module writes such a script from instances' gold
patches, so the real OpenHands agent, through the real adapter, fixes each instance in its real
sandbox with the real tools. Nothing here is a policy; every scripted turn says so in its text.

Per instance, one script line ``{"match": M, "turns": [T1, T2, T3]}``:

* ``M`` is the first line(s) of the instance's problem statement, the shortest prefix of lines
  that occurs in no other instance's problem statement or scripted turns (the engine picks the
  first line whose ``match`` occurs in the rendered prompt, and later prompts also contain the
  earlier turns' commands). An instance without such a prefix is refused.
* ``T1``: the ``terminal`` tool writes the gold patch to :data:`PATCH_PATH` with a quoted
  heredoc (the terminal is an interactive bash on a PTY: carriage returns, tabs, control
  characters and non-ASCII text may not survive it, so a patch containing any of them, or a very
  long line, or the heredoc delimiter, travels base64-encoded through ``base64 -d`` instead).
* ``T2``: the ``terminal`` tool runs ``git apply`` of that file in the repository.
* ``T3``: the ``finish`` tool.

Outputs are in the tiny model's Hermes/Qwen format
(``<tool_call>{"name", "arguments"}</tool_call>``), with OpenHands' tool and argument names
(``terminal``/``command``, ``finish``/``message``: see ``tests/data/openhands_requests/``).

``python -m sandbox_worker.tasks.scripted --out FILE [--instances PATH] [--only ID]...``
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from services.datasets import DatasetError, load_instances
from services.protocol.instance import SWEInstance

PATCH_PATH = "/tmp/swerl-scripted-gold.diff"
HEREDOC_DELIMITER = "SWERL_SCRIPTED_GOLD_EOF"
TERMINAL_TOOL = "terminal"
FINISH_TOOL = "finish"
LABEL = "SCRIPTED gold solution (test machinery, not a policy)"
# Longest patch line sent verbatim through the PTY (canonical-mode line buffers hold 4095).
MAX_VERBATIM_LINE = 2000
# Typed verbatim: printable ASCII and newlines only (no CR, tab, control or non-ASCII bytes,
# which a PTY's line discipline, readline or the locale may alter).
_UNSAFE_CHARS = re.compile(r"[^\n\x20-\x7e]")
_REPO_DIR_RE = re.compile(r"^/[A-Za-z0-9._\-/]*$")


class ScriptBuildError(ValueError):
    """No script can be written for these instances (the message says which and why)."""


def tool_call(name: str, arguments: dict[str, str], thought: str = "") -> str:
    """One assistant output: optional text, then a Hermes ``<tool_call>`` block."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{thought}<tool_call>\n{call}\n</tool_call>"


def needs_base64(patch: str) -> bool:
    """True if ``patch`` cannot be typed verbatim into an interactive bash heredoc."""
    return (
        bool(_UNSAFE_CHARS.search(patch))
        or HEREDOC_DELIMITER in patch
        or any(len(line) > MAX_VERBATIM_LINE for line in patch.split("\n"))
    )


def write_patch_command(patch: str, path: str = PATCH_PATH) -> str:
    """A single shell command (a quoted heredoc) that writes ``patch`` to ``path`` exactly."""
    if not patch.endswith("\n"):
        raise ScriptBuildError("a patch must end with a newline")
    if needs_base64(patch):
        body = "\n".join(textwrap.wrap(base64.b64encode(patch.encode()).decode(), 76))
        return f"base64 -d > {path} <<'{HEREDOC_DELIMITER}'\n{body}\n{HEREDOC_DELIMITER}"
    return f"cat > {path} <<'{HEREDOC_DELIMITER}'\n{patch}{HEREDOC_DELIMITER}"


def solution_turns(instance: SWEInstance, repo_dir: str = "/testbed") -> list[str]:
    """The scripted assistant outputs that apply ``instance``'s gold patch and finish."""
    if not _REPO_DIR_RE.match(repo_dir):
        raise ScriptBuildError(f"repo_dir must be a plain absolute path, got {repo_dir!r}")
    if not instance.gold_patch.strip():
        raise ScriptBuildError(f"{instance.instance_id}: the gold patch is empty")
    apply = f"cd {repo_dir} && git apply --verbose {PATCH_PATH} && git status --short"
    return [
        tool_call(
            TERMINAL_TOOL,
            {"command": write_patch_command(instance.gold_patch)},
            thought=f"{LABEL} for {instance.instance_id}: write the reference patch.\n",
        ),
        tool_call(TERMINAL_TOOL, {"command": apply}, thought=f"{LABEL}: apply it.\n"),
        tool_call(FINISH_TOOL, {"message": f"{LABEL}: the gold patch is applied."}),
    ]


def unique_match(instance: SWEInstance, others_text: Sequence[str]) -> str:
    """The shortest prefix of whole lines of the problem statement found in no other text."""
    lines = instance.problem_statement.strip().splitlines()
    for n in range(1, len(lines) + 1):
        candidate = "\n".join(lines[:n]).strip()
        if len(candidate) < 8:  # too short to be specific (e.g. a lone heading)
            continue
        if not any(candidate in text for text in others_text):
            return candidate
    raise ScriptBuildError(
        f"{instance.instance_id}: no prefix of its problem statement is unique among the "
        "instances (the scripted engine could not tell their prompts apart)"
    )


def build_script(instances: Sequence[SWEInstance], repo_dir: str = "/testbed") -> list[dict]:
    """One script entry per instance (see the module docstring); refuses duplicates."""
    if not instances:
        raise ScriptBuildError("no instances to script")
    ids = [i.instance_id for i in instances]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ScriptBuildError(f"duplicate instance ids: {duplicates}")
    turns = {i.instance_id: solution_turns(i, repo_dir) for i in instances}
    entries = []
    for inst in instances:
        others = [
            text
            for other in instances
            if other.instance_id != inst.instance_id
            for text in (other.problem_statement, *turns[other.instance_id])
        ]
        entries.append({"match": unique_match(inst, others), "turns": turns[inst.instance_id]})
    return entries


def write_script(
    instances: Sequence[SWEInstance], path: str | Path, repo_dir: str = "/testbed"
) -> Path:
    """Write the JSONL script for ``instances`` to ``path``; return the path."""
    entries = build_script(instances, repo_dir)
    path = Path(path)
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries))
    return path


def main(argv: list[str] | None = None) -> int:
    from sandbox_worker.images import DEFAULT_INSTANCES

    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.tasks.scripted",
        description=(
            "Write a SCRIPTED reference-engine script (test machinery) in which the agent "
            "applies each instance's gold patch with the terminal tool and finishes."
        ),
    )
    parser.add_argument("--out", required=True, help="script file to write (JSONL)")
    parser.add_argument("--instances", default=str(DEFAULT_INSTANCES), help="instances file")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="ID",
        help="only this instance (repeatable)",
    )
    parser.add_argument(
        "--repo-dir", default="/testbed", help="the repository inside the sandbox (/testbed)"
    )
    args = parser.parse_args(argv)
    try:
        instances = load_instances(args.instances, only=args.only)
        path = write_script(instances, args.out, args.repo_dir)
    except (DatasetError, ScriptBuildError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(instances)} scripted solution(s) to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
