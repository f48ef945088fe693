"""The policy really learns: GRPO, LiSAO, Li2SAO, PACT and SR-PPO train the toy task through the
whole stack.

Each test runs the user-facing command ``python -m services.toy_train --config
trainer/configs/toy_<algorithm>.yaml --run-dir DIR --steps 40``: Redis, a reference engine
sampling the warm-started toy model, the adapter in training mode, a toy-only sandbox worker,
the manager's dispatch loop and the trainer, with a weight refresh after every step
(docs/training.md "Toy task runs"). It then reads the run's ``metrics.jsonl`` and
``batches.jsonl``.

The bars (measured first, docs/training.md "Toy task runs"): the mean reward of the first 5
steps at most 0.35 (chance 0.25 + 0.1), of the last 5 steps at least 0.7. Measured through
the real stack (first 5 -> last 5 steps): GRPO 0.25 -> 0.92 (40 steps), Li2SAO 0.24 ->
0.83-0.86 (50 steps, actor lr cosine-decayed 5e-4 -> 5e-5) and LiSAO 0.20 -> 0.89-0.90 (50
steps, actor lr 5e-4: the critic-based advantages collapsed a run at 1e-3), PACT 0.19 -> 0.86
and SR-PPO 0.16 -> 0.81 (50 steps after 10 critic-only ones).
Li2SAO runs ``make demo``'s own path and configuration: ``python -m services.toy_train_job
--config trainer/configs/toy_li2sao.yaml`` (the job API, a trainer service, ``swerl submit
train``) with the demo's run seed 0, and its held-out evaluation every 10 steps (122 prompts
of the training range that it never trains on, plus 64 four-digit ones scored apart,
``eval.jsonl``) must move with the training reward.
Each run is a fresh stack (the engine's weights and the adapter's version counter belong to
one run: a second run on the same engine would start from the first one's trained policy).

Budget per test (written here, checked by the timeouts): 20 minutes on a loaded 2-core machine;
about 2.5-3.5 minutes when quiet (40-50 steps of 2-4 s plus 20-30 s to start the stack); the
GRPO test took 310 s with a second toy run beside it.
"""

from __future__ import annotations

import itertools
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.protocol.toy import toy_prompt_ids
from tests.support.paths import REPO_ROOT
from tests.support.training_runs import run_composer, run_files
from trainer.loop.metrics import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = {"grpo": 40, "lisao": 50, "li2sao": 50, "pact": 50, "srppo": 50}  # train.steps
CRITIC_WARMUP = {"grpo": 0, "lisao": 10, "li2sao": 0, "pact": 10, "srppo": 10}  # critic-only
BUDGET_S = 1200
LOW_START = 0.35  # chance 0.25 + 0.1
LEARNED = 0.7
MAX_POLICY_LAG = 4  # trainer.batch.max_policy_lag (default)
EVAL_LEARNED = 0.6  # the last held-out evaluation (122 prompts, one sample each: s.e. <= 0.045)
HELD_OUT = len(toy_prompt_ids(0, 1000, "held_out"))  # toy_li2sao.yaml's eval.toy_prompts
SHIFTED = 64  # its eval.shifted: request numbers 1000-1063


def _run(algorithm: str, run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    config = REPO_ROOT / "trainer" / "configs" / f"toy_{algorithm}.yaml"
    args = ["--config", str(config), "--run-dir", str(run_dir), "--steps", str(STEPS[algorithm])]
    run_composer("services.toy_train", args, run_dir.parent / "toy_train.out", BUDGET_S)
    return run_files(run_dir)


def _check_learned(metrics: list[dict[str, Any]], steps: int) -> None:
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # no lost or repeated step
    rewards = [m["reward/mean"] for m in metrics]
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    assert first <= LOW_START, f"the start is not low: {rewards}"
    assert last >= LEARNED, f"did not learn: first 5 {first:.3f}, last 5 {last:.3f}: {rewards}"


def _check_refresh_and_versions(
    metrics: list[dict[str, Any]], batches: list[dict[str, Any]], warmup: int
) -> None:
    # One published version per actor step (critic-only steps keep the version); nothing
    # aborted by the refreshes (a request that failed because of a refresh would be an aborted
    # trajectory), no trajectory over the lag limit.
    assert [m["version"] for m in metrics] == [max(0, m["step"] - warmup) for m in metrics]
    assert all(m["data/aborted"] == 0 for m in metrics), [m["data/aborted"] for m in metrics]
    assert all(0 <= m["lag/max"] <= MAX_POLICY_LAG for m in metrics)
    # the batches were sampled by the versions the trainer published: from step 3 on every
    # batch was sampled after at least one refresh (lag counts steps since those versions)
    assert all(b["trainer_version"] == max(0, b["step"] - 1 - warmup) for b in batches)
    assert any(m["lag/mean"] > 0 for m in metrics[2:]), "no batch came from a published version"
    task_ids = [t for b in batches for t in b["task_ids"]]
    assert len(task_ids) == len(set(task_ids)), "a trajectory was trained twice"


def test_grpo_learns_the_toy_task(tmp_path: Path) -> None:
    metrics, batches = _run("grpo", tmp_path / "run")
    _check_learned(metrics, STEPS["grpo"])
    _check_refresh_and_versions(metrics, batches, CRITIC_WARMUP["grpo"])
    assert all(b["group_size"] == 8 and set(b["group_sizes"]) == {8} for b in batches)


@pytest.mark.learning  # Li2SAO's run covers this single-rollout phase after its switch
def test_lisao_learns_the_toy_task(tmp_path: Path) -> None:
    metrics, batches = _run("lisao", tmp_path / "run")
    _check_learned(metrics, STEPS["lisao"])
    _check_refresh_and_versions(metrics, batches, CRITIC_WARMUP["lisao"])
    # single rollouts from the start: no group barrier, every batch of group size 1
    assert all(b["group_size"] == 1 and set(b["group_sizes"]) == {1} for b in batches)


# The metrics each sibling method adds (PACT_SRPPO_SPEC; issue 15): PACT's mean |credit| and
# critic IS acceptance, SR-PPO's Pass@k weights and their share on hard prompts.
SIBLING_METRICS = {
    "pact": ("critic/mean_abs_credit", "critic/is_reject_frac", "actor/tis_mean", "critic/bce"),
    "srppo": ("actor/passk_weight_mean", "actor/passk_share_hard", "critic/bce", "critic/mse"),
}


@pytest.mark.learning  # make test-learning (Makefile): minutes each on 2 cores
@pytest.mark.parametrize("algorithm", ["pact", "srppo"])
def test_pact_and_srppo_learn_the_toy_task(algorithm: str, tmp_path: Path) -> None:
    metrics, batches = _run(algorithm, tmp_path / "run")
    _check_learned(metrics, STEPS[algorithm])
    _check_refresh_and_versions(metrics, batches, CRITIC_WARMUP[algorithm])
    assert all(b["group_size"] == 1 and set(b["group_sizes"]) == {1} for b in batches)
    actor_steps = metrics[CRITIC_WARMUP[algorithm] :]
    for key in SIBLING_METRICS[algorithm]:
        assert all(isinstance(m.get(key), float) for m in actor_steps), (key, actor_steps[0])


def test_the_demo_li2sao_run_learns_generalises_and_switches_inside_its_window(
    tmp_path: Path,
) -> None:
    config = REPO_ROOT / "trainer" / "configs" / "toy_li2sao.yaml"
    args = ["--config", str(config), "--run-dir", str(tmp_path / "run"), "--seed", "0"]
    run_composer("services.toy_train_job", args, tmp_path / "toy_train_job.out", BUDGET_S)
    metrics, batches = run_files(tmp_path / "run")
    _check_learned(metrics, STEPS["li2sao"])
    _check_refresh_and_versions(metrics, batches, CRITIC_WARMUP["li2sao"])
    # the config's cosine decay (5e-4 -> 5e-5 over 50 optimizer steps) reached the trainer
    lrs = [m["actor/lr"] for m in metrics]
    assert lrs[0] == pytest.approx(5e-4) and all(a > b for a, b in itertools.pairwise(lrs))
    assert lrs[-1] == pytest.approx(5e-5 + 4.5e-4 * (1 + math.cos(math.pi * 49 / 50)) / 2)
    # trainer/configs/toy_li2sao.yaml: gate {t_min: 5, consecutive: 5, t_max: 30}
    phases = [b["phase"] for b in batches]
    drain = phases.index("draining")  # the step right after the switch
    switch_step = batches[drain]["step"] - 1
    assert 5 + 5 - 1 <= switch_step <= 30, phases
    assert phases[:drain] == ["bootstrap"] * drain
    assert phases[drain + 1 :] == ["single"] * (len(phases) - drain - 1)
    # the batch right after the switch is the prefetched bootstrap batch, at the group size
    assert batches[drain]["group_size"] == 8 and set(batches[drain]["group_sizes"]) == {8}
    previous = int(batches[drain - 1]["batch_ids"][0].rsplit("r", 1)[1])
    assert int(batches[drain]["batch_ids"][0].rsplit("r", 1)[1]) == previous + 1
    # every later batch has group size 1 and no batch mixes group sizes
    for b in batches[drain + 1 :]:
        assert b["group_size"] == 1 and set(b["group_sizes"]) == {1}
        # cancelled leftover bootstrap tasks (sample index > 0 of a group) never reach it
        assert all(t.rsplit(":", 1)[1] == "0" for t in b["task_ids"]), b["task_ids"][:5]
    bootstrap_requests = {b["batch_ids"][0] for b in batches[: drain + 1]}
    for b in batches[drain + 1 :]:
        assert not bootstrap_requests & set(b["batch_ids"])
    # the metrics carry the phase and the switch (logged and checkpointed state)
    assert [m["phase"] for m in metrics] == phases
    # the held-out evaluation every 10 steps, on the version each of those steps published
    evals = read_jsonl(tmp_path / "run" / "train" / "eval.jsonl")
    versions = {m["step"]: m["version"] for m in metrics}
    assert [e["step"] for e in evals] == [10, 20, 30, 40, 50], evals
    assert all(e["eval/version"] == versions[e["step"]] for e in evals)
    assert all(e["eval/trajectories"] + e["eval/aborted"] == HELD_OUT for e in evals)
    assert all(e["eval/shifted/trajectories"] + e["eval/shifted/aborted"] == SHIFTED
               for e in evals)  # fmt: skip
    assert evals[-1]["eval/reward_mean"] >= EVAL_LEARNED, evals
    assert evals[-1]["eval/reward_mean"] > evals[0]["eval/reward_mean"], evals  # it moved
    # the dashboard of the run names the switch step
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "report", str(tmp_path / "run")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "run" / "report.png").is_file() or list(tmp_path.rglob("report.png"))
