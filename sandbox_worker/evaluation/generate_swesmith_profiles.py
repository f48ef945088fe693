"""Generate ``data/swesmith_profiles.json`` and the parity fixtures from SWE-smith's own profiles.

SWE-smith grades a row with its repository's *profile* (``swesmith.profiles.python``): the test
command (the default activates the image's conda env and runs pytest verbosely over the whole
suite; a few repositories override it), whether only the graded test files run
(``min_testing``), the rule ``get_test_cmd`` builds the row's command by (the graded files, or
mypy's ``-k`` over the reference test patch's cases), the rule ``get_test_files`` finds a
row's test files by, the time limit and the log parser (each
rule and parser under the name of swerl's counterpart). swerl reads those facts from this data
file; nothing of SWE-smith's code is copied. Run it in a scratch environment that can import
swesmith (its dependencies are heavy; none is needed at run time)::

    python3.12 -m venv /tmp/swesmith-env
    /tmp/swesmith-env/bin/pip install --no-deps swesmith==0.0.9 swebench==4.1.0
    /tmp/swesmith-env/bin/pip install docker python-dotenv ghapi beautifulsoup4 unidiff \\
        datasets modal tenacity
    /tmp/swesmith-env/bin/python sandbox_worker/evaluation/generate_swesmith_profiles.py \\
        sandbox_worker/evaluation/data/swesmith_profiles.json tests/data/swesmith_profiles

The second argument is the fixture folder: ``commands.json`` (``get_test_cmd`` and
``get_test_files`` of sample rows, mypy's with and without an ``instance_ref``) and
``parsed.json`` (each sample log of ``logs/`` through the profile parser that owns it).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

# mypy's data-driven cases in a SWE-bench test patch: added ones and one in the context.
_MYPY_TEST_PATCH = """\
diff --git a/test-data/unit/check-overloading.test b/test-data/unit/check-overloading.test
--- a/test-data/unit/check-overloading.test
+++ b/test-data/unit/check-overloading.test
@@ -10,3 +10,11 @@
 [case testOverloadContext]
 from typing import overload
 [builtins fixtures/tuple.pyi]
+
+[case testOverloadNewCase]
+reveal_type(1)  # N: Revealed type is "Literal[1]?"
+
+[case testOverloadNewCase-xfail]
+x: int = ""
+[out]
+main:1: error: Incompatible types
"""
_MYPY_ONE_CASE = """\
diff --git a/test-data/unit/check-final.test b/test-data/unit/check-final.test
--- a/test-data/unit/check-final.test
+++ b/test-data/unit/check-final.test
@@ -1,1 +1,3 @@
+[case testFinalOnly]
+x = 1
"""
_MYPY_F2P = ["mypy/test/testcheck.py::TypeCheckSuite::check-overloading.test::testOverloadNewCase"]
_MYPY_P2P = ["mypy/test/testcheck.py::TypeCheckSuite::check-overloading.test::testOverloadContext"]
_TORNADO_F2P = ["test_redirect (tornado.test.web_test.RedirectHandlerTest)"]
_TORNADO_P2P = [
    "test_gzip (tornado.test.httpclient_test.HTTPClientCommonTestCase)",
    "test_redirect (tornado.test.web_test.RedirectHandlerTest)",
]

_NO_TESTS: dict[str, Any] = {"FAIL_TO_PASS": [], "PASS_TO_PASS": []}
# A row of each kind the fixtures hold: (profile key, F2P, P2P, the row's other fields).
SAMPLE_ROWS: list[tuple[str, list[str], list[str], dict[str, Any]]] = [
    (
        "pallets__click.fde47b4b",
        ["tests/test_basic.py::test_a"],
        ["tests/test_utils.py::test_b"],
        {},
    ),
    (
        "pandas-dev__pandas.95280573",
        ["pandas/tests/a/test_x.py::test_one", "pandas/tests/a/test_x.py::test_two"],
        ["pandas/tests/b/test_y.py::test_three", "pandas/tests/a/test_x.py::test_four"],
        {},
    ),
    (
        "pydantic__pydantic.acb0f10f",
        ["tests/test_main.py::test_m"],
        ["tests/test_x.py::test_n"],
        {},
    ),
    ("paramiko__paramiko.23f92003", ["tests/test_client.py::T::test_c"], [], {}),
    (
        "sympy__sympy.2ab64612",
        ["sympy/core/tests/test_basic.py::test_equality"],
        [
            "sympy/core/tests/test_args.py::test_sympy__core__add",
            "sympy/core/tests/test_basic.py::t",
        ],
        {},
    ),
    # mypy: a bug-generated row (no instance_ref), a PR mirror's with one case, with three
    ("python__mypy.e93f06ce", _MYPY_F2P, _MYPY_P2P, {}),
    ("python__mypy.e93f06ce", _MYPY_F2P, [], {"instance_ref": {"test_patch": _MYPY_ONE_CASE}}),
    (
        "python__mypy.e93f06ce",
        _MYPY_F2P,
        _MYPY_P2P,
        {"instance_ref": {"test_patch": _MYPY_TEST_PATCH}},
    ),
    ("tornadoweb__tornado.d5ac65c1", _TORNADO_F2P, _TORNADO_P2P, {}),
    ("un33k__python-slugify.872b3750", ["test_manager (test.TestSlugify)"], [], {}),
    (
        "mido__mido.a0158ff9",
        ["../dev/tests/test_ports.py::test_close", "tests/test_frozen.py::test_hashability"],
        ["../dev/tests/test_ports.py::test_open", "../dev/tests/test_midifiles.py::test_meta"],
        {},
    ),
]
# The sample logs and the profiles whose parsers read them.
SAMPLE_LOGS = {
    "pytest_verbose.log": "pallets__click.fde47b4b",
    "pytest_xdist.log": "HIPS__autograd.ac044f0d",
    "pytest_summary.log": "paramiko__paramiko.23f92003",
    "unittest_verbose.log": "un33k__python-slugify.872b3750",
    "unittest_headers.log": "tornadoweb__tornado.d5ac65c1",
    "pytest_mypy.log": "python__mypy.e93f06ce",
}


def profiles_table() -> dict[str, Any]:
    from swesmith.profiles import registry
    from swesmith.profiles.base import RepoProfile
    from swesmith.profiles.python import (
        AutogradAc044f0d,
        MidoA0158ff9,
        MypyE93f06ce,
        Paramiko23f92003,
        PythonProfile,
        PythonSlugify872b3750,
        TornadoD5ac65c1,
    )

    parsers = {
        PythonProfile.log_parser: "swesmith_pytest",
        AutogradAc044f0d.log_parser: "swesmith_pytest_xdist",
        Paramiko23f92003.log_parser: "swesmith_pytest_summary",
        PythonSlugify872b3750.log_parser: "swesmith_unittest_verbose",
        TornadoD5ac65c1.log_parser: "swesmith_unittest_headers",
        MypyE93f06ce.log_parser: "swesmith_status_last_word",
    }
    test_cmd_rules = {
        RepoProfile.get_test_cmd: "test_files",
        MypyE93f06ce.get_test_cmd: "k_test_patch_cases",
    }
    test_files_rules = {
        PythonProfile.get_test_files: "pytest_ids",
        MidoA0158ff9.get_test_files: "pytest_ids_dev_prefix",
        TornadoD5ac65c1.get_test_files: "unittest_modules",
        PythonSlugify872b3750.get_test_files: "fixed",
    }
    repos: dict[str, Any] = {}
    for key in sorted(registry.keys()):
        profile = registry.get(key)
        if not isinstance(profile, PythonProfile) or key != profile.repo_name:
            continue  # other languages; each profile once (under its repo name)
        repos[profile.repo_name] = {
            "owner": profile.owner,
            "repo": profile.repo,
            "commit": profile.commit,
            "mirror": profile.mirror_name,
            "image": profile.image_name,
            "test_cmd": profile.test_cmd,
            "min_testing": bool(profile.min_testing),
            "timeout": int(profile.timeout),
            "log_parser": parsers.get(type(profile).log_parser, f"own:{type(profile).__name__}"),
            "test_cmd_rule": test_cmd_rules.get(
                type(profile).get_test_cmd, f"own:{type(profile).__name__}"
            ),
            "test_files_rule": test_files_rules.get(
                type(profile).get_test_files, f"own:{type(profile).__name__}"
            ),
        }
        if repos[profile.repo_name]["test_files_rule"] == "fixed":  # the same for every row
            f2p, p2p = profile.get_test_files({**_NO_TESTS, "instance_id": f"{key}.x"})
            assert f2p == p2p, f"{key}: F2P and P2P files differ"
            repos[profile.repo_name]["test_files_fixed"] = f2p
    return {
        "source": f"swesmith=={importlib.metadata.version('swesmith')} (swesmith.profiles.python)",
        "repos": repos,
    }


def fixtures(out: Path) -> None:
    from swesmith.profiles import registry

    commands = []
    for key, f2p, p2p, extra in SAMPLE_ROWS:
        row = {
            "instance_id": f"{key}.func_pm_ctrl_invert_if__abcd1234",
            "repo": f"swesmith/{key}",
            "patch": "diff --git a/x.py b/x.py\n",
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
            **extra,
        }
        profile = registry.get_from_inst(row)
        command, _ = profile.get_test_cmd(row)
        # sorted: tornado's get_test_files gives sets (the others' are sorted already)
        files = [sorted(found) for found in profile.get_test_files(row)]
        commands.append({"row": row, "test_command": command, "test_files": files})
    (out / "commands.json").write_text(json.dumps(commands, indent=2) + "\n")
    parsed = {}
    for name, key in SAMPLE_LOGS.items():
        log = (out / "logs" / name).read_text()
        parsed[name] = {"profile": key, "status_map": registry.get(key).log_parser(log)}
    (out / "parsed.json").write_text(json.dumps(parsed, indent=2, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    table = profiles_table()
    Path(argv[0]).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    fixtures(Path(argv[1]))
    print(f"{len(table['repos'])} Python profiles from {table['source']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
