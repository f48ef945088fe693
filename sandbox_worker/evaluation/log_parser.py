"""The SWE-bench harness's log parsers for Python repositories, re-implemented.

One parser per test-runner output format, under the harness's names (``parse_log_django``,
``parse_log_sympy``, ...), and the harness's choice of parser per repository
(:data:`REPO_PARSERS`, swebench 5.0.2's ``MAP_REPO_TO_PARSER_PY``). Each maps a test id to a
status (:class:`TestStatus`); a test that never reports is simply *missing*, which grading counts
as a failure.

Re-implemented rather than imported: ``swebench.harness`` cannot be imported without its heavy
dependency tree (docker, datasets, modal ...), and swebench is not a runtime dependency of
swerl. ``tests/unit/sandbox_worker/evaluation/test_log_parser.py`` runs swebench's own parsers
on the same logs and requires equal maps. The formats:

- ``pytest``: ``pytest -rA``'s short summary, ``STATUS node_id`` (``FAILED id - message``);
  pytest's skip summary ``SKIPPED [2] path:line: reason`` names no test and is dropped.
- ``pytest_options``: the same, with a parametrized id's absolute-path option reduced to its
  last component (``test_x[/tmp/abc/file.txt]`` -> ``test_x[/file.txt]``).
- ``pytest_v2``: the same after stripping ANSI colour codes and control characters; the id is
  everything after the status (up to `` - `` on FAILED lines); also ``id ... STATUS`` lines of
  older pytest versions (``id STATUS`` at the end of the line).
- ``matplotlib``: ``pytest`` with ``MouseButton.LEFT/RIGHT`` written as ``1``/``3`` in ids.
- ``seaborn``: ``FAILED id``, ``PASSED id`` and ``id PASSED ...`` lines.
- ``django``: Django's runner at verbosity 2, ``test (module.Class) ... ok|skipped|FAIL|ERROR``,
  ``FAIL: test`` / ``ERROR: test`` headers, an ``ok`` on a later line (output in between), and
  three known interleavings of a test line with the runner's own messages.
- ``sympy``: sympy's ``bin/test``, ``test_name ok|F|E`` lines and ``____ path.py:test ____``
  failure headers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sandbox_worker.evaluation.constants import TestStatus

LogParser = Callable[[str], dict[str, str]]

_STATUSES = tuple(status.value for status in TestStatus)
_SKIP_SUMMARY_COUNT = re.compile(r"^\[\d+\]$")
_OPTION = re.compile(r"(.*?)\[(.*)\]")
_ANSI_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL_CHARS = str.maketrans("", "", "".join(chr(code) for code in range(1, 32)))
_SYMPY_FAILURE_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")
_DJANGO_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
_DJANGO_VERSION_TEST = "--version is equivalent to version"
# django__django-7188: a migration message printed on the same line as the test.
_DJANGO_SITES_MIGRATION = "Applying sites.0002_alter_domain_unique...test_no_migrations"
# A test line interrupted by one of the runner's multi-line messages, then "ok".
_DJANGO_INTERRUPTED = tuple(
    re.compile(pattern, re.MULTILINE)
    for pattern in (
        r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
        r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
        r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$",
    )
)


def _is_skip_summary(status: str, name: str) -> bool:
    return status == TestStatus.SKIPPED.value and bool(_SKIP_SUMMARY_COUNT.match(name))


def _summary_fields(line: str) -> tuple[str, str] | None:
    """``(status, id)`` of a ``pytest -rA`` summary line, or None."""
    if not line.startswith(_STATUSES):
        return None
    if line.startswith(TestStatus.FAILED.value):
        line = line.replace(" - ", " ")
    fields = line.split()
    if len(fields) <= 1 or _is_skip_summary(fields[0], fields[1]):
        return None
    return fields[0], fields[1]


def parse_log_pytest(log: str) -> dict[str, str]:
    """Map each test node id in ``log`` to its status (the last line for a test wins)."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        parsed = _summary_fields(line)
        if parsed is not None:
            status_map[parsed[1]] = parsed[0]
    return status_map


def _short_option(test: str) -> str:
    match = _OPTION.search(test)
    if match is None:
        return test
    main, option = match.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


def parse_log_pytest_options(log: str) -> dict[str, str]:
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        parsed = _summary_fields(line)
        if parsed is not None:
            status_map[_short_option(parsed[1])] = parsed[0]
    return status_map


def parse_log_pytest_v2(log: str) -> dict[str, str]:
    status_map: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _ANSI_COLOUR.sub("", raw).translate(_CONTROL_CHARS)
        if line.startswith(_STATUSES):
            if line.startswith(TestStatus.FAILED.value):
                line = line.split(" - ", 1)[0]
            fields = line.split()
            if len(fields) >= 2 and not _is_skip_summary(fields[0], fields[1]):
                status_map[" ".join(fields[1:])] = fields[0]
        elif line.endswith(_STATUSES):
            fields = line.split()
            if len(fields) >= 2:
                status_map[" ".join(fields[:-1])] = fields[-1]
    return status_map


_FAILED_PROGRESS = re.compile(r"FAILED\s*\[.*?\]")


def parse_log_pytest_pydantic(log: str) -> dict[str, str]:
    """SWE-Gym's fork's parser for pydantic (``-vv -o console_output_style=classic``): the
    v2 cleaning of colour codes and control characters, ``FAILED [ 12%]`` made ``FAILED``,
    then ``STATUS nodeid`` lines (a FAILED line's `` - `` reason dropped into the fields) and
    ``nodeid STATUS`` lines; the test id is the one field after or before the status."""
    status_map: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _ANSI_COLOUR.sub("", raw).translate(_CONTROL_CHARS)
        line = _FAILED_PROGRESS.sub("FAILED", line)
        if line.startswith(_STATUSES):
            if line.startswith(TestStatus.FAILED.value):
                line = line.replace(" - ", " ")
            fields = line.split()
            if len(fields) >= 2:
                status_map[fields[1]] = fields[0]
        elif line.endswith(_STATUSES):
            fields = line.split()
            if len(fields) >= 2:
                status_map[fields[0]] = fields[1]
    return status_map


def parse_log_matplotlib(log: str) -> dict[str, str]:
    return parse_log_pytest(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


def parse_log_seaborn(log: str) -> dict[str, str]:
    status_map: dict[str, str] = {}
    passed, failed = TestStatus.PASSED.value, TestStatus.FAILED.value
    for line in log.split("\n"):
        fields = line.split()
        if len(fields) < 2:
            continue
        if line.startswith(failed):
            status_map[fields[1]] = failed
        elif f" {passed} " in line:
            if fields[1] == passed:
                status_map[fields[0]] = passed
        elif line.startswith(passed):
            status_map[fields[1]] = passed
    return status_map


def parse_log_sympy(log: str) -> dict[str, str]:
    status_map: dict[str, str] = {}
    for match in _SYMPY_FAILURE_HEADER.findall(log):
        status_map[f"{match[1]}.py:{match[2]}"] = TestStatus.FAILED.value
    endings = ((" E", TestStatus.ERROR), (" F", TestStatus.FAILED), (" ok", TestStatus.PASSED))
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        for ending, status in endings:
            if line.endswith(ending):
                status_map[line.split()[0]] = status.value
    return status_map


def _django_line(line: str, status_map: dict[str, str], prev_test: str | None) -> str | None:
    """Record what one stripped line of Django's runner says; returns the test in progress."""
    if _DJANGO_VERSION_TEST in line:
        status_map[_DJANGO_VERSION_TEST] = TestStatus.PASSED.value
    if " ... " in line:
        prev_test = line.split(" ... ")[0]
    for suffix in _DJANGO_PASS_SUFFIXES:
        if line.endswith(suffix):
            if line.startswith(_DJANGO_SITES_MIGRATION):
                line = line.split("...", 1)[-1].strip()
            status_map[line.rsplit(suffix, 1)[0]] = TestStatus.PASSED.value
            break
    if " ... skipped" in line:
        status_map[line.split(" ... skipped")[0]] = TestStatus.SKIPPED.value
    if line.endswith(" ... FAIL"):
        status_map[line.split(" ... FAIL")[0]] = TestStatus.FAILED.value
    if line.startswith("FAIL:") and len(line.split()) > 1:
        status_map[line.split()[1].strip()] = TestStatus.FAILED.value
    if line.endswith(" ... ERROR"):
        status_map[line.split(" ... ERROR")[0]] = TestStatus.ERROR.value
    if line.startswith("ERROR:") and len(line.split()) > 1:
        status_map[line.split()[1].strip()] = TestStatus.ERROR.value
    if line.startswith("ok") and prev_test is not None:
        # The test passed with output between its " ... " and the "ok".
        status_map[prev_test] = TestStatus.PASSED.value
    return prev_test


def parse_log_django(log: str) -> dict[str, str]:
    status_map: dict[str, str] = {}
    prev_test: str | None = None
    for line in log.split("\n"):
        prev_test = _django_line(line.strip(), status_map, prev_test)
    for pattern in _DJANGO_INTERRUPTED:
        for match in pattern.finditer(log):
            status_map[match.group(1)] = TestStatus.PASSED.value
    return status_map


# The harness's parser names (``log_parser`` of a dataset row) -> parser.
PARSERS: dict[str, LogParser] = {
    "parse_log_pytest": parse_log_pytest,
    "parse_log_pytest_options": parse_log_pytest_options,
    "parse_log_pytest_v2": parse_log_pytest_v2,
    "parse_log_django": parse_log_django,
    "parse_log_seaborn": parse_log_seaborn,
    "parse_log_sympy": parse_log_sympy,
    "parse_log_matplotlib": parse_log_matplotlib,
    **dict.fromkeys(
        (
            "parse_log_astroid",
            "parse_log_flask",
            "parse_log_marshmallow",
            "parse_log_pvlib",
            "parse_log_pyvista",
            "parse_log_sqlfluff",
            "parse_log_xarray",
        ),
        parse_log_pytest,
    ),
    **dict.fromkeys(
        ("parse_log_pydicom", "parse_log_requests", "parse_log_pylint"), parse_log_pytest_options
    ),
    **dict.fromkeys(
        ("parse_log_astropy", "parse_log_scikit", "parse_log_sphinx"), parse_log_pytest_v2
    ),
}

# The harness's parser per repository (swebench 5.0.2 ``MAP_REPO_TO_PARSER_PY``).
REPO_PARSERS: dict[str, str] = {
    "astropy/astropy": "parse_log_astropy",
    "django/django": "parse_log_django",
    "marshmallow-code/marshmallow": "parse_log_marshmallow",
    "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn",
    "pallets/flask": "parse_log_flask",
    "psf/requests": "parse_log_requests",
    "pvlib/pvlib-python": "parse_log_pvlib",
    "pydata/xarray": "parse_log_xarray",
    "pydicom/pydicom": "parse_log_pydicom",
    "pylint-dev/astroid": "parse_log_astroid",
    "pylint-dev/pylint": "parse_log_pylint",
    "pytest-dev/pytest": "parse_log_pytest",
    "pyvista/pyvista": "parse_log_pyvista",
    "scikit-learn/scikit-learn": "parse_log_scikit",
    "sqlfluff/sqlfluff": "parse_log_sqlfluff",
    "sphinx-doc/sphinx": "parse_log_sphinx",
    "sympy/sympy": "parse_log_sympy",
}
DEFAULT_PARSER = "parse_log_pytest"  # repositories the harness does not list (SWE-Gym, own)

# Parsers of SWE-Gym's fork of the harness beyond SWE-bench's (specs.py gives them its rows).
SWEGYM_PARSERS: dict[str, LogParser] = {"parse_log_pytest_pydantic": parse_log_pytest_pydantic}


def _smith_parser(pattern: str, name_group: int) -> LogParser:
    """A SWE-smith profile parser: every line matched against ``pattern`` (``{status}`` in it)
    for each status in order, the test id from ``name_group``; later matches overwrite."""
    compiled = [(status, re.compile(pattern.format(status=status))) for status in _STATUSES]

    def parse(log: str) -> dict[str, str]:
        status_map: dict[str, str] = {}
        for line in log.split("\n"):
            for status, regex in compiled:
                match = regex.match(line)
                if match:
                    status_map[match.group(name_group)] = status
        return status_map

    return parse


# un33k/python-slugify's profile: unittest --verbose result lines "<description> ... <word>",
# the description of letters, digits, "_-,.'()" and whitespace only (a line with any other
# character is not read); "ok", "FAIL" and "ERROR" count, anything else (skipped ...) does not.
_UNITTEST_DESCRIPTION = r"^([a-zA-Z0-9_\-,\.\s\(\)']+)\s\.{3}\s"
_UNITTEST_RESULTS = tuple(
    (re.compile(f"{_UNITTEST_DESCRIPTION}{word}$"), status.value)
    for word, status in (
        ("ok", TestStatus.PASSED),
        ("FAIL", TestStatus.FAILED),
        ("ERROR", TestStatus.ERROR),
    )
)


def parse_swesmith_unittest_verbose(log: str) -> dict[str, str]:
    """python-slugify's SWE-smith parser: ``test_x (test.T) ... ok|FAIL|ERROR`` lines."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        for regex, status in _UNITTEST_RESULTS:
            match = regex.match(line)
            if match:
                status_map[match.group(1)] = status
                break
    return status_map


def parse_swesmith_unittest_headers(log: str) -> dict[str, str]:
    """tornadoweb/tornado's SWE-smith parser: a line ending ``... ok`` passes and one holding
    `` ... skipped `` is skipped (the id: the line before its first `` ... ``); a failure is
    read from its ``FAIL: <test> (<class>)`` / ``ERROR: ...`` header (the id: the header's
    second and third words), never from its ``... FAIL`` result line."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        if line.endswith("... ok"):
            status_map[line.split(" ... ")[0]] = TestStatus.PASSED.value
        elif " ... skipped " in line:
            status_map[line.split(" ... ")[0]] = TestStatus.SKIPPED.value
        elif line.startswith(("ERROR:", "FAIL:")):
            status_map[" ".join(line.split()[1:3])] = TestStatus.FAILED.value
    return status_map


def parse_swesmith_status_last_word(log: str) -> dict[str, str]:
    """python/mypy's SWE-smith parser (``pytest -rA``): a line containing ``PASSED``, else one
    containing ``FAILED``, anywhere, gives that status to the line's last word -- the test id
    of ``PASSED <id>``, but the message's last word of ``FAILED <id> - <message>``."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        for status in (TestStatus.PASSED.value, TestStatus.FAILED.value):
            if status in line:
                status_map[line.split()[-1]] = status
                break
    return status_map


# SWE-smith's profile parsers (swesmith.profiles.python, sandbox_worker/evaluation/
# swesmith_profiles.py): the default reads pytest's verbose lines ("<id> PASSED [ 10%]"),
# HIPS/autograd's the xdist form ("[gw0] PASSED <id>"), paramiko's the -rA summary
# ("PASSED <id>"); python-slugify, tornado and mypy have parsers of their own (above).
SWESMITH_PARSERS: dict[str, LogParser] = {
    "swesmith_pytest": _smith_parser(r"^(\S+)(\s+){status}", 1),
    "swesmith_pytest_xdist": _smith_parser(r"^\[gw\d\]\s{status}\s(\S+)", 1),
    "swesmith_pytest_summary": _smith_parser(r"^{status}\s(\S+)", 1),
    "swesmith_unittest_verbose": parse_swesmith_unittest_verbose,
    "swesmith_unittest_headers": parse_swesmith_unittest_headers,
    "swesmith_status_last_word": parse_swesmith_status_last_word,
}
# Every parser a row may get (SWE-bench's, SWE-Gym's fork's and SWE-smith's profiles').
HARNESS_PARSERS: dict[str, LogParser] = {**PARSERS, **SWEGYM_PARSERS, **SWESMITH_PARSERS}

# The names an EvalConfig may give: "pytest" (swerl's historical name) and the harnesses'.
LOG_PARSERS: dict[str, LogParser] = {"pytest": parse_log_pytest, **HARNESS_PARSERS}


def parser_name_for(repo: str, row_parser: str | None = None) -> str:
    """The parser the harness uses for a row: its own ``log_parser`` field if it has one
    (swebench 5.0.2 rows), else the repository's, else the pytest parser."""
    name = row_parser or REPO_PARSERS.get(repo, DEFAULT_PARSER)
    if name not in HARNESS_PARSERS:
        known = ", ".join(sorted(HARNESS_PARSERS))
        raise ValueError(f"unknown log parser {name!r} for {repo} (known: {known})")
    return name
