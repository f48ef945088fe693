"""Regenerate ``data/swegym_specs.json`` from SWE-Gym's fork of the SWE-bench harness.

SWE-Gym (the paper's training set with SWE-smith) grades its rows with a fork of the harness,
``SWE-Gym/SWE-Bench-Fork``, whose ``swebench/harness/constants.py`` adds per-repository /
version specs (test command, install, eval commands) for the repositories SWE-bench does not
have (moto, mypy, dask, MONAI, dvc, bokeh, modin, conan, pydantic, pandas, hydra ...), and whose
``test_spec.make_test_command`` selects mypy's tests by their ``[case ...]`` names. Nothing of
its code is copied: this program imports the fork from a checkout and writes the facts it holds
as JSON (the repositories SWE-bench 4.1.0 already specifies are left to
``data/swebench_specs.json``).

    git clone <SWE-Gym/SWE-Bench-Fork> /tmp/swegym-fork   # or git archive of a mirror
    python3 -m venv /tmp/swegym && /tmp/swegym/bin/pip install unidiff
    /tmp/swegym/bin/python sandbox_worker/evaluation/generate_swegym_specs.py \
        /tmp/swegym-fork COMMIT > sandbox_worker/evaluation/data/swegym_specs.json

With ``--eval-scripts ROWS.jsonl OUT_DIR`` after FORK_DIR COMMIT it also writes the fork's eval
script of every row of ROWS (``OUT_DIR/<instance_id>.sh``), and with ``--parse LOG_DIR
OUT.json`` the status map its parser makes of each ``<owner>__<name>.*.log``: the parity
fixtures of ``tests/unit/sandbox_worker/evaluation/test_specs_swegym.py``.

Runs only in that scratch setting (it imports the fork's ``swebench``); the project never
imports this module.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

# The spec keys the eval script (and the image's set-up) reads: as for SWE-bench's.
KEPT_KEYS = ("python", "test_cmd", "pre_install", "install", "eval_commands", "packages")
SWEBENCH_SPECS = Path(__file__).parent / "data" / "swebench_specs.json"


def _bare_fork(root: Path) -> None:
    """Load the fork's harness modules without the package ``__init__`` files and with
    stand-ins for the libraries only its dataset loaders use (requests, datasets, dotenv)."""
    harness = root / "swebench" / "harness"
    for name, path in (("swebench", root / "swebench"), ("swebench.harness", harness)):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    for name, attrs in (
        ("requests", ()),
        ("datasets", ("Dataset", "load_dataset")),
        ("dotenv", ("load_dotenv",)),  # called at import: reads no file here
    ):
        stub = types.ModuleType(name)
        for attr in attrs:
            setattr(stub, attr, lambda *args, **kwargs: None)
        sys.modules.setdefault(name, stub)


def _specs(commit: str) -> dict[str, object]:
    constants = importlib.import_module("swebench.harness.constants")
    parsers = importlib.import_module("swebench.harness.log_parsers")
    known = {repo.lower() for repo in json.loads(SWEBENCH_SPECS.read_text())["repos"]}
    repos: dict[str, object] = {}
    for repo, versions in sorted(constants.MAP_REPO_VERSION_TO_SPECS.items()):
        if repo in known or repo == "swe-bench/humaneval":
            continue
        repos[repo] = {
            "log_parser": getattr(parsers.MAP_REPO_TO_PARSER.get(repo), "__name__", None),
            "versions": {
                version: {key: spec[key] for key in KEPT_KEYS if key in spec}
                for version, spec in sorted(versions.items())
            },
        }
    return {
        "source": f"SWE-Gym/SWE-Bench-Fork@{commit}: swebench.harness.constants."
        "MAP_REPO_VERSION_TO_SPECS (the repositories SWE-bench 4.1.0 does not specify; keys "
        "lower-cased as the fork keeps them) and swebench.harness.log_parsers.MAP_REPO_TO_PARSER",
        "generated_by": "sandbox_worker/evaluation/generate_swegym_specs.py",
        "repos": repos,
    }


def _eval_scripts(rows_path: Path, out_dir: Path) -> None:
    """The fork's eval script of each row: ``make_eval_script_list`` with env ``testbed`` in
    ``/testbed``, under the script header, as its ``make_test_spec`` builds it."""
    constants = importlib.import_module("swebench.harness.constants")
    test_spec = importlib.import_module("swebench.harness.test_spec")
    out_dir.mkdir(parents=True, exist_ok=True)
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        specs = constants.MAP_REPO_VERSION_TO_SPECS[row["repo"].lower()][row["version"]]
        commands = test_spec.make_eval_script_list(
            row, specs, "testbed", "/testbed", row["base_commit"], row["test_patch"]
        )
        script = "\n".join(["#!/bin/bash", "set -uxo pipefail", *commands]) + "\n"
        (out_dir / f"{row['instance_id']}.sh").write_text(script)


def _parsed(logs_dir: Path, out: Path) -> None:
    """The fork's status map of every ``<repo owner>__<name>*.log`` in ``logs_dir``, by the
    parser the fork gives that repository."""
    parsers = importlib.import_module("swebench.harness.log_parsers")
    maps = {}
    for log in sorted(logs_dir.glob("*.log")):
        owner, name = log.stem.split("__", 1)
        repo = f"{owner}/{name.split('.')[0]}".lower()
        maps[log.name] = parsers.MAP_REPO_TO_PARSER[repo](log.read_text())
    out.write_text(json.dumps(maps, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    _bare_fork(Path(argv[0]))
    if argv[2:3] == ["--eval-scripts"]:
        _eval_scripts(Path(argv[3]), Path(argv[4]))
        return 0
    if argv[2:3] == ["--parse"]:
        _parsed(Path(argv[3]), Path(argv[4]))
        return 0
    json.dump(_specs(argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
