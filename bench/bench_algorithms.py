"""Benchmark of the objective layer (Li2SAO, PACT, SR-PPO) against GRPO, and of GAE vs a loop.

Usage (from the repository root)::

    .venv/bin/python bench/bench_algorithms.py            # issue size: 256 x 8192
    .venv/bin/python bench/bench_algorithms.py --quick    # 64 x 2048, well under a minute

What it measures, all in one run so the ratios compare like with like:

* **objective time**: building and validating an ``ObjectiveBatch`` plus ``compute_objective``
  (forward only, and forward + backward of actor and critic losses) for GRPO + PPO clip, the
  Li2SAO bootstrap objective (GRPO advantages, DIS, lambda = 1 returns, divergence mask,
  residual targets, clipped value loss, ranking loss, readiness statistics) and the Li2SAO
  GAE-phase objective (singleton groups, whitened adaptive GAE + DIS, clipped value loss),
  and PACT's actor stage (lambda = 1 advantages, TIS, DIS, credit metric), PACT's critic stage
  (token IS targets, acceptance mask, BCE on logits) and SR-PPO (Pass@k advantages, PPO clip,
  BCE + MSE critic), these three on the GRPO batch with a sigmoid value head.
  One warm-up each, then ``--reps`` rounds in which every candidate runs once (interleaved,
  so a shared machine's background load hits all of them alike); min and median reported.
  ``--clock cpu`` times this thread's CPU time instead of wall time (with ``--threads 1``):
  on a machine loaded by other processes the wall-clock minima still jump by 2x between runs,
  the CPU-time figures much less (at 128 x 4,096 min and median agreed within ~10 %; at the
  ``--quick`` size, a few milliseconds per call, within ~50 %).
* **GAE vs loop**: ``skip_observation_gae`` (the public API: raw mask, inputs validated)
  against a plain per-row, per-token Python loop (written from the spec in this file, on
  Python lists) on the same ``--gae-rows`` rows, plus the vectorised time per row on the full
  batch, for ``[N, T]`` per-token rewards and ``[N]`` outcome rewards, once with one torch
  thread and once with torch's default thread count (all cores; the loop cannot use more
  than one). Both figures are printed; neither is asserted.
* **peak memory**: the objectives (forward + backward) run in a fresh subprocess per size
  (``N/2 x T`` and ``N x T``). For each objective the child builds the batch, runs it once,
  resets the kernel's peak-RSS counter (``/proc/self/clear_refs``), runs it again and reports
  ``VmHWM - VmRSS_before``: the extra resident memory at the peak. ``tracemalloc`` does not
  see torch's allocations; RSS does.
  glibc's mmap threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so freed tensors go back to the
  kernel instead of lingering in the heap. Linear memory shows as a constant bytes-per-element
  figure across the two sizes (an ``[N, T, T]`` or ``[N, N, T]`` tensor would scale with an
  extra factor of ``T`` or ``N``).

Timing runs with glibc's allocator pinned (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
set high; the script re-executes itself with them unless ``--system-malloc``): freed tensors
then stay in the heap, as they would in torch's caching allocator on a GPU, instead of being
unmapped and page-faulted back on every call. Without it the candidates that allocate more
large temporaries pick up a variable page-fault cost (medians 20-30 % above the minimum).

Nothing here asserts a time; the script prints the figures and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.algorithms import (
    ObjectiveBatch,
    compute_objective,
    skip_observation_gae,
    terminal_reward_tokens,
)

PINNED_FLAG = "SWERL_BENCH_MALLOC_PINNED"
PINNED_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
    PINNED_FLAG: "1",
}
"""glibc settings for timing: large blocks stay in the heap (no unmap / page-fault churn)."""

GROUP_SIZE = 8
VOCAB = 32_000


@dataclass(frozen=True)
class Tensors:
    """Raw tensors of a synthetic batch (leaf tensors for logp and values)."""

    tokens: Tensor
    action_mask: Tensor
    group_ids: Tensor
    rewards: Tensor
    behavior_logp: Tensor
    logp: Tensor
    values: Tensor
    old_values: Tensor
    old_logp: Tensor

    def to(self, device: str) -> Tensors:
        """The same batch on ``device`` (leaf tensors stay leaves that require grad)."""
        if device == "cpu":
            return self
        moved = {k: v.detach().to(device) for k, v in self.__dict__.items()}
        for name in ("logp", "values"):
            moved[name].requires_grad_()
        return Tensors(**moved)


def make_tensors(
    n: int, t: int, seed: int, singleton_groups: bool = False, max_prefix: int = 512
) -> Tensors:
    """A batch shaped like agent trajectories.

    Each row alternates action spans (16-255 tokens) and observation spans (8-127 tokens), so
    about a third of the tokens are observations; it ends at a random length in ``[T/2, T]``
    and is padded with ``-1``. Members of a group copy a prefix of the group's first member,
    of uniform random length up to ``max_prefix`` (and the shorter row); rewards are
    Bernoulli(0.5). Sampled agent trajectories of one prompt usually part within a few tokens,
    so the default of 512 is already generous; ``max_prefix = T`` is the worst case for the
    divergence mask (pairs compared over thousands of columns).
    """
    gen = torch.Generator().manual_seed(seed)
    spans = max(2, 2 * t // 24 + 2)
    span_len = torch.empty(n, spans, dtype=torch.long)
    span_len[:, 0::2] = torch.randint(16, 256, (n, (spans + 1) // 2), generator=gen)
    span_len[:, 1::2] = torch.randint(8, 128, (n, spans // 2), generator=gen)
    bounds = torch.cumsum(span_len, dim=1)
    pos = torch.arange(t).expand(n, t).contiguous()
    span_of = torch.searchsorted(bounds, pos, right=True)
    lengths = torch.randint(t // 2, t + 1, (n,), generator=gen)
    inside = pos < lengths[:, None]
    mask = (span_of % 2 == 0) & inside
    tokens = torch.randint(0, VOCAB, (n, t), generator=gen)
    tokens = torch.where(inside, tokens, -1)
    group_ids = torch.arange(n) // GROUP_SIZE
    if not singleton_groups:
        leader = group_ids * GROUP_SIZE
        shared = torch.minimum(lengths, lengths[leader]).clamp(max=max_prefix)
        prefix = (torch.rand(n, generator=gen) * shared.float()).long()
        take = pos < prefix[:, None]
        tokens = torch.where(take, tokens[leader], tokens)
        mask = torch.where(take, mask[leader], mask)
    else:
        group_ids = torch.arange(n)
    rewards = (torch.rand(n, generator=gen) < 0.5).float()
    logp = -3.0 * torch.rand(n, t, generator=gen)
    behavior_logp = logp + 0.05 * torch.randn(n, t, generator=gen)
    values = 0.5 * torch.randn(n, t, generator=gen)
    old_values = values + 0.01 * torch.randn(n, t, generator=gen)
    old_logp = logp + 0.02 * torch.randn(n, t, generator=gen)  # the trainer's recomputation
    return Tensors(
        tokens=tokens,
        action_mask=mask,
        group_ids=group_ids,
        rewards=rewards,
        behavior_logp=behavior_logp,
        logp=logp.requires_grad_(),
        values=values.requires_grad_(),
        old_values=old_values,
        old_logp=old_logp,
    )


class Kind(NamedTuple):
    """One timed objective: the algorithm, its phase / stage, and the batch it runs on."""

    algorithm: str
    phase: str = "bootstrap"
    singleton: bool = False
    stage: str = "actor"


KINDS: dict[str, Kind] = {
    "grpo": Kind("grpo"),
    "li2sao-bootstrap": Kind("li2sao"),
    "li2sao-gae": Kind("li2sao", "switched", singleton=True),
    # PACT / SR-PPO on the GRPO batch (their losses ignore groups); values are the sigmoid
    # head's logits there
    "pact-actor": Kind("pact"),
    "pact-critic": Kind("pact", stage="critic"),
    "srppo": Kind("srppo"),
}
SIGMOID_HEAD = ("pact", "srppo")


def run_objective(kind: str, x: Tensors, backward: bool) -> None:
    """Build the batch (validation included) and evaluate one objective."""
    spec = KINDS[kind]
    critic = spec.algorithm != "grpo"
    logits = spec.algorithm in SIGMOID_HEAD
    batch = ObjectiveBatch(
        tokens=x.tokens,
        action_mask=x.action_mask,
        group_ids=x.group_ids,
        rewards=x.rewards,
        behavior_logp=x.behavior_logp,
        logp=x.logp,
        values=x.values if critic and not logits else None,
        old_values=x.old_values if critic and not logits else None,
        old_logp=x.old_logp if spec.algorithm == "pact" else None,  # SR-PPO does not read it
        value_logits=x.values if logits else None,
    )
    result = compute_objective(
        spec.algorithm,  # type: ignore[arg-type]
        batch,
        phase=spec.phase,  # type: ignore[arg-type]
        stage=spec.stage,  # type: ignore[arg-type]
    )
    if backward:
        losses = [loss for loss in (result.actor_loss, result.critic_loss) if loss is not None]
        sum(losses).backward()  # type: ignore[union-attr]
        x.logp.grad = None
        x.values.grad = None


def interleaved_times(
    fns: dict[str, Callable[[], object]], reps: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Time every function ``reps`` times, round-robin, after one warm-up call each.

    Interleaving exposes all candidates to the same background load (this machine is shared),
    so their ratios stay meaningful even when absolute times drift. ``clock``: wall time by
    default; ``time.thread_time`` counts only this thread's CPU time (see ``--clock``).
    """
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync()
            start = clock()
            fn()
            sync()  # a CUDA call returns before the kernels finish
            times[name].append(clock() - start)
    return times


def loop_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Reference: Eq. 6-7 with a plain Python loop over rows and tokens (spec, not library)."""
    r, v, m = rewards.tolist(), values.tolist(), mask.tolist()
    n, t = len(r), len(r[0])
    adv = [[0.0] * t for _ in range(n)]
    ret = [[0.0] * t for _ in range(n)]
    for i in range(n):
        next_value, running = 0.0, 0.0
        for k in range(t - 1, -1, -1):
            if not m[i][k]:
                continue
            delta = r[i][k] + gamma * next_value - v[i][k]
            running = delta + gamma * lam * running
            adv[i][k] = running
            ret[i][k] = running + v[i][k]
            next_value = v[i][k]
    return torch.tensor(adv, dtype=values.dtype), torch.tensor(ret, dtype=values.dtype)


def bench_gae(x: Tensors, rows: int, reps: int) -> tuple[dict[str, list[float]], float]:
    """Vectorised GAE (public API: raw mask, validation included) vs the loop, interleaved.

    ``per_token``: rewards as an ``[N, T]`` tensor (R on the last action token), the general
    form the loop also reads. ``outcome``: the same rewards passed as ``[N]`` outcomes (the
    trainer's layout).
    """
    mask = x.action_mask
    values = x.old_values.detach()
    rewards = terminal_reward_tokens(x.rewards, mask)
    lam = 0.95
    sub = slice(0, rows)
    # the loop reads host lists; its inputs live on the CPU whatever the device
    cpu = [t[sub].cpu() for t in (rewards, values, mask)]
    adv, ret = skip_observation_gae(rewards[sub], values[sub], mask[sub], 1.0, lam)
    ref_adv, ref_ret = loop_gae(*cpu, 1.0, lam)
    err = max((adv.cpu() - ref_adv).abs().max().item(), (ret.cpu() - ref_ret).abs().max().item())
    fns: dict[str, Callable[[], object]] = {
        "loop": lambda: loop_gae(*cpu, 1.0, lam),
        "same_rows": lambda: skip_observation_gae(rewards[sub], values[sub], mask[sub], 1.0, lam),
        "per_token": lambda: skip_observation_gae(rewards, values, mask, 1.0, lam),
        "outcome": lambda: skip_observation_gae(x.rewards, values, mask, 1.0, lam),
    }
    return interleaved_times(fns, reps), err


def report_gae(x: Tensors, rows: int, reps: int, threads: int) -> dict[str, object]:
    """Print the GAE comparison with ``threads`` torch threads (the loop always uses one);
    return its figures for the ``--json`` summary."""
    torch.set_num_threads(threads)
    try:
        g, err = bench_gae(x, rows, reps)
    finally:
        torch.set_num_threads(1)
    n = x.action_mask.shape[0]
    loop, same, full, outcome = (min(g[k]) for k in ("loop", "same_rows", "per_token", "outcome"))
    per_row_loop = loop / rows
    per_row = {
        "[N, T] rewards": per_row_loop / (full / n),
        "[N] outcomes": per_row_loop / (outcome / n),
    }
    where = f"torch threads {threads}" if x.action_mask.is_cpu else str(x.action_mask.device)
    print(f"\nGAE (gamma=1, lambda=0.95), {where}: vectorised vs plain loop")
    print(f"loop reference, {rows} rows:               {loop:.4f} s (min)")
    print(f"vectorised, the same {rows} rows:          {same:.5f} s (min)")
    print(f"vectorised, all {n} rows, [N, T] rewards:  {full:.4f} s (min)")
    print(f"vectorised, all {n} rows, [N] outcomes:    {outcome:.4f} s (min)")
    print(f"speed-up on the same {rows} rows: {loop / same:.0f}x")
    for label, speedup in per_row.items():
        print(f"speed-up per row, full batch vs loop: {speedup:.0f}x ({label})")
    print(f"max |vectorised - loop| = {err:.2e}; target >= 50x")
    return {
        "threads": threads,
        "device": str(x.action_mask.device),
        "loop_rows": rows,
        "min_seconds": {"loop": loop, "same_rows": same, "per_token": full, "outcome": outcome},
        "speedup_same_rows": loop / same,
        "speedup_per_row": {
            "per_token": per_row["[N, T] rewards"],
            "outcome": per_row["[N] outcomes"],
        },
        "max_abs_error": err,
    }


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_memory(n: int, t: int, seed: int, max_prefix: int) -> None:
    """Subprocess entry: peak extra RSS of each objective (forward + backward), as JSON.

    Per objective: build its batch, run it once (lazy initialisation, autograd machinery),
    reset the kernel's peak-RSS counter, run it again and read the peak. Freed tensors go back
    to the kernel (pinned mmap threshold), so one objective does not inflate the next.
    """
    peaks: dict[str, int] = {}
    for kind, spec in KINDS.items():
        x = make_tensors(n, t, seed, singleton_groups=spec.singleton, max_prefix=max_prefix)
        run_objective(kind, x, backward=True)
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        before = _status_kib("VmRSS")
        run_objective(kind, x, backward=True)
        peaks[kind] = (_status_kib("VmHWM") - before) * 1024
        del x
        gc.collect()
    print(json.dumps(peaks))


def measure_memory(n: int, t: int, args: argparse.Namespace) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_MALLOC}
    env.update(MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--child-memory", "--n", str(n), "--t", str(t)]
    cmd += ["--seed", str(args.seed), "--threads", str(args.threads)]
    cmd += ["--shared-prefix", str(args.shared_prefix)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return {k: int(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def report_cuda_memory(n: int, t: int, args: argparse.Namespace) -> dict[str, object]:
    """Peak extra CUDA memory of each objective (forward + backward) at N/2 x T and N x T."""
    print("\npeak extra CUDA memory of one objective (forward + backward)")
    sizes = [(n // 2, t), (n, t)]
    peaks: list[dict[str, int]] = []
    for a, b in sizes:
        row: dict[str, int] = {}
        for kind, spec in KINDS.items():
            x = make_tensors(a, b, args.seed, spec.singleton, args.shared_prefix).to(args.device)
            run_objective(kind, x, backward=True)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            run_objective(kind, x, backward=True)
            torch.cuda.synchronize()
            row[kind] = torch.cuda.max_memory_allocated() - before
            del x
        peaks.append(row)
    for kind in KINDS:
        cells = "".join(f"{p[kind] / 2**20:>10.1f} MiB" for p in peaks)
        ratio = peaks[1][kind] / max(peaks[0][kind], 1)
        print(f"{kind:<20}{cells}{ratio:>7.2f}x")
    print("N*T doubles between the two sizes: linear memory shows as a ~2x ratio")
    return memory_summary("cuda", sizes, peaks)


def memory_summary(
    kind: str, sizes: list[tuple[int, int]], peaks: list[dict[str, int]]
) -> dict[str, object]:
    """The ``--json`` form of a peak-memory table: bytes per size and the large / small ratio."""
    return {
        "measure": kind,
        "sizes": [list(size) for size in sizes],
        "peak_bytes": {k: [p[k] for p in peaks] for k in KINDS},
        "ratio": {k: peaks[1][k] / max(peaks[0][k], 1) for k in KINDS},
    }


def write_summary(path: Path | None, summary: dict[str, object]) -> None:
    """``--json FILE``: the figures printed above, machine-readable (``-``: stdout)."""
    if path is None:
        return
    text = json.dumps(summary, indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 x 2048, a few seconds")
    parser.add_argument("--n", type=int, default=None, help="trajectories (default 256)")
    parser.add_argument("--t", type=int, default=None, help="positions (default 8192)")
    parser.add_argument(
        "--reps", type=int, default=None, help="timed repetitions of each measurement (10)"
    )
    parser.add_argument("--gae-rows", type=int, default=None, help="rows for the loop reference")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tensors (0)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steady on a shared box)"
    )
    parser.add_argument(
        "--shared-prefix", type=int, default=512, help="longest prefix group members share"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the vectorised code runs, e.g. cuda (the loop reference always runs on the "
        "host; peak memory is then torch's CUDA peak instead of RSS)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="objective timings: wall time, or this thread's CPU time (steady on a loaded "
        "machine, where other processes preempt the run; needs --threads 1 on the CPU)",
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory measurements"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write every figure as JSON to FILE ('-': stdout, after the text)",
    )
    parser.add_argument(
        "--system-malloc",
        action="store_true",
        help="time with glibc's default allocator settings (noisier: see the module docstring)",
    )
    parser.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.child_memory or args.system_malloc or os.environ.get(PINNED_FLAG)):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **PINNED_MALLOC})
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    n = args.n or (64 if args.quick else 256)
    t = args.t or (2048 if args.quick else 8192)
    if args.child_memory:
        child_memory(n, t, args.seed, args.shared_prefix)
        return
    reps = args.reps or 10
    gae_rows = args.gae_rows or (8 if args.quick else 16)
    if n % GROUP_SIZE:
        parser.error(f"--n must be a multiple of {GROUP_SIZE}")
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        parser.error("--clock cpu measures one CPU thread: use it with --threads 1 on the CPU")

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, N={n}, T={t}")
    grouped = make_tensors(n, t, args.seed, max_prefix=args.shared_prefix).to(args.device)
    single = make_tensors(n, t, args.seed, singleton_groups=True).to(args.device)
    print(f"device: {grouped.action_mask.device}")
    obs_frac = 1 - grouped.action_mask.sum().item() / (grouped.tokens >= 0).sum().item()
    print(f"observation share of real tokens: {obs_frac:.3f}")
    print(f"group members share a random prefix of up to {args.shared_prefix} tokens")

    print(f"load average before timing: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    pinned = "pinned" if os.environ.get(PINNED_FLAG) else "glibc defaults"
    print(f"allocator: {pinned}; torch default threads {default_threads}")
    summary: dict[str, object] = {
        "torch": torch.__version__,
        "n": n,
        "t": t,
        "device": str(grouped.action_mask.device),
        "allocator": pinned,
        "threads": args.threads,
        "torch_default_threads": default_threads,
        "load_average": os.getloadavg()[0],
    }
    print(
        f"\nobjective time ({args.clock} clock), seconds: min / median of {reps} interleaved runs"
    )
    fns: dict[str, Callable[[], object]] = {}
    for kind, spec in KINDS.items():
        x = single if spec.singleton else grouped
        fns[f"{kind}:fwd"] = lambda k=kind, x=x: run_objective(k, x, backward=False)
        fns[f"{kind}:both"] = lambda k=kind, x=x: run_objective(k, x, backward=True)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    times = interleaved_times(fns, reps, clock)
    best = {k: min(v) for k, v in times.items()}
    mid = {k: statistics.median(v) for k, v in times.items()}
    summary["objective"] = {
        "clock": args.clock,
        "reps": reps,
        "seconds": {
            kind: {
                part: {"min": best[f"{kind}:{part}"], "median": mid[f"{kind}:{part}"]}
                for part in ("fwd", "both")
            }
            for kind in KINDS
        },
        "ratio_to_grpo": {
            kind: {
                part: {
                    "min": best[f"{kind}:{part}"] / best[f"grpo:{part}"],
                    "median": mid[f"{kind}:{part}"] / mid[f"grpo:{part}"],
                }
                for part in ("fwd", "both")
            }
            for kind in KINDS
            if kind != "grpo"
        },
    }
    print(f"{'objective':<20}{'forward':>22}{'forward + backward':>24}")
    for kind in KINDS:
        fwd = f"{best[kind + ':fwd']:.4f} / {mid[kind + ':fwd']:.4f}"
        both = f"{best[kind + ':both']:.4f} / {mid[kind + ':both']:.4f}"
        print(f"{kind:<20}{fwd:>22}{both:>24}")
    for kind in [k for k in KINDS if k != "grpo"]:
        ratios = [
            f"{stat[kind + ':' + part] / stat['grpo:' + part]:.2f}x"
            for part in ("fwd", "both")
            for stat in (best, mid)
        ]
        print(
            f"ratio {kind} / grpo: forward {ratios[0]} (min) {ratios[1]} (median), "
            f"fwd+bwd {ratios[2]} (min) {ratios[3]} (median)"
        )
    print("target: li2sao-bootstrap / grpo <= 2x; pact-actor, pact-critic, srppo / grpo <= 2x each")

    gae_threads = sorted({1, default_threads}) if args.device == "cpu" else [args.threads]
    summary["gae"] = [
        report_gae(grouped, gae_rows, max(3, reps // 2), threads) for threads in gae_threads
    ]

    summary["memory"] = None
    if args.no_memory:
        write_summary(args.json, summary)
        return
    if args.device != "cpu":
        summary["memory"] = report_cuda_memory(n, t, args)
        write_summary(args.json, summary)
        return
    print("\npeak extra RSS of one objective (forward + backward), a fresh process per size")
    sizes = [(n // 2, t), (n, t)]
    peaks = [measure_memory(a, b, args) for a, b in sizes]
    print(f"{'objective':<20}" + "".join(f"{f'{a}x{b}':>14}" for a, b in sizes) + f"{'ratio':>8}")
    for kind in KINDS:
        cells = "".join(f"{p[kind] / 2**20:>10.1f} MiB" for p in peaks)
        per = " / ".join(f"{p[kind] / (a * b):.1f}" for p, (a, b) in zip(peaks, sizes, strict=True))
        ratio = peaks[1][kind] / max(peaks[0][kind], 1)
        print(f"{kind:<20}{cells}{ratio:>7.2f}x   bytes per N*T element: {per}")
    print("N*T doubles between the two sizes: linear memory shows as a ~2x ratio")
    summary["memory"] = memory_summary("rss", sizes, peaks)
    write_summary(args.json, summary)


if __name__ == "__main__":
    main()
