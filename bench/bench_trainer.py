"""Benchmark of the trainer engine (issue 10): steps, overhead, memory, checkpoints, padding.

Usage (from the repository root)::

    .venv/bin/python bench/bench_trainer.py                 # full run (minutes on 2 cores)
    .venv/bin/python bench/bench_trainer.py --quick         # smoke run, small batches
    .venv/bin/python bench/bench_trainer.py --json out.json # also every figure as JSON
    .venv/bin/python bench/bench_trainer.py --device cuda   # on a GPU (--precision bf16 too)

Two models of the Qwen3 family, random weights, built offline by the tiny-model builder
(:mod:`services.tiny_model.build`) and cached under ``$SWERL_CACHE_DIR``: ``tiny`` (the test
model: 2 layers, hidden 64) and ``qwen3-20m`` (the same builder scaled: 6 layers, hidden 512,
8 query / 4 key-value heads of 64, MLP 1536, tied embeddings: ~20M parameters). Every phase runs
in one invocation so the ratios compare like with like:

* **step**: ``train_step`` (Li2SAO bootstrap objective, spec defaults: ``K = 2`` critic passes)
  on a batch built by :func:`trainer.data.build_batch` from synthetic trajectory records (the
  real protocol types; groups of 8, multi-turn, behaviour logprobs near the random model's).
  Interleaved rounds, each timing, per model: batch building (records -> ``TrainBatch``), one
  objective evaluation outside the model (``objective_batch`` + ``compute_objective`` + the
  gradients w.r.t. logprobs and values, as the step does it), and the step of every backend.
  Reported: tokens/s (real prompt + post-prompt tokens of the batch / step time) per backend,
  side by side; a backend that does not exist yet is reported as ``not built`` (no figure);
  and the share ``(build + objective evaluations per step x objective) / step`` (target
  <= 5 %), where a step evaluates the objective ``1 + (K - 1)`` times (the critic passes after
  the first recompute it; counting full evaluations there overstates the share slightly).
* **memory**: peak memory of one ``train_step`` at two (``--quick``) or three batch sizes
  (1, 2, 4 groups), the whole batch in one micro-batch (with a smaller
  ``batch.micro_batch_tokens`` the activations stop growing at the budget). On the CPU a fresh
  subprocess per model measures the extra resident memory at the peak (``/proc/self/clear_refs``
  then ``VmHWM - VmRSS`` before, glibc's mmap threshold pinned low so freed tensors go back to
  the kernel), after a warm-up step at the same size (AdamW states exist); on a GPU torch's CUDA
  peak. Reported: bytes per padded token at each size, the least-squares slope and intercept
  and the largest relative residual of a line through the points, and peak ratio vs token
  ratio (linear memory: the ratios agree, once the fixed intercept is taken off).
* **checkpoint**: ``backend.save(dir)`` / ``backend.load(dir)`` (trainer/checkpoint.py:
  ``torch.save``, fsync, sha256 manifest, rename; the load checks every checksum first) of the
  stepped backend (optimizer states included), MB/s over the manifest's bytes. The load reads
  files the save just wrote (page cache): it measures checksum + deserialisation, not the disk.
  A backend whose ``save`` raises :class:`BackendError` (a setting whose checkpoints are not
  built yet, e.g. megatron under tensor parallel) is reported as ``not built``.
* **padding**: :func:`trainer.data.plan_micro_batches` on a batch built from synthetic
  trajectories shaped like OpenHands runs on the mini task set (no real recorded runs of a
  trained model exist yet): a per-task prompt of ~7k tokens (the OpenHands system prompt and
  tool schemas: the captured request in ``tests/data/openhands_requests`` is ~28k characters),
  4-20 turns of log-normal action (median 150) and observation (median 300) lengths, 10 % of
  the trajectories with a second segment (history condensed). Reported at several token
  budgets: the planner with groups kept whole (as issue 10's clarification asks) without
  sequence packing (one row per lane) and with it (rows packed into lanes of at most
  ``lane_factor`` x the longest row, the trainer's default), and, for comparison, rows planned
  freely by length (groups ignored, no packing). Target <= 10 %.

Timings are wall clock with ``--threads`` torch threads (1 by default: steadier on a shared
machine). Nothing here asserts a time; the script prints the figures and the ratios. On a GPU
(``--device cuda``) the steps synchronise before each clock read and memory is the CUDA peak;
``--precision bf16`` runs the backends in bf16 autocast (figures of one H200: docs/trainer.md
"On a GPU").
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from services.protocol import (  # noqa: E402
    Outcome,
    OutcomeStatus,
    Segment,
    SegmentReason,
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)
from services.protocol.packing import float_array, int_array  # noqa: E402
from services.tiny_model.build import ensure_tiny_model  # noqa: E402
from trainer.algorithms import compute_objective  # noqa: E402
from trainer.backends import BackendError, StepObjective, TrainerBackend, create_backend  # noqa: E402
from trainer.config import BatchConfig, TrainerConfig  # noqa: E402
from trainer.data import TrainBatch, build_batch, plan_micro_batches  # noqa: E402

GROUP_SIZE = 8
BACKENDS = ("torch", "megatron", "megatron-local")
# the megatron backend with megatron-core's local (unfused, dense-mask) core attention in place
# of the default (PyTorch's fused SDPA per packed row without TransformerEngine): issue 34's
# before / after, side by side
LOCAL_ATTENTION_ARM = "megatron-local"
MODELS: dict[str, dict[str, int]] = {
    "tiny": {},
    # the tiny model's builder scaled up: 6 x (0.79M attention + 2.36M MLP) + 1.05M embeddings
    "qwen3-20m": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}
STEP_OBJECTIVE = StepObjective(algorithm="li2sao", phase="bootstrap")
SHARE_TARGET = 0.05
PADDING_TARGET = 0.10
PADDING_BUDGETS = (16_384, 65_536, 262_144)


@dataclass(frozen=True)
class Lengths:
    """Token lengths of synthetic agent trajectories (log-normal draws around the medians)."""

    prompt: int  # per task (group), +-20 % between tasks
    turns: tuple[int, int]  # uniform, inclusive
    action: int  # median generated tokens per turn
    observation: int  # median observation tokens per turn
    cap: int  # longest action or observation
    second_segment: float = 0.0  # share of trajectories whose history is condensed once
    sigma: float = 0.7


# Small rows so a CPU step takes seconds; the shape (multi-turn, groups of 8) is the real one.
STEP_LENGTHS = Lengths(prompt=64, turns=(2, 4), action=24, observation=32, cap=96)
QUICK_LENGTHS = Lengths(prompt=32, turns=(1, 2), action=12, observation=16, cap=48)
MINI_TASK_LENGTHS = Lengths(
    prompt=7000, turns=(4, 20), action=150, observation=300, cap=4000, second_segment=0.1
)

TurnShape = tuple[int, int]  # (observation tokens, generated tokens)


@dataclass(frozen=True)
class TrajectoryShape:
    group: int
    segments: tuple[tuple[int, tuple[TurnShape, ...]], ...]  # (prompt tokens, turns)


def sample_shapes(lengths: Lengths, groups: int, seed: int) -> list[TrajectoryShape]:
    """``groups`` x :data:`GROUP_SIZE` trajectory shapes drawn from ``lengths``."""
    gen = torch.Generator().manual_seed(seed)

    def lognormal(median: int, size: int) -> list[int]:
        draws = torch.randn(size, generator=gen) * lengths.sigma
        return [min(lengths.cap, max(1, round(median * math.exp(float(d))))) for d in draws]

    shapes = []
    for g in range(groups):
        prompt = round(lengths.prompt * (0.8 + 0.4 * float(torch.rand(1, generator=gen))))
        for _ in range(GROUP_SIZE):
            low, high = lengths.turns
            n = int(torch.randint(low, high + 1, (1,), generator=gen))
            turns = tuple(
                zip(lognormal(lengths.observation, n), lognormal(lengths.action, n), strict=True)
            )
            turns = ((0, turns[0][1]), *turns[1:])  # the first turn answers the prompt
            segments: tuple[tuple[int, tuple[TurnShape, ...]], ...] = ((prompt, turns),)
            if n >= 2 and float(torch.rand(1, generator=gen)) < lengths.second_segment:
                cut = n // 2  # the history is condensed into a ~10 % longer prompt
                summary = prompt + prompt // 10
                segments = (
                    (prompt, turns[:cut]),
                    (summary, ((0, turns[cut][1]), *turns[cut + 1 :])),
                )
            shapes.append(TrajectoryShape(group=g, segments=segments))
    return shapes


def make_records(
    shapes: Sequence[TrajectoryShape], vocab: int, seed: int
) -> list[TrajectoryRecord]:
    """Finished records of the given shapes: random token ids, behaviour logprobs near a random
    model's (``-log(vocab)``), weight version 0, Bernoulli(0.5) rewards."""
    gen = torch.Generator().manual_seed(seed)
    base = -math.log(vocab)

    def ids(n: int) -> Any:
        return int_array(torch.randint(0, vocab, (n,), generator=gen).tolist())

    records = []
    for i, shape in enumerate(shapes):
        meta = TrajectoryMeta(trajectory_id=f"t{i}", group_id=f"g{shape.group}")
        record = TrajectoryRecord(meta=meta)
        for s, (prompt, turns) in enumerate(shape.segments):
            made = []
            for obs, out in turns:
                logps = (base + 0.05 * torch.randn(out, generator=gen)).clamp(max=0.0).tolist()
                made.append(
                    Turn(
                        observation_ids=ids(obs),
                        output_ids=ids(out),
                        output_logprobs=float_array(logps),
                        weight_version=0,
                    )
                )
            reason = SegmentReason.INITIAL if s == 0 else SegmentReason.HISTORY_MISMATCH
            record.segments.append(Segment(prompt_ids=ids(prompt), turns=made, reason=reason))
        reward = float(torch.rand(1, generator=gen) < 0.5)
        record.outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=reward)
        records.append(record)
    return records


# ---------------------------------------------------------------------------------- helpers


def model_dir(name: str) -> Path:
    """The model ``name`` of :data:`MODELS`, built once under ``$SWERL_CACHE_DIR``."""
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    folder = "tiny-model" if name == "tiny" else f"bench-{name}"
    return ensure_tiny_model(cache / folder, sizes=MODELS[name] or None)


def trainer_config(
    backend: str, model: Path, device: str, micro_batch_tokens: int, precision: str = "fp32"
) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "backend": backend,
            "model": str(model),
            "device": device,
            "precision": precision,
            "batch": {"micro_batch_tokens": micro_batch_tokens},
        }
    )


def open_backend(
    name: str, model: Path, device: str, micro_batch_tokens: int, precision: str = "fp32"
) -> TrainerBackend | str:
    """The backend, or why it cannot run here: never a stand-in. A name the trainer config does
    not accept is ``not built``; a backend that exists but fails to start says so."""
    backend = "megatron" if name == LOCAL_ATTENTION_ARM else name
    try:
        config = trainer_config(backend, model, device, micro_batch_tokens, precision)
    except ValidationError as exc:
        return f"not built: trainer.backend={name!r} is refused ({exc.errors()[0]['msg']})"
    if name == "torch":
        return create_backend(config)  # the reference column: its failure stops the bench
    try:
        if name == LOCAL_ATTENTION_ARM:
            from trainer.backends.megatron.backend import MegatronBackend

            class LocalAttentionMegatron(MegatronBackend):
                attention = "local"

            return LocalAttentionMegatron(config)
        return create_backend(config)
    except (BackendError, ImportError, RuntimeError) as exc:
        return f"cannot run here: {str(exc).strip()[:300]}"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def stats(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values)}


def objective_once(
    backend: Any, batch: TrainBatch, logp: torch.Tensor, values: torch.Tensor | None
) -> None:
    """What the step computes outside the model: the whole-batch objective and its gradients
    w.r.t. the per-token logprobs and values (``TorchBackend.train_step`` step 2)."""
    leaf = logp.clone().requires_grad_(True)
    value_leaf = None if values is None else values.clone().requires_grad_(True)
    ob = batch.objective_batch(leaf, value_leaf, values, trainer_version=backend.version)
    result = compute_objective(
        STEP_OBJECTIVE.algorithm, ob, phase=STEP_OBJECTIVE.phase, config=STEP_OBJECTIVE.config
    )
    torch.autograd.grad(result.actor_loss, leaf, allow_unused=True)
    if result.critic_loss is not None and value_leaf is not None:
        torch.autograd.grad(result.critic_loss, value_leaf, allow_unused=True)


def batch_figures(batch: TrainBatch) -> dict[str, int]:
    return {
        "rows": batch.num_rows,
        "trajectories": batch.num_trajectories,
        "tokens": int(batch.seq_lengths.sum()),
        "action_tokens": int(batch.action_mask.sum()),
        "padded_tokens": int(batch.input_ids.numel()),
    }


def count_parameters(backend: Any) -> dict[str, int]:
    actor = getattr(backend, "actor", None)
    critic = getattr(backend, "critic", None)
    out = {}
    if actor is not None:
        out["actor"] = sum(p.numel() for p in actor.parameters())
    if critic is not None:
        out["critic_trainable"] = sum(p.numel() for p in critic.parameters() if p.requires_grad)
    return out


# ---------------------------------------------------------------------------------- phases


@dataclass
class ModelRun:
    """One model's step-phase state: its records, batch and backends (or why not built)."""

    name: str
    directory: Path
    records: list[TrajectoryRecord]
    backends: dict[str, TrainerBackend | str]
    batch: TrainBatch | None = None


def step_phase(runs: list[ModelRun], reps: int, device: str) -> dict[str, Any]:
    """Interleaved rounds: per model, batch building, one objective, the step of each backend."""
    for run in runs:
        torch_backend = run.backends["torch"]
        assert not isinstance(torch_backend, str), torch_backend
        run.batch = build(run, torch_backend)
        for backend in run.backends.values():
            if not isinstance(backend, str):
                backend.version = 0
                backend.train_step(run.batch, STEP_OBJECTIVE)  # warm-up: AdamW states, caches
    times: dict[str, dict[str, list[float]]] = {run.name: {} for run in runs}
    for _ in range(reps):
        for run in runs:
            time_round(run, times[run.name], device)
    summary: dict[str, Any] = {
        "reps": reps,
        "objective": STEP_OBJECTIVE.algorithm,
        "phase": STEP_OBJECTIVE.phase,
    }
    for run in runs:
        own = times[run.name]
        assert run.batch is not None
        shape = batch_figures(run.batch)
        torch_backend = run.backends["torch"]
        passes = getattr(getattr(torch_backend, "config", None), "critic", None)
        k = passes.updates_per_step if passes is not None else 1
        calls = 1 + max(0, k - 1)
        entry: dict[str, Any] = {
            **shape,
            "parameters": count_parameters(torch_backend),
            "build_s": stats(own["build"]),
            "objective_s": stats(own["objective"]),
            "objective_calls_per_step": calls,
            "backends": {},
        }
        for name, backend in run.backends.items():
            if isinstance(backend, str):
                entry["backends"][name] = {"status": backend}
                continue
            step = stats(own[name])
            entry["backends"][name] = {
                "status": "ok",
                "step_s": step,
                # from the fastest and the median step
                "tokens_per_s": {
                    "best": shape["tokens"] / step["min"],
                    "median": shape["tokens"] / step["median"],
                },
            }
        torch_step = entry["backends"]["torch"]["step_s"]
        entry["overhead_share"] = {
            stat: (entry["build_s"][stat] + calls * entry["objective_s"][stat]) / torch_step[stat]
            for stat in ("min", "median")
        }
        summary[run.name] = entry
    return summary


def time_round(run: ModelRun, own: dict[str, list[float]], device: str) -> None:
    """One round of one model: batch building, one objective, one step per backend."""
    torch_backend: Any = run.backends["torch"]
    batch = run.batch
    assert batch is not None
    own.setdefault("build", []).append(timed(lambda: build(run, torch_backend), "cpu"))
    fwd = torch_backend.logprobs_and_values(batch)
    on_device = batch.to(device)
    own.setdefault("objective", []).append(
        timed(lambda: objective_once(torch_backend, on_device, fwd.logprobs, fwd.values), device)
    )
    for name, backend in run.backends.items():
        if isinstance(backend, str):
            continue
        backend.version = 0  # every round the same step: the batch's tokens are fresh
        own.setdefault(name, []).append(
            timed(lambda b=backend: b.train_step(batch, STEP_OBJECTIVE), device)
        )


def build(run: ModelRun, backend: Any) -> TrainBatch:
    batch, _ = build_batch(
        run.records,
        trainer_version=0,
        config=backend.config.batch,
        pad_id=backend.pad_id,
        vocab_size=backend.vocab_size,
    )
    return batch


def print_step(summary: dict[str, Any], models: Sequence[str]) -> None:
    print(
        f"\ntrain step ({summary['objective']} {summary['phase']}, K=2 critic passes): tokens/s "
        f"best / median, seconds min / median, of {summary['reps']} interleaved rounds"
    )
    head = f"{'model':<11}{'rows':>5}{'tokens':>8}"
    head += "".join(f"{b + ' tok/s':>22}" for b in BACKENDS)
    head += f"{'build s':>17}{'objective s':>17}{'share':>15}"
    print(head)
    for name in models:
        e = summary[name]
        line = f"{name:<11}{e['rows']:>5}{e['tokens']:>8}"
        for b in BACKENDS:
            cell = e["backends"][b]
            if cell["status"] == "ok":
                tps = cell["tokens_per_s"]
                line += f"{tps['best']:>13.0f} /{tps['median']:>7.0f}"
            else:
                line += f"{'not built':>22}"
        line += f"{e['build_s']['min']:>9.4f} /{e['build_s']['median']:>6.4f}"
        line += f"{e['objective_s']['min']:>9.4f} /{e['objective_s']['median']:>6.4f}"
        share = e["overhead_share"]
        line += f"{100 * share['min']:>7.2f}% /{100 * share['median']:>5.2f}%"
        print(line)
    print(
        f"share = (build + {summary[models[0]]['objective_calls_per_step']} x objective) / torch "
        f"step; target <= {100 * SHARE_TARGET:.0f}%"
    )
    first, last = models[0], models[-1]
    for b in BACKENDS:
        cells = {m: summary[m]["backends"][b] for m in models}
        if any(c["status"] != "ok" for c in cells.values()):
            print(f"{b}: {cells[first]['status']}")
        elif len(models) > 1:
            speed = [
                cells[last]["tokens_per_s"][s] / cells[first]["tokens_per_s"][s]
                for s in ("best", "median")
            ]
            print(f"{b}: tokens/s {last} / {first} = {speed[0]:.3f} (best) {speed[1]:.3f} (median)")
    for m in models:
        cells = summary[m]["backends"]
        for b in BACKENDS[1:]:
            if cells["torch"]["status"] == "ok" and cells[b]["status"] == "ok":
                ratio = cells[b]["step_s"]["min"] / cells["torch"]["step_s"]["min"]
                median = cells[b]["step_s"]["median"] / cells["torch"]["step_s"]["median"]
                print(f"{m}: {b} / torch step time {ratio:.2f}x (min) {median:.2f}x (median)")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


ONE_MICRO_BATCH = 1 << 30


def peak_of_step(backend: Any, batch: TrainBatch, device: str) -> int:
    """Extra memory at the peak of one train step (after a warm-up step at the same size)."""
    backend.version = 0
    backend.train_step(batch, STEP_OBJECTIVE)
    backend.version = 0
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        backend.train_step(batch, STEP_OBJECTIVE)
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - before)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    before = _status_kib("VmRSS")
    backend.train_step(batch, STEP_OBJECTIVE)
    return (_status_kib("VmHWM") - before) * 1024


def memory_points(
    model: Path,
    groups: Sequence[int],
    lengths: Lengths,
    device: str,
    seed: int,
    precision: str = "fp32",
) -> list[dict[str, int]]:
    """Peak extra memory of a step at each size (ascending), one micro-batch per step."""
    config = trainer_config("torch", model, device, ONE_MICRO_BATCH, precision)
    backend: Any = create_backend(config)
    points = []
    for g in sorted(groups):
        records = make_records(sample_shapes(lengths, g, seed), backend.vocab_size, seed)
        batch, _ = build_batch(
            records, trainer_version=0, pad_id=backend.pad_id, vocab_size=backend.vocab_size
        )
        peak = peak_of_step(backend, batch, device)
        points.append({**batch_figures(batch), "groups": g, "peak_bytes": peak})
        del batch, records
        gc.collect()
    return points


def fit_line(points: list[dict[str, int]]) -> dict[str, Any]:
    """Least-squares ``peak = intercept + slope * padded_tokens`` and how well it fits."""
    xs = [float(p["padded_tokens"]) for p in points]
    ys = [float(p["peak_bytes"]) for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    residual = max(
        abs(y - (intercept + slope * x)) / max(abs(y), 1.0) for x, y in zip(xs, ys, strict=True)
    )
    return {
        "points": points,
        "bytes_per_padded_token": [y / x for x, y in zip(xs, ys, strict=True)],
        "slope_bytes_per_token": slope,
        "intercept_bytes": intercept,
        "max_relative_residual": residual,
        "token_ratio": [x / xs[0] for x in xs],
        "peak_ratio": [y / ys[0] for y in ys],
    }


def memory_phase(
    models: dict[str, Path], groups: Sequence[int], lengths: Lengths, args: argparse.Namespace
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "measure": "cuda" if args.device.startswith("cuda") else "rss",
        "micro_batches": 1,
    }
    for name, directory in models.items():
        if args.device.startswith("cuda"):
            points = memory_points(
                directory, groups, lengths, args.device, args.seed, args.precision
            )
        else:
            env = {
                **os.environ,
                "MALLOC_MMAP_THRESHOLD_": "131072",
                "OMP_NUM_THREADS": str(args.threads),
            }
            cmd = [sys.executable, __file__, "--child-memory", str(directory)]
            cmd += ["--groups", ",".join(map(str, groups)), "--seed", str(args.seed)]
            cmd += ["--threads", str(args.threads)] + (["--quick"] if args.quick else [])
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"memory child for {name} failed:\n{done.stderr[-3000:]}")
            points = json.loads(done.stdout.strip().splitlines()[-1])
        out[name] = fit_line(points)
    return out


def print_memory(memory: dict[str, Any], models: Sequence[str]) -> None:
    what = "CUDA peak" if memory["measure"] == "cuda" else "peak extra RSS"
    print(f"\n{what} of one train step, whole batch in one micro-batch, by batch size")
    for name in models:
        m = memory[name]
        cells = ", ".join(
            f"{p['padded_tokens']} tok: {p['peak_bytes'] / 2**20:.1f} MiB ({b / 1024:.1f} KiB/tok)"
            for p, b in zip(m["points"], m["bytes_per_padded_token"], strict=True)
        )
        print(f"{name:<11}{cells}")
        ratios = " ".join(
            f"{t:.2f}->{p:.2f}" for t, p in zip(m["token_ratio"], m["peak_ratio"], strict=True)
        )
        print(
            f"{'':<11}slope {m['slope_bytes_per_token'] / 1024:.1f} KiB/token, intercept "
            f"{m['intercept_bytes'] / 2**20:.1f} MiB, max residual "
            f"{100 * m['max_relative_residual']:.1f}%; token ratio -> peak ratio: {ratios}"
        )
    print("linear memory: a line fits (small residual); the slope is the per-token cost")


def checkpoint_phase(runs: list[ModelRun], reps: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"reps": reps}
    for run in runs:
        per_backend: dict[str, Any] = {}
        for name, backend in run.backends.items():
            if isinstance(backend, str):
                per_backend[name] = {"status": backend}
                continue
            saves, loads, megabytes = [], [], 0.0
            for i in range(reps):
                target = workdir / f"ckpt-{run.name}-{name}-{i}"
                try:
                    saves.append(timed(lambda b=backend, t=target: b.save(t), "cpu"))
                except BackendError as exc:  # raised before anything is written
                    per_backend[name] = {"status": f"not built: {exc}"}
                    break
                manifest = json.loads((target / "manifest.json").read_text())
                megabytes = sum(f["bytes"] for f in manifest["files"].values()) / 2**20
                loads.append(timed(lambda b=backend, t=target: b.load(t), "cpu"))
                shutil.rmtree(target)
            if name in per_backend:
                continue
            save, load = stats(saves), stats(loads)
            per_backend[name] = {
                "status": "ok",
                "megabytes": megabytes,
                "save_s": save,
                "load_s": load,
                "save_mb_per_s": {k: megabytes / v for k, v in save.items()},
                "load_mb_per_s": {k: megabytes / v for k, v in load.items()},
            }
        out[run.name] = per_backend
    return out


def print_checkpoint(ckpt: dict[str, Any], models: Sequence[str]) -> None:
    print(
        f"\ncheckpoint save / load (fsync + sha256 manifest; load verifies), "
        f"min / median of {ckpt['reps']}"
    )
    print(
        f"{'model':<11}{'backend':<10}{'MB':>8}{'save MB/s':>18}{'load MB/s':>18}{'load/save':>11}"
    )
    for name in models:
        for b in BACKENDS:
            e = ckpt[name][b]
            if e["status"] != "ok":
                print(f"{name:<11}{b:<10}{'not built':>8}")
                continue
            s, ld = e["save_mb_per_s"], e["load_mb_per_s"]
            print(
                f"{name:<11}{b:<10}{e['megabytes']:>8.1f}{s['min']:>10.1f} /{s['median']:>6.1f}"
                f"{ld['min']:>10.1f} /{ld['median']:>6.1f}"
                f"{e['save_s']['median'] / e['load_s']['median']:>10.2f}x"
            )


def padding_phase(groups: int, seed: int) -> dict[str, Any]:
    shapes = sample_shapes(MINI_TASK_LENGTHS, groups, seed)
    records = make_records(shapes, vocab=2048, seed=seed)
    start = time.perf_counter()
    batch, report = build_batch(records, trainer_version=0, vocab_size=2048)
    build_s = time.perf_counter() - start
    free = replace(batch, group_ids=torch.arange(batch.num_rows))  # every row its own group
    lane_factor = BatchConfig().lane_factor
    plans = []
    for budget in PADDING_BUDGETS:
        whole, loose = plan_micro_batches(batch, budget), plan_micro_batches(free, budget)
        packed = plan_micro_batches(batch, budget, lane_factor=lane_factor)
        plans.append(
            {
                "budget": budget,
                "groups_whole": whole.padding_fraction,
                "groups_whole_micro_batches": len(whole.micro_batches),
                "groups_whole_packed": packed.padding_fraction,
                "groups_whole_packed_micro_batches": len(packed.micro_batches),
                "groups_whole_packed_lanes": sum(len(lanes) for lanes in packed.lanes),
                "rows_free": loose.padding_fraction,
                "rows_free_micro_batches": len(loose.micro_batches),
            }
        )
    lengths = batch.seq_lengths.float()
    return {
        "lengths": asdict(MINI_TASK_LENGTHS),
        **batch_figures(batch),
        "row_tokens": {
            "min": int(lengths.min()),
            "median": float(lengths.median()),
            "max": int(lengths.max()),
        },
        "build_s": build_s,
        "dropped_overlong_rows": report.overlong_rows,
        "plans": plans,
        "lane_factor": lane_factor,
        "target": PADDING_TARGET,
    }


def print_padding(pad: dict[str, Any]) -> None:
    rt = pad["row_tokens"]
    print(
        f"\nmicro-batch padding waste, {pad['trajectories']} synthetic mini-task trajectories "
        f"({pad['rows']} rows, {rt['min']}-{rt['max']} tokens, median {rt['median']:.0f}; "
        f"built in {pad['build_s']:.2f} s)"
    )
    print(
        f"{'token budget':>13}{'groups whole, rows':>24}{'groups whole, packed':>30}"
        f"{'rows free (comparison)':>26}"
    )
    for p in pad["plans"]:
        whole = f"{100 * p['groups_whole']:.1f}% ({p['groups_whole_micro_batches']} mb)"
        packed = (
            f"{100 * p['groups_whole_packed']:.1f}% ({p['groups_whole_packed_micro_batches']} mb,"
            f" {p['groups_whole_packed_lanes']} lanes)"
        )
        free = f"{100 * p['rows_free']:.1f}% ({p['rows_free_micro_batches']} mb)"
        print(f"{p['budget']:>13}{whole:>24}{packed:>30}{free:>26}")
    print(
        f"target <= {100 * PADDING_TARGET:.0f}%; 'rows' pads every member to the group's longest "
        f"row; 'packed' packs rows into lanes of <= {pad['lane_factor']:g}x the longest row"
    )


def write_summary(path: Path | None, summary: dict[str, Any]) -> None:
    """``--json FILE``: the figures printed above, machine-readable (``-``: stdout)."""
    if path is None:
        return
    text = json.dumps(summary, indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, 2 memory sizes")
    parser.add_argument("--reps", type=int, default=None, help="interleaved rounds (3 / 5)")
    parser.add_argument("--groups", default=None, help="memory sizes in groups of 8 (1,2 / 1,2,4)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the sampled batch shapes and tokens (0)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="the trainer's precision (bf16: autocast, fp32 master weights; needs --device cuda)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where checkpoints are written")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write every figure as JSON to FILE ('-': stdout)",
    )
    parser.add_argument("--child-memory", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.precision == "bf16" and not args.device.startswith("cuda"):
        parser.error("--precision bf16 is the GPU path: it needs --device cuda")
    groups = [int(g) for g in (args.groups or ("1,2" if args.quick else "1,2,4")).split(",")]
    if len(groups) < 2 or min(groups) < 1 or len(set(groups)) != len(groups):
        parser.error("--groups needs two or more distinct sizes >= 1")
    torch.set_num_threads(args.threads)
    lengths = QUICK_LENGTHS if args.quick else STEP_LENGTHS
    if args.child_memory is not None:
        print(json.dumps(memory_points(args.child_memory, groups, lengths, "cpu", args.seed)))
        return 0
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    reps = args.reps or (3 if args.quick else 5)
    step_groups = {"tiny": 2 if args.quick else 4, "qwen3-20m": 1}
    dirs = {name: model_dir(name) for name in MODELS}
    print(
        f"torch {torch.__version__}, device {args.device}, precision {args.precision}, "
        f"threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)"
    )
    summary: dict[str, Any] = {
        "torch": torch.__version__,
        "device": args.device,
        "precision": args.precision,
        "threads": args.threads,
        "quick": args.quick,
        "load_average": os.getloadavg()[0],
        "models": {name: str(d) for name, d in dirs.items()},
    }
    runs = []
    for name, directory in dirs.items():
        backends = {
            b: open_backend(b, directory, args.device, 16_384, args.precision) for b in BACKENDS
        }
        torch_backend = backends["torch"]
        if isinstance(torch_backend, str):
            raise SystemExit(f"the torch backend cannot run: {torch_backend}")
        vocab = torch_backend.vocab_size  # type: ignore[attr-defined]
        shapes = sample_shapes(lengths, step_groups[name], args.seed)
        runs.append(ModelRun(name, directory, make_records(shapes, vocab, args.seed), backends))
    summary["step"] = step_phase(runs, reps, args.device)
    print_step(summary["step"], list(dirs))
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="swerl-bench-trainer-", dir=args.workdir))
    try:
        summary["checkpoint"] = checkpoint_phase(runs, reps, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_checkpoint(summary["checkpoint"], list(dirs))
    runs.clear()
    gc.collect()
    summary["memory"] = memory_phase(dirs, groups, lengths, args)
    print_memory(summary["memory"], list(dirs))
    summary["padding"] = padding_phase(groups=16, seed=args.seed)
    print_padding(summary["padding"])
    write_summary(args.json, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
