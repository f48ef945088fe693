"""Regenerate ``data/swebench_specs.json`` from the pinned older SWE-bench harness.

Rows as originally published carry no ``eval_script``: the harness of that time (swebench up to
4.x) built it from per-repository / version specs (``MAP_REPO_VERSION_TO_SPECS``). swebench
5.0.2, the version swerl follows, no longer ships them, so they are recorded here as data,
generated from the older release installed in a scratch environment. Nothing of its code is
copied: this program imports it and writes the facts it holds as JSON.

    python3 -m venv /tmp/swe41
    /tmp/swe41/bin/pip install --no-deps swebench==4.1.0
    /tmp/swe41/bin/pip install requests unidiff python-dotenv tqdm
    /tmp/swe41/bin/python sandbox_worker/evaluation/generate_swebench_specs.py \
        > sandbox_worker/evaluation/data/swebench_specs.json

With ``--eval-scripts ROWS.jsonl OUT_DIR`` it also writes the older harness's eval script of
every row of ROWS (``OUT_DIR/<instance_id>.sh``), or, when OUT ends in ``.jsonl.gz``, all of
them in that one file (a line ``{"instance_id", "eval_script"}`` per row): the parity fixtures
of ``tests/unit/sandbox_worker/evaluation/test_specs.py`` (the second form for every published
SWE-bench Verified row).

Runs only in that scratch environment (it imports the older ``swebench``); the project never
imports this module.
"""

from __future__ import annotations

import gzip
import importlib
import json
import sys
import types
from pathlib import Path

SOURCE_VERSION = "4.1.0"
# The spec keys the eval script (and the image's set-up) reads.
KEPT_KEYS = ("python", "test_cmd", "pre_install", "install", "eval_commands", "packages")


def _bare_harness() -> None:
    """Load swebench's submodules without the package ``__init__`` files (which import docker,
    datasets, modal, bs4 ...); ``datasets`` is only referenced by loaders we do not call."""
    from importlib import metadata, util

    version = metadata.version("swebench")
    assert version == SOURCE_VERSION, version
    spec = util.find_spec("swebench")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, path in (("swebench", root), ("swebench.harness", root / "harness")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    stub = types.ModuleType("datasets")
    stub.Dataset = stub.load_dataset = stub.load_from_disk = None  # type: ignore[attr-defined]
    sys.modules.setdefault("datasets", stub)


def _specs() -> dict[str, object]:
    constants = importlib.import_module("swebench.harness.constants")
    parsers = importlib.import_module("swebench.harness.log_parsers")
    repos: dict[str, object] = {}
    for repo, versions in sorted(constants.MAP_REPO_VERSION_TO_SPECS.items()):
        if constants.MAP_REPO_TO_EXT.get(repo) != "py":
            continue
        repos[repo] = {
            "log_parser": getattr(parsers.MAP_REPO_TO_PARSER.get(repo), "__name__", None),
            "versions": {
                version: {key: spec[key] for key in KEPT_KEYS if key in spec}
                for version, spec in sorted(versions.items())
            },
        }
    return {
        "source": f"swebench=={SOURCE_VERSION}: swebench.harness.constants."
        "MAP_REPO_VERSION_TO_SPECS (Python repositories) and "
        "swebench.harness.log_parsers.MAP_REPO_TO_PARSER",
        "generated_by": "sandbox_worker/evaluation/generate_swebench_specs.py",
        "repos": repos,
    }


def _eval_scripts(rows_path: Path, out_dir: Path) -> None:
    """The harness's ``TestSpec.eval_script`` of each row, built as ``make_test_spec`` builds it
    (``make_eval_script_list`` with env ``testbed`` in ``/testbed``, under the script header)
    without its environment-script step, which would fetch requirements over the network."""
    constants = importlib.import_module("swebench.harness.constants")
    scripts = importlib.import_module("swebench.harness.test_spec.create_scripts")
    archive = out_dir.name.endswith(".jsonl.gz")  # every script in one file, else one each
    if not archive:
        out_dir.mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        specs = constants.MAP_REPO_VERSION_TO_SPECS[row["repo"]][row["version"]]
        commands = scripts.make_eval_script_list(
            row, specs, "testbed", "/testbed", row["base_commit"], row["test_patch"]
        )
        script = "\n".join(["#!/bin/bash", "set -uxo pipefail", *commands]) + "\n"
        if archive:
            out.append(json.dumps({"instance_id": row["instance_id"], "eval_script": script}))
        else:
            (out_dir / f"{row['instance_id']}.sh").write_text(script)
    if archive:  # no name, mtime 0: the same rows give the same bytes
        with out_dir.open("wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            f.write(("\n".join(out) + "\n").encode())


def main(argv: list[str]) -> int:
    _bare_harness()
    if argv[:1] == ["--eval-scripts"]:
        _eval_scripts(Path(argv[1]), Path(argv[2]))
        return 0
    json.dump(_specs(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
