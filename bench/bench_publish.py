"""Benchmark of weight publishing: disk vs distributed transport, tiny and ~20M models, CPU.

``python bench/bench_publish.py [--rounds N] [--buckets MB,MB,...] [--models tiny,qwen3-20m]
[--json FILE]``

Per model (bench_trainer's table: the tiny model and its ~20M scale-up), one private Redis, two
reference engine subprocesses and an adapter subprocess (``python -m
adapter``); the trainer is this process. Each round moves the trainer's weights (a stand-in for
an actor update, the version advances) and publishes them:

* ``disk`` -- export ``v<N>/`` (safetensors + sha256 manifest, fsync, rename), then the
  adapter's ``/admin/weights``: every engine reads the directory;
* ``distributed`` at each bucket size -- the adapter drives every engine's
  ``update_weights_from_distributed`` while the trainer broadcasts (gloo on the CPU).

Printed per transport: the median publish time, its parts (export, transfer = broadcasts,
engine load as the adapter measured it, gate closed) and MB/s of weights, and each one's ratio
to the disk transport's median. Timings are machine-dependent; compare ratios. On a GPU cluster
the distributed path runs over NCCL (not measured here: unverified on GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bench_adapter import ADMIN_TOKEN, start_adapter  # noqa: E402
from bench.bench_trainer import MODELS, model_dir  # noqa: E402
from tests.support.engines import launch_reference_server  # noqa: E402
from tests.support.redis import start_redis, stop_redis  # noqa: E402
from trainer.backends.torch_backend import TorchBackend  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.publish import PublishConfig, PublishResult, make_publisher  # noqa: E402


def move_weights(backend: TorchBackend, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in backend.actor.parameters():
            param.add_(1e-3 * torch.randn(param.shape, generator=generator))
    backend.version += 1


def summarise(results: list[PublishResult], megabytes: float) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(r.timings[key] for r in results)

    total = median("total")
    return {
        "total_s": total,
        "export_s": median("export"),
        "transfer_s": median("transfer"),
        "engine_load_s": median("engine_load"),
        "gate_closed_s": median("gate_closed"),
        "mb_per_s": megabytes / total,
        "buckets": float(statistics.median(len(r.bucket_s) for r in results)),
    }


def publish_runs(url: str, work: Path, buckets: list[float]) -> dict[str, PublishConfig]:
    """The transports to time: disk, then the broadcast at every bucket size."""
    runs = {
        "disk": PublishConfig(
            adapter_url=url, admin_token=ADMIN_TOKEN, weights_dir=str(work / "weights")
        )
    }
    for mb in buckets:
        runs[f"distributed_{mb:g}mb"] = PublishConfig(
            transport="distributed",
            adapter_url=url,
            admin_token=ADMIN_TOKEN,
            # broadcast alone (no disk copy): the bench measures the transport itself
            distributed={"backend": "gloo", "bucket_mb": mb, "export_to_disk": False},
        )
    return runs


def time_transport(backend: TorchBackend, config: PublishConfig, rounds: int) -> list:
    publisher = make_publisher(config)
    try:
        move_weights(backend, seed=backend.version + 1)
        publisher.publish(backend)  # warm-up (the distributed group forms here)
        results = []
        for _ in range(rounds):
            move_weights(backend, seed=backend.version + 1)
            result = publisher.publish(backend)
            assert result is not None
            results.append(result)
        return results
    finally:
        publisher.close()


def bench_model(name: str, model_dir: Path, args: argparse.Namespace, buckets: list[float]) -> dict:
    """One model: 2 engines + an adapter on a private Redis, every transport timed."""
    work = Path(tempfile.mkdtemp(prefix=f"swerl-bench-publish-{name}-"))
    store = start_redis(appendonly=False)
    engines: list[Any] = []
    adapter = None
    try:
        with ThreadPoolExecutor(2) as pool:
            engines = list(
                pool.map(lambda _: launch_reference_server(model_dir, None, "0", (), work), [0, 1])
            )
        adapter = start_adapter([e.url for e in engines], model_dir, store.url, work)
        backend = TorchBackend(TrainerConfig(model=str(model_dir)))
        megabytes = sum(t.numel() * t.element_size() for _, t in backend.named_weights()) / 2**20
        figures: dict[str, Any] = {"model_mb": megabytes, "engines": 2, "rounds": args.rounds}
        runs = publish_runs(adapter.url, work, buckets)
        for transport, config in runs.items():
            figures[transport] = summarise(time_transport(backend, config, args.rounds), megabytes)
        for transport in runs:
            figures[transport]["ratio_to_disk"] = (
                figures[transport]["total_s"] / figures["disk"]["total_s"]
            )
        return figures
    finally:
        if adapter is not None:
            adapter.stop()
        for engine in engines:
            engine.stop()
        stop_redis(store)
        shutil.rmtree(work, ignore_errors=True)


def print_model(name: str, figures: dict[str, Any]) -> None:
    print(f"{name}: {figures['model_mb']:.2f} MB of weights, 2 reference engines, CPU (gloo)")
    print(f"{'transport':<22}{'total s':>9}{'export':>9}{'transfer':>10}{'load':>9}"
          f"{'gate':>9}{'MB/s':>8}{'vs disk':>9}")  # fmt: skip
    for transport, f in figures.items():
        if isinstance(f, dict):
            print(
                f"{transport:<22}{f['total_s']:>9.3f}{f['export_s']:>9.3f}{f['transfer_s']:>10.3f}"
                f"{f['engine_load_s']:>9.3f}{f['gate_closed_s']:>9.3f}{f['mb_per_s']:>8.1f}"
                f"{f['ratio_to_disk']:>9.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="publishes per transport")
    parser.add_argument(
        "--buckets", default="0.25,1,4,512", help="distributed bucket sizes to sweep, MB"
    )
    parser.add_argument(
        "--models",
        default="tiny,qwen3-20m",
        help=f"comma-separated models of bench_trainer's table ({', '.join(MODELS)})",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    buckets = [float(b) for b in args.buckets.split(",") if b.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.rounds < 1 or not buckets or min(buckets) <= 0:
        parser.error("--rounds must be >= 1 and bucket sizes > 0")
    unknown = sorted(set(models) - set(MODELS))
    if not models or unknown:
        parser.error(f"--models: unknown {unknown or 'none given'}; known: {', '.join(MODELS)}")
    figures = {}
    for name in models:
        figures[name] = bench_model(name, model_dir(name), args, buckets)
        print_model(name, figures[name])
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
