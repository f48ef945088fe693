"""The mini SWE task set: where it lives and how its instances file is built.

Sources, one directory per instance under ``tests/data/instances/<instance_id>/``:
``meta.json`` (repo, created_at, version), ``problem_statement.md``, optional ``hints.md``,
``gold.diff`` (the fix; non-test files only) and ``test.diff`` (tests that fail before the fix).
``python -m sandbox_worker.tasks.mini`` turns them into ``tests/data/instances.jsonl`` in the
SWE-bench instance format: it materialises each repository (:mod:`.repos`) for the base commit,
runs the tests touched by the test patch before and after the gold patch with the given Python,
and derives FAIL_TO_PASS (fail or missing before, pass after) and PASS_TO_PASS (pass both
times). It refuses an instance whose gold patch touches a test file, leaves any test failing,
or fixes nothing. ``--check`` verifies the checked-in file is current (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker.evaluation.grading import case_passed
from sandbox_worker.evaluation.log_parser import parse_log_pytest
from sandbox_worker.evaluation.patches import directives_of_test_patch, patched_files
from sandbox_worker.tasks.repos import DATA_DIR, materialize_repo, repo_name_of

INSTANCES_DIR = DATA_DIR / "instances"
INSTANCES_JSONL = DATA_DIR / "instances.jsonl"
PYTEST_ARGS = ("-m", "pytest", "-rA", "-p", "no:cacheprovider")


class BuildError(RuntimeError):
    """An instance's sources are incomplete or do not make a valid instance."""


@dataclass(frozen=True)
class InstanceSource:
    instance_id: str
    repo: str
    created_at: str
    version: str
    problem_statement: str
    hints_text: str
    patch: str
    test_patch: str


def read_sources(root: Path = INSTANCES_DIR) -> list[InstanceSource]:
    """Every instance source under ``root``, sorted by instance id."""
    sources = []
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
            hints = directory / "hints.md"
            sources.append(
                InstanceSource(
                    instance_id=directory.name,
                    repo=meta["repo"],
                    created_at=meta["created_at"],
                    version=meta["version"],
                    problem_statement=(directory / "problem_statement.md").read_text("utf-8"),
                    hints_text=hints.read_text("utf-8") if hints.exists() else "",
                    patch=(directory / "gold.diff").read_text(encoding="utf-8"),
                    test_patch=(directory / "test.diff").read_text(encoding="utf-8"),
                )
            )
        except (OSError, KeyError, json.JSONDecodeError) as exc:
            raise BuildError(f"{directory}: incomplete instance source: {exc!r}") from exc
    return sources


def build_record(source: InstanceSource, python: str | None) -> dict[str, str]:
    """The SWE-bench row of ``source``; ``python=None`` skips running tests (no test lists)."""
    for patched in patched_files(source.patch):
        if _is_test_path(patched.source) or _is_test_path(patched.target):
            raise BuildError(f"{source.instance_id}: the gold patch touches test file {patched}")
    with tempfile.TemporaryDirectory(prefix="swerl-mini-") as tmp:
        checkout = Path(tmp) / "repo"
        base_commit = materialize_repo(repo_name_of(source.repo), checkout)
        record = {
            "repo": source.repo,
            "instance_id": source.instance_id,
            "base_commit": base_commit,
            "patch": source.patch,
            "test_patch": source.test_patch,
            "problem_statement": source.problem_statement,
            "hints_text": source.hints_text,
            "created_at": source.created_at,
            "version": source.version,
        }
        if python is not None:
            f2p, p2p = _test_lists(source, checkout, python)
            record["FAIL_TO_PASS"] = json.dumps(f2p)
            record["PASS_TO_PASS"] = json.dumps(p2p)
        record["environment_setup_commit"] = base_commit
    return record


def _is_test_path(path: str) -> bool:
    return path.startswith("tests/") or Path(path).name.startswith("test_")


def _test_lists(source: InstanceSource, checkout: Path, python: str) -> tuple[list[str], ...]:
    files = directives_of_test_patch(source.test_patch)
    _git_apply(checkout, source.test_patch, f"{source.instance_id} test patch")
    before = run_pytest(checkout, files, python)
    _git_apply(checkout, source.patch, f"{source.instance_id} gold patch")
    after = run_pytest(checkout, files, python)
    if not after:
        raise BuildError(f"{source.instance_id}: no test results (can {python} run pytest?)")
    failing = sorted(test for test in after if not case_passed(test, after))
    if failing:
        raise BuildError(f"{source.instance_id}: with the gold patch these tests fail: {failing}")
    f2p = [test for test in after if not case_passed(test, before)]
    p2p = [test for test in after if case_passed(test, before)]
    if not f2p:
        raise BuildError(f"{source.instance_id}: the test patch has no test that fails before")
    return f2p, p2p


def run_pytest(checkout: Path, files: list[str], python: str) -> dict[str, str]:
    """Status map of ``python -m pytest -rA`` on ``files`` in ``checkout``."""
    proc = subprocess.run(
        [python, *PYTEST_ARGS, *files],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1",
            "LANG": "C.UTF-8",
            # The mini repositories need no plugins; autoloading the host's (hypothesis...)
            # costs seconds per run.
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
        check=False,
    )
    return parse_log_pytest(proc.stdout + proc.stderr)


def _git_apply(checkout: Path, patch: str, what: str) -> None:
    proc = subprocess.run(
        ["git", "apply", "-"], cwd=checkout, input=patch, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(f"{what} does not apply: {proc.stderr.strip()}")


def render(records: list[dict[str, str]]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.tasks.mini",
        description="Build tests/data/instances.jsonl from tests/data/instances/*/.",
    )
    parser.add_argument("--check", action="store_true", help="only verify the file is current")
    parser.add_argument("--python", default=sys.executable, help="Python that runs the tests")
    parser.add_argument(
        "--output",
        type=Path,
        default=INSTANCES_JSONL,
        help="instances file to write (default tests/data/instances.jsonl)",
    )
    args = parser.parse_args(argv)
    try:
        records = [build_record(source, args.python) for source in read_sources()]
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = render(records)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; rerun without --check", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date ({len(records)} instances)")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {len(records)} instances to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
