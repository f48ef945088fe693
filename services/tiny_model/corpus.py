"""Embedded training text for the tiny model's byte-level BPE tokenizer.

The tokenizer is trained locally (no hub access), so its corpus lives here: a few kilobytes of the
kinds of text an OpenHands software-engineering agent sees and writes -- Python code, English
prose, JSON (tool calls and results), shell sessions and diffs. The text is original and only
needs to give the BPE trainer realistic byte-pair statistics; its content is irrelevant.
"""

from __future__ import annotations

PYTHON_CODE = '''\
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Task:
    """A unit of work with an identifier and a list of steps."""

    task_id: str
    steps: list[str] = field(default_factory=list)
    done: bool = False

    def add_step(self, step: str) -> None:
        if not step:
            raise ValueError("step must not be empty")
        self.steps.append(step)

    def to_dict(self) -> dict[str, object]:
        return {"task_id": self.task_id, "steps": list(self.steps), "done": self.done}


def read_config(path: Path) -> dict[str, str]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise TypeError(f"expected an object in {path}, got {type(data).__name__}")
    return {str(key): str(value) for key, value in data.items()}


def run_command(args: list[str], cwd: str | None = None, timeout: float = 30.0) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"command failed with exit code {result.returncode}: {result.stderr}")
    return result.stdout


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def update(self, items: list[str]) -> None:
        for item in items:
            self.counts[item] = self.counts.get(item, 0) + 1

    def most_common(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda pair: (-pair[1], pair[0]))[:n]


def fibonacci(n: int) -> int:
    if n < 0:
        raise ValueError("n must be non-negative")
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def test_fibonacci() -> None:
    assert fibonacci(0) == 0
    assert fibonacci(1) == 1
    assert fibonacci(10) == 55


def parse_version(text: str) -> tuple[int, ...]:
    parts = text.strip().split(".")
    return tuple(int(part) for part in parts if part.isdigit())


if __name__ == "__main__":
    for name in sorted(os.listdir(".")):
        print(name)
'''

ENGLISH_TEXT = """\
The function returns the wrong value when the input list is empty. I will first reproduce the
problem with a small script, then read the source file to understand why the loop never runs,
and finally write a fix together with a regression test. Let me look at the repository layout.

The tests are failing because the parser does not handle trailing whitespace. After the change,
all of the tests pass, including the new one that covers the edge case. The patch is small and
does not change the public interface of the module.

I found the bug: the variable is reset inside the loop instead of before it. Moving the
assignment out of the loop fixes the issue. I also updated the documentation string so that it
describes the behaviour for negative numbers.

Please open the file, search for the definition of the class, and replace the old method with the
new implementation. Then run the test suite again to check that nothing else is broken.

The user asked for a summary of the changes. Here it is: the configuration loader now validates
its input, raises a clear error for missing keys, and reads environment variables as overrides.
"""

JSON_TEXT = """\
{"name": "execute_bash", "arguments": {"command": "ls -la /workspace"}}
{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/workspace/src/app.py"}}
{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": "/workspace/app.py",
 "old_str": "return a - b", "new_str": "return a + b"}}
{"name": "finish", "arguments": {"message": "The bug is fixed and the tests pass."}}
{"type": "function", "function": {"name": "execute_bash", "description": "Run a shell command.",
 "parameters": {"type": "object", "properties": {"command": {"type": "string",
 "description": "The command to run."}}, "required": ["command"]}}}
{"id": "call_1", "type": "function", "function": {"name": "think", "arguments": "{}"}}
{"status": "ok", "exit_code": 0, "stdout": "3 passed in 0.12s", "stderr": ""}
{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 1.0}
"""

SHELL_TEXT = """\
$ cd /workspace/repo && git status
On branch main
nothing to commit, working tree clean
$ python -m pytest tests/ -x -q
..F.
FAILED tests/test_math.py::test_add - AssertionError: assert -1 == 3
1 failed, 3 passed in 0.08s
$ grep -rn "def add" src/
src/mathlib/ops.py:12:def add(a, b):
$ sed -n 10,20p src/mathlib/ops.py
$ git diff
diff --git a/src/mathlib/ops.py b/src/mathlib/ops.py
index 3b18e51..a9c4d2f 100644
--- a/src/mathlib/ops.py
+++ b/src/mathlib/ops.py
@@ -10,7 +10,7 @@ def add(a, b):
-    return a - b
+    return a + b
$ echo "done" && exit 0
$ find . -name "*.py" | head -n 20
$ pip install -e . && python -c "import mathlib; print(mathlib.__version__)"
"""

MORE_PYTHON = """\
import asyncio
import logging
import re
from collections import defaultdict
from typing import Iterable, Iterator

logger = logging.getLogger(__name__)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


async def fetch_all(urls: Iterable[str], limit: int = 4) -> list[bytes]:
    semaphore = asyncio.Semaphore(limit)
    results: list[bytes] = []

    async def worker(url: str) -> None:
        async with semaphore:
            logger.info("fetching %s", url)
            await asyncio.sleep(0)
            results.append(url.encode("utf-8"))

    await asyncio.gather(*(worker(url) for url in urls))
    return results


def tokenize_words(text: str) -> Iterator[str]:
    for match in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", text):
        yield match.group(0).lower()


def group_by_length(words: Iterable[str]) -> dict[int, list[str]]:
    groups: defaultdict[int, list[str]] = defaultdict(list)
    for word in words:
        groups[len(word)].append(word)
    return dict(groups)


class Stack:
    def __init__(self) -> None:
        self._items: list[int] = []

    def push(self, value: int) -> None:
        self._items.append(value)

    def pop(self) -> int:
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Stack({self._items!r})"


def merge_sorted(left: list[int], right: list[int]) -> list[int]:
    merged: list[int] = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            j += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged


def normalize_path(path: str) -> str:
    parts: list[str] = []
    for piece in path.replace("\\\\", "/").split("/"):
        if piece in ("", "."):
            continue
        if piece == "..":
            if parts:
                parts.pop()
            continue
        parts.append(piece)
    return "/" + "/".join(parts)
"""

TOOL_OUTPUT_TEXT = """\
Here's the result of running `cat -n` on /workspace/repo/src/mathlib/ops.py:
     1\tdef add(a, b):
     2\t    return a - b
     3\t
     4\t
     5\tdef multiply(a, b):
     6\t    return a * b
The file /workspace/repo/src/mathlib/ops.py has been edited. Review the changes and make sure
they are as expected. Edit the file again if necessary.
Traceback (most recent call last):
  File "/workspace/repo/tests/test_ops.py", line 7, in test_add
    assert add(1, 2) == 3
AssertionError
ModuleNotFoundError: No module named 'requests'
KeyError: 'missing'
TypeError: unsupported operand type(s) for +: 'int' and 'str'
IndentationError: unexpected indent
FileNotFoundError: [Errno 2] No such file or directory: 'config.yaml'
PermissionError: [Errno 13] Permission denied: '/root/secret'
[The command completed with exit code 0.]
[The command completed with exit code 1.]
[Current working directory: /workspace/repo]
[Python interpreter: /usr/bin/python]
"""

MARKDOWN_TEXT = """\
# Project title

A short description of what this library does and why it exists.

## Installation

```bash
pip install -e ".[dev]"
```

## Usage

1. Create a configuration file.
2. Start the server with `python -m server --port 8000`.
3. Send a request with `curl -s http://localhost:8000/health`.

## Configuration

| key      | default | meaning                         |
|----------|---------|---------------------------------|
| port     | 8000    | port to listen on               |
| workers  | 4       | number of worker processes      |
| timeout  | 30      | request timeout in seconds      |

---
name: build
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - uses: checkout
      - run: make test
services:
  redis:
    image: redis:7
    ports:
      - "6379:6379"
    environment:
      LOG_LEVEL: info
"""

PROSE_TEXT = """\
Software engineering agents read issues, explore repositories, run commands and edit files until
the tests pass. A system message describes the available tools; the user message carries the
problem statement; every assistant message may contain reasoning and one or more tool calls; the
environment answers each call with an observation. Reinforcement learning rewards trajectories
that resolve the issue, and the policy improves over many such episodes. Training requires the
exact tokens the model generated together with their probabilities, because recomputing them
later from text would change the numbers. Weights are refreshed between steps, and each turn
remembers which version produced it. Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and
Sunday; January, February, March, April, May, June, July, August, September, October, November,
December. Numbers such as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 256, 1024 and 65536 appear
often in code. Questions: what, why, where, when, which, who, how? Answers should be concise,
correct, complete and helpful. Think step by step, verify the result, and explain the change.
"""

GIT_TEXT = """\
commit 9f2c1e7 (HEAD -> main, origin/main)
Author: Jane Developer <jane@example.com>
Date:   Thu Feb 6 14:03:27 2025 +0100

    Fix off-by-one error in pagination helper

    The last page was skipped whenever the number of items was an exact multiple of the page
    size. Compute the page count with ceiling division and add regression tests.

$ git log --oneline -3
9f2c1e7 Fix off-by-one error in pagination helper
4ab80d2 Refactor request parsing into its own module
11c3f5e Initial commit
$ git checkout -b fix/pagination && git apply --check patch.diff && git stash list
$ docker run --rm --network none --memory 4g --cpus 2 -v /tmp/work:/workspace image:latest bash
$ export PYTHONPATH=/workspace/repo/src; unset VIRTUAL_ENV; which python3; uname -a; df -h
$ tar -xzf archive.tar.gz -C /opt && chmod +x /opt/bin/tool && ln -sf /opt/bin/tool /usr/local/bin
$ awk -F: '{print $1}' /etc/passwd | sort | uniq -c | wc -l; xargs -n1 mkdir -p < dirs.txt
"""

CORPUS: tuple[str, ...] = (
    PYTHON_CODE,
    MORE_PYTHON,
    ENGLISH_TEXT,
    PROSE_TEXT,
    JSON_TEXT,
    SHELL_TEXT,
    TOOL_OUTPUT_TEXT,
    MARKDOWN_TEXT,
    GIT_TEXT,
)
