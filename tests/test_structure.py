"""The test folders mirror the packages they test (issue 9), so a test is found where its code is.

Rules for ``tests/unit/`` and ``tests/integration/`` (``tests/e2e/`` is free-form; shared test
code lives in ``tests/support/``, data in ``tests/data/``):

1. Every folder mirrors a package or a module of the repository: ``tests/unit/services/queue/``
   tests ``services/queue/``; a folder may also stand for one module, e.g.
   ``tests/integration/sandbox_worker/worker/`` for ``sandbox_worker/worker.py``.
2. A folder holds only ``test_*.py``, ``conftest.py`` and ``__init__.py`` (support code goes to
   ``tests/support/``).
3. In a folder that mirrors a package, ``test_<x>.py`` (or ``test_<x>_<aspect>.py``) tests the
   module or subpackage ``<x>`` of that package (``test_main.py``: its ``__main__.py``). A test
   module that tests a behaviour spanning several modules is listed in :data:`EXCEPTIONS` with
   the reason.

``tests/support/`` holds no ``test_*.py`` (pytest would collect it as tests).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import REPO_ROOT

MIRRORED_TIERS = ("unit", "integration")
ALLOWED_NAMES = ("conftest.py", "__init__.py")

# Test modules (or whole folders: every test module directly in them) whose name names no
# module of the package their folder mirrors, each with the reason. Paths are relative to tests/.
EXCEPTIONS: dict[str, str] = {
    "unit/deploy/test_gpu_check_trainer.py": (
        "deploy/gpu_check_trainer.sh, a shell script (deploy/ holds scripts, not a package)"
    ),
    "unit/deploy/test_swerl_launcher.py": (
        "deploy/dev/swerl.sh, the shell launcher setup.sh installs as .venv/bin/swerl"
    ),
    "unit/trainer/backends/megatron/test_moe.py": (
        "the MoE model end to end against the torch backend: its construction (model.py), "
        "expert and router conversion (convert.py) and the backend's steps (backend.py)"
    ),
    "unit/trainer/report/test_report.py": (
        "python -m trainer report end to end: loading (load.py), the summary (summary.py), the "
        "PNG (dashboard.py) and the command line (cli.py) on one hand-written metrics file"
    ),
    "integration/adapter": (
        "behaviours of the running gateway through its HTTP API (auth, bad and hostile input, "
        "capacity, recording, refresh, publishing, store outages); each spans app, service, "
        "routing and recorder"
    ),
    "unit/adapter/test_gate_and_routing.py": (
        "the pure asyncio logic of the refresh gate (weights.py) and engine selection "
        "(routing.py), without engines"
    ),
    "unit/adapter/test_prompt_bounds.py": (
        "one path from a request to token ids: bounds in rendering.py, canonical messages "
        "(messages.py), worker processes (tokenize_worker.py)"
    ),
    "unit/sandbox_worker/testing/test_conformance.py": (
        "every test double in sandbox_worker/testing (and the tests' own fakes) checked against "
        "the protocol it stands for"
    ),
    "unit/sandbox_worker/evaluation/test_mini_set_local.py": (
        "sandbox_worker/validate.py on the LocalDir double, which needs this folder's "
        "evaluation fixtures"
    ),
    "unit/sandbox_worker/evaluation/test_swebench_parity.py": (
        "grading.py and log_parser.py against swebench's own functions on the same inputs"
    ),
    "unit/services/reference_engine/test_sglang_parity.py": (
        "the reference engine's messages, architectures and abort answers (weight_session.py, "
        "outputs.py, routes/) against the installed SGLang 0.5.23's source"
    ),
    "integration/services/reference_engine/test_sglang_semantics.py": (
        "SGLang 0.5.23's weight-update, flush and abort semantics through the running reference "
        "engine's HTTP API (routes/, engine.py, distributed_weights.py, weight_session.py)"
    ),
    "unit/services/test_service_configs.py": (
        "the manager's and the worker's configs and command lines through services/config.py"
    ),
    "unit/trainer/algorithms/test_bench_script.py": (
        "the smoke test of bench/bench_algorithms.py (benchmarks are no package)"
    ),
    "unit/services/api/test_bench_api.py": (
        "the smoke test of bench/bench_api.py (benchmarks are no package)"
    ),
    "integration/trainer/test_bench_async.py": (
        "the smoke test of bench/bench_async.py (benchmarks are no package)"
    ),
    "unit/trainer/loop/test_bench_toy_steps.py": (
        "the figures and argument checks of bench/bench_toy_steps.py (benchmarks are no package)"
    ),
    "unit/trainer/loop/test_bench_demo_reliability.py": (
        "the figures and argument checks of bench/bench_demo_reliability.py (benchmarks are no "
        "package)"
    ),
    "unit/trainer/test_bench_trainer.py": (
        "the smoke test of bench/bench_trainer.py (benchmarks are no package)"
    ),
    "unit/trainer/algorithms/test_proposition1.py": (
        "a Monte-Carlo check of the paper's Proposition 1 through the critic-target pipeline "
        "(gae.py, critic.py)"
    ),
    "unit/trainer/algorithms/test_trajectory_rows.py": (
        "group statistics over trajectories of several rows, through the batch builder "
        "(trainer/data) and the estimators, losses and readiness statistics"
    ),
    "unit/trainer/backends/test_data_parallel.py": (
        "two gloo ranks with FSDP2 (torch_backend.py, parallel.py) against one process"
    ),
    "integration/sandbox_worker/backends/test_contract.py": (
        "the contract every backend (docker.py, bwrap.py) must pass, one suite for all"
    ),
    "integration/sandbox_worker/evaluation/test_disk_quota.py": (
        "evaluate.py grading a patch that fills the backends' disk quota"
    ),
    "integration/sandbox_worker/evaluation/test_validate_backends.py": (
        "sandbox_worker/validate.py through the real backends, on this folder's eval_backends "
        "fixture"
    ),
    "integration/sandbox_worker/openhands/test_agent_fills_its_disk.py": (
        "the OpenHands agent server (server.py, runner.py) in a real sandbox filling its quota"
    ),
    "integration/sandbox_worker/openhands/test_agent_server_sandbox.py": (
        "the OpenHands agent server (server.py) in real docker and bwrap sandboxes"
    ),
}

FIX_FOLDER = (
    "move its tests to the folder that mirrors the package or module they test "
    "(tests/<tier>/<package path>/), or rename the folder after it"
)
FIX_FILE = (
    "move it to tests/support/ (support code) or tests/data/ (data), or rename it test_<x>.py"
)
FIX_NAME = (
    "rename it test_<x>.py or test_<x>_<aspect>.py after the module or subpackage <x> of {pkg} "
    "it tests, move it to the folder mirroring the package of the module it tests, or (a test "
    "spanning several modules) add it to EXCEPTIONS in tests/test_structure.py with the reason"
)


def mirrored_target(repo: Path, rel: Path) -> tuple[str, Path] | None:
    """What a test folder (relative to its tier) mirrors: ("package" | "module", path)."""
    if not rel.parts:
        return "package", repo
    if (repo / rel).is_dir():
        return "package", repo / rel
    if (repo / rel).with_suffix(".py").is_file():
        return "module", (repo / rel).with_suffix(".py")
    return None


def names_a_module(test_file: Path, package: Path) -> bool:
    """``test_<x>.py`` / ``test_<x>_<aspect>.py`` with ``<x>`` a module or subpackage."""
    words = test_file.stem.removeprefix("test_").split("_")
    candidates = ("_".join(words[:n]) for n in range(len(words), 0, -1))
    return any(
        (package / f"{name}.py").is_file()
        or (package / name / "__init__.py").is_file()
        or (name == "main" and (package / "__main__.py").is_file())
        for name in candidates
    )


def tier_folders(root: Path) -> list[Path]:
    """Every folder of a tier (the tier's root included), without caches."""
    dirs = [p for p in root.rglob("*") if p.is_dir() and "__pycache__" not in p.parts]
    return sorted([root, *dirs])


def structure_problems(repo: Path = REPO_ROOT) -> list[str]:
    """Every violation of the rules above, each with what to do about it."""
    tests = repo / "tests"
    problems: list[str] = []
    used: set[str] = set()
    for tier in MIRRORED_TIERS:
        root = tests / tier
        for folder in tier_folders(root):
            where = folder.relative_to(tests)
            rel = folder.relative_to(root)
            target = mirrored_target(repo, rel)
            if target is None:
                problems.append(
                    f"tests/{where}/: mirrors nothing (no package {rel}/ and no module "
                    f"{rel}.py in the repository): {FIX_FOLDER}"
                )
                continue
            kind, path = target
            for file in sorted(p for p in folder.iterdir() if p.is_file()):
                name = f"tests/{file.relative_to(tests)}"
                if file.name in ALLOWED_NAMES:
                    continue
                if not (file.name.startswith("test_") and file.suffix == ".py"):
                    problems.append(f"{name}: only test_*.py, conftest.py, __init__.py: {FIX_FILE}")
                    continue
                if kind == "module" or names_a_module(file, path):
                    continue
                key = str(file.relative_to(tests))
                folder_key = str(where)
                if key in EXCEPTIONS or folder_key in EXCEPTIONS:
                    used.add(key if key in EXCEPTIONS else folder_key)
                    continue
                pkg = f"{path.relative_to(repo)}/" if path != repo else "the repository"
                problems.append(
                    f"{name}: no module or subpackage "
                    f"{file.stem.removeprefix('test_')!r} (nor a prefix of it) in {pkg}: "
                    + FIX_NAME.format(pkg=pkg)
                )
    for key in sorted(set(EXCEPTIONS) - used):
        problems.append(
            f"EXCEPTIONS in tests/test_structure.py lists tests/{key}, which is gone or now "
            "follows the rules: remove the entry"
        )
    support = tests / "support"
    for file in sorted(support.rglob("test_*.py")):
        problems.append(
            f"tests/{file.relative_to(tests)}: a test module in tests/support/ (pytest collects "
            "it): move it to the tests/<tier>/ folder that mirrors what it tests"
        )
    return problems


def test_tests_mirror_the_packages() -> None:
    problems = structure_problems()
    assert not problems, "test layout (see tests/test_structure.py):\n" + "\n".join(problems)


def test_the_check_reports_wrong_folders_files_and_names(tmp_path: Path) -> None:
    """The check itself, on a small repository with one violation of every kind."""
    for module in ("services/queue/dispatch.py", "services/queue/entries.py",
                   "services/queue/__main__.py", "sandbox_worker/worker.py"):  # fmt: skip
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    tests = tmp_path / "tests"
    good = tests / "unit" / "services" / "queue"
    good.mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "test_dispatch.py", "test_entries_decoding.py",
                 "test_main.py"):  # fmt: skip
        (good / name).write_text("")
    module_folder = tests / "integration" / "sandbox_worker" / "worker"  # mirrors worker.py
    module_folder.mkdir(parents=True)
    (module_folder / "test_anything.py").write_text("")
    (tests / "unit" / "execution").mkdir()  # mirrors nothing
    (good / "helpers.py").write_text("")  # support code among the tests
    (good / "test_no_such_module.py").write_text("")
    (tests / "support").mkdir()
    (tests / "support" / "test_helpers.py").write_text("")

    problems = structure_problems(tmp_path)

    def about(path: str) -> list[str]:
        return [p for p in problems if p.startswith(path + ":")]

    assert len(about("tests/unit/execution/")) == 1
    assert "mirrors nothing" in about("tests/unit/execution/")[0]
    assert len(about("tests/unit/services/queue/helpers.py")) == 1
    assert "tests/support/" in about("tests/unit/services/queue/helpers.py")[0]
    (wrong_name,) = about("tests/unit/services/queue/test_no_such_module.py")
    assert "'no_such_module'" in wrong_name and "services/queue/" in wrong_name
    assert "EXCEPTIONS" in wrong_name
    assert len(about("tests/support/test_helpers.py")) == 1
    # Every listed exception is absent from this tree: each is reported as stale.
    stale = [p for p in problems if p.startswith("EXCEPTIONS")]
    assert len(stale) == len(EXCEPTIONS)
    assert len(problems) == 4 + len(EXCEPTIONS)  # nothing else: the good files pass
