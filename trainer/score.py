"""``python -m trainer score``: per-token log-probabilities of given sequences under a model.

The debugging tool for the train / rollout mismatch: feed it the token ids an engine sampled
and compare its logprobs with the engine's. Each input line is ``{"input_ids": [...],
"start": k}``; each output line repeats it and adds ``"logprobs"``: the log-probability of
``input_ids[t]`` given ``input_ids[:t]`` for every ``t >= k`` (``len(logprobs) ==
len(input_ids) - k``), computed in fp32 by the trainer backend (the same code path as
training). ``start`` must be >= 1: the first token has no predecessor.

``--backend megatron --nproc N`` scores with N local processes (:mod:`trainer.launch`) as one
megatron model split ``--tp`` / ``--pp`` / ``--ep`` ways, or every sequence split ``--cp`` ways
(the backend's rules; ranks left over are data parallel); rank 0 writes the output with every
row's logprobs whole.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.backends import create_backend
from trainer.config import TrainerConfig
from trainer.data import SegmentRow, batch_from_rows
from trainer.launch import is_child, launch

CHUNK = 64  # lines scored per backend call


class ScoreInputError(ValueError):
    """An input line is not ``{"input_ids": [ints], "start": k}`` with 1 <= k < len."""


def parse_line(number: int, line: str, vocab_size: int) -> dict[str, Any]:
    where = f"line {number}"
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ScoreInputError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(item, dict):
        raise ScoreInputError(f"{where}: expected an object with input_ids and start")
    ids, start = item.get("input_ids"), item.get("start")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise ScoreInputError(f"{where}: input_ids must be a list of integers")
    if type(start) is not int or not 1 <= start < len(ids):
        raise ScoreInputError(
            f"{where}: start must be an integer with 1 <= start < len(input_ids)={len(ids)}, "
            f"got {start!r}"
        )
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ScoreInputError(
            f"{where}: token id {bad[0]} outside the vocabulary [0, {vocab_size})"
        )
    return item


def _row(n: int, item: dict[str, Any]) -> SegmentRow:
    ids, start = item["input_ids"], item["start"]
    tokens = ids[start:]
    return SegmentRow(
        trajectory_id=f"line-{n}",
        group_id=f"line-{n}",
        segment_index=0,
        prompt_ids=ids[:start],
        tokens=tokens,
        action_mask=[1] * len(tokens),
        behavior_logp=[0.0] * len(tokens),
        versions=[0] * len(tokens),
        reward=0.0,
        truncated=False,
    )


def _chunks(lines: Iterator[str], vocab_size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        chunk.append(parse_line(number, line, vocab_size))
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def score_file(config: TrainerConfig, source: Path, target: Path) -> int:
    """Score every line of ``source`` into ``target``; return the number of lines written.
    Under ``torch.distributed`` every rank scores (the backend's collectives) and rank 0
    writes."""
    import torch.distributed as dist

    backend = create_backend(config)
    vocab = int(getattr(backend, "vocab_size", sys.maxsize))
    pad = int(getattr(backend, "pad_id", 0))
    written = 0
    writer = not dist.is_initialized() or dist.get_rank() == 0
    destination = target if writer else Path(os.devnull)
    with source.open(encoding="utf-8") as src, destination.open("w", encoding="utf-8") as out:
        for chunk in _chunks(iter(src), vocab):
            batch = batch_from_rows([_row(n, item) for n, item in enumerate(chunk)], pad)
            logprobs = backend.logprobs_and_values(batch).logprobs.cpu()
            for n, item in enumerate(chunk):
                count = len(item["input_ids"]) - item["start"]
                out.write(json.dumps({**item, "logprobs": logprobs[n, :count].tolist()}) + "\n")
                written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer score",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--backend",
        choices=["torch", "megatron"],
        default="torch",
        help="trainer backend whose forward scores",
    )
    kinds = (("--tp", "tensor"), ("--pp", "pipeline"), ("--ep", "expert"), ("--cp", "context"))
    for flag, what in kinds:
        parser.add_argument(flag, type=int, default=1, help=f"megatron: {what}-parallel size")
    parser.add_argument(
        "--nproc", type=int, default=1, help="megatron: local processes (ranks) that score"
    )
    parser.add_argument("--model", required=True, type=Path, help="HF model directory")
    parser.add_argument("--input", required=True, type=Path, help="JSONL of input_ids + start")
    parser.add_argument("--output", required=True, type=Path, help="JSONL written here")
    parser.add_argument(
        "--device", default="cpu", help="torch device that scores: cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="score log_softmax(logits / T), as an engine sampling at T reports",
    )
    args = parser.parse_args(argv)
    sizes = {
        "tensor_parallel": args.tp,
        "pipeline_parallel": args.pp,
        "expert_parallel": args.ep,
        "context_parallel": args.cp,
    }
    parallel = args.nproc > 1 or any(size != 1 for size in sizes.values())
    if parallel and args.backend != "megatron":
        print("error: --tp/--pp/--ep/--cp/--nproc need --backend megatron", file=sys.stderr)
        return 2
    if args.nproc > 1 and not is_child():
        return launch(["-m", "trainer", "score", *(sys.argv[2:] if argv is None else argv)],
                      args.nproc)  # fmt: skip
    try:
        config = TrainerConfig(
            backend=args.backend,
            model=str(args.model),
            device=args.device,
            rollout_temperature=args.temperature,
            megatron=sizes,
        )
        count = score_file(config, args.input, args.output)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"scored {count} sequences into {args.output}", file=sys.stderr)
    return 0
