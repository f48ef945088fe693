"""Format warm-start of the tiny model for the toy task (``python -m services.tiny_model.warm_start
DIR``).

A random tiny model never emits a tool call by chance (2,048-token vocabulary), so RL on the toy
task "lookup then answer" (:mod:`services.protocol.toy`, docs/toy-task.md) would see reward 0
forever. This module fine-tunes it, supervised, on the task's *format* only:

* turn 1: exactly the ``lookup`` call in the model's real tool-call syntax (the chat template's
  ``<tool_call>\\n{"name": "lookup", "arguments": {}}\\n</tool_call>``), so the adapter parses it
  as a real tool call;
* turn 2: a code that **reads the observation with the wrong rule**, then the end of the turn:
  the code *after* the observed one in :data:`~services.protocol.toy.CODES` (cyclically) in
  3/4 of the conversations, the observed code itself in 1/4. The model learns to look at the
  tool's result and answers correctly a quarter of the time: reward at chance (0.25), so RL
  still has everything to learn about *which* code (the observed one, not its successor).

Why not answers independent of the observation (measured, docs/toy-task.md): such a model
learns to ignore the observation, and the 2-layer tiny model then needs 70+ RL steps before it
starts to read it (an attention plateau); with the wrong-rule answers it already reads it and
RL only has to change the rule (reward 0.27 -> 0.75 within about 16 GRPO steps in-process).

Loss on the assistant tokens only; every step draws a fresh batch (random instance numbers,
observation codes and answer codes) from one seeded generator. Deterministic: fixed seed, CPU,
one thread; the same base model and :class:`WarmStartSpec` give the same bytes. The result is a
complete model directory (the base's tokenizer, template and stamp, plus :data:`STAMP_FILE`)
built in a sibling temporary directory and renamed into place; :func:`ensure_warm_start` builds
it only when missing (``deploy/dev/setup.sh`` caches it as ``$SWERL_CACHE_DIR/tiny-model-toy``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.protocol.toy import CODES, LOOKUP_TOOL, TOOL_NAME, observation, prompt_messages
from services.tiny_model.build import ensure_tiny_model, publish_build, read_stamp

STAMP_FILE = "swerl_warm_start.json"
DEFAULT_DIR_NAME = "tiny-model-toy-v2"
_FORMAT_VERSION = 2


@dataclass(frozen=True)
class WarmStartSpec:
    """The fine-tune's settings; recorded in :data:`STAMP_FILE` so a cached build can be checked."""

    seed: int = 0
    steps: int = 300
    batch_size: int = 8
    lr: float = 1e-2  # decayed linearly to 10 %
    weight_decay: float = 0.0
    max_instance: int = 1000  # instance numbers drawn from [0, max_instance)
    copy_fraction: float = 0.25  # conversations answering the observed code
    shift_fraction: float = 0.75  # ... answering the code after it; the rest: a uniform draw
    format_version: int = _FORMAT_VERSION

    def __post_init__(self) -> None:
        shares = (self.copy_fraction, self.shift_fraction)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError(
                f"copy_fraction and shift_fraction must be >= 0 with a sum <= 1, got {shares}"
            )


class WarmStartError(RuntimeError):
    """The warm-start cannot be built or a cached one does not match (the message says why)."""


def episode_messages(instance_id: str, seen_code: str, answer: str) -> list[dict[str, Any]]:
    """One training conversation: prompt, the ``lookup`` call, the observation, ``answer``."""
    call = {"id": "call_0", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{}"}}
    return [
        *prompt_messages(instance_id),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": observation(seen_code)},
        {"role": "assistant", "content": answer},
    ]


def encode_episode(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a 0/1 mask of the assistant tokens (what the
    model generates: each assistant turn's body up to and including its ``<|im_end|>``, i.e.
    everything after an ``<|im_start|>assistant\n`` header)."""
    text = tokenizer.apply_chat_template(messages, tools=[LOOKUP_TOOL], tokenize=False)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    mask = [0] * len(ids)
    inside = False
    for i in range(len(ids)):
        if inside or (i >= len(header) and ids[i - len(header) : i] == header):
            mask[i] = 1
            inside = ids[i] != end
    if sum(1 for i in range(len(ids)) if mask[i] and ids[i] == end) != 2:
        raise WarmStartError("the toy episode does not render as two assistant turns")
    return ids, mask


def taught_answer(seen: str, u: float, rng: random.Random, spec: WarmStartSpec) -> str:
    """The answer a training conversation teaches for the observed code ``seen``, given a
    uniform draw ``u``: the code itself (``u < copy_fraction``), the code after it, or (for the
    rest, none by default) a uniform draw from ``rng``."""
    if u < spec.copy_fraction:
        return seen
    if u < spec.copy_fraction + spec.shift_fraction:
        return CODES[(CODES.index(seen) + 1) % len(CODES)]
    return rng.choice(CODES)


def _batch(tokenizer: Any, rng: random.Random, spec: WarmStartSpec) -> tuple[Any, Any, Any]:
    import torch

    rows = []
    for _ in range(spec.batch_size):
        instance = f"toy-lookup-{rng.randrange(spec.max_instance)}"
        seen = rng.choice(CODES)
        messages = episode_messages(instance, seen, taught_answer(seen, rng.random(), rng, spec))
        rows.append(encode_episode(tokenizer, messages))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (ids, mask) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        attention[r, : len(ids)] = 1
        labels[r, : len(ids)] = torch.tensor(
            [t if m else -100 for t, m in zip(ids, mask, strict=True)]
        )
    return input_ids, attention, labels


def masked_loss(model: Any, input_ids: Any, attention: Any, labels: Any) -> Any:
    """Mean next-token cross-entropy over the labelled (assistant) tokens; the output layer runs
    on those positions only (a few percent of the sequence: most of a step's cost saved)."""
    import torch.nn.functional as F

    hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return F.cross_entropy(logits, targets[keep])


def train(model: Any, tokenizer: Any, spec: WarmStartSpec) -> list[float]:
    """Supervised steps on the format (see the module docstring); returns the loss per step."""
    import torch

    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    losses = []
    for step in range(spec.steps):
        input_ids, attention, labels = _batch(tokenizer, rng, spec)
        for group in optimizer.param_groups:  # linear decay to 10 % of lr
            group["lr"] = spec.lr * (1.0 - 0.9 * step / max(1, spec.steps - 1))
        loss = masked_loss(model, input_ids, attention, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def build_warm_start(
    directory: str | os.PathLike[str],
    base: str | os.PathLike[str],
    spec: WarmStartSpec | None = None,
) -> Path:
    """Fine-tune the tiny model at ``base`` into ``directory`` (created or overwritten)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = spec or WarmStartSpec()
    base_path = Path(base).resolve()
    base_stamp = read_stamp(base_path)
    if base_stamp is None:
        raise WarmStartError(f"{base_path} is not a complete tiny model build")
    target = Path(directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic bytes whatever the machine
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(str(base_path))
        model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
        losses = train(model, tokenizer, spec)
        model.save_pretrained(str(staging))
        for item in base_path.iterdir():  # tokenizer, template, generation config, base stamp
            if item.is_file() and not (staging / item.name).exists():
                shutil.copy2(item, staging / item.name)
        stamp = {
            **asdict(spec),
            "base": base_stamp,
            "final_loss": round(losses[-1], 4),
            "train_seconds": round(time.monotonic() - started, 1),
        }
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        publish_build(staging, target)
    finally:
        torch.set_num_threads(threads)
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def read_warm_stamp(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The warm-start stamp of ``directory``, or None if it is not a complete warm-start build."""
    path = Path(directory) / STAMP_FILE
    if read_stamp(directory) is None or not path.is_file():
        return None
    stamp: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return stamp


def ensure_warm_start(
    directory: str | os.PathLike[str],
    base: str | os.PathLike[str],
    spec: WarmStartSpec | None = None,
) -> Path:
    """``directory`` holding the warm-started model, built from ``base`` (itself built when
    missing) only if it is not there; a build with other settings is an error, never
    silently overwritten."""
    spec = spec or WarmStartSpec()
    target = Path(directory).resolve()
    stamp = read_warm_stamp(target)
    if stamp is None:
        if target.exists() and any(target.iterdir()):
            raise WarmStartError(f"{target} exists and is not a complete warm-start build")
        return build_warm_start(target, ensure_tiny_model(base), spec)
    wanted = asdict(spec)
    mismatched = {k: (stamp.get(k), v) for k, v in wanted.items() if stamp.get(k) != v}
    if mismatched:
        raise WarmStartError(
            f"{target} holds a warm-start with other settings (stamp vs wanted: {mismatched}); "
            "use a separate directory per variant"
        )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.tiny_model.warm_start",
        description="Fine-tune the tiny model on the toy task's format (a lookup tool call, "
        "then a code read from the observation with the wrong rule: reward at chance); "
        "deterministic, CPU, about a minute.",
    )
    parser.add_argument("directory", type=Path, help="output directory (overwritten)")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="the tiny model to start from (default: tiny-model next to DIRECTORY, built if "
        "missing)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and init (>= 0)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    base = args.base or args.directory.resolve().parent / "tiny-model"
    try:
        path = build_warm_start(args.directory, ensure_tiny_model(base), WarmStartSpec(args.seed))
    except (WarmStartError, FileExistsError, ValueError) as exc:  # a bad or foreign --base
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stamp = read_warm_stamp(path) or {}
    print(
        f"warm-started toy model written to {path} (final loss {stamp.get('final_loss')}, "
        f"{stamp.get('train_seconds')} s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
