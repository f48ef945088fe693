"""Build the tiny Qwen3-architecture model used by every CPU test and by ``make demo``.

``python -m services.tiny_model.build DIR [--coder] [--seed N] [--moe]`` writes a complete Hugging
Face model directory: a 2-layer, hidden-64 ``Qwen3ForCausalLM`` (with ``--moe``: a
``Qwen3MoeForCausalLM`` of the same shape whose MLPs are 4 experts, top-2) with random float32
weights (fixed seed, safetensors), a byte-level BPE tokenizer trained here on an embedded corpus
(no downloads), the Qwen special tokens, and a Qwen-style chat template with tool support
(:mod:`services.tiny_model.chat_templates`). The model cannot do anything useful; it exists so that
the whole token path (chat template -> token ids -> engine -> logprobs -> trainer) runs for real
on a CPU in seconds. The same seed produces the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from services.tiny_model.chat_templates import (
    QWEN3_CODER_XML_TOOLS_TEMPLATE,
    QWEN_JSON_TOOLS_TEMPLATE,
)
from services.tiny_model.corpus import CORPUS

# Tokens with ``special=True`` are control tokens (skipped when decoding with
# ``skip_special_tokens``); the tool and think markers are ordinary added tokens, as in Qwen, so
# they survive decoding and the adapter can parse them from the text.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2's pre-tokenisation regex: contractions, letter runs, single digits, punctuation runs,
# newline runs and spaces -- so that merges never cross these boundaries.
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

STAMP_FILE = "swerl_tiny_model.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; recorded in :data:`STAMP_FILE` so a cached build can be checked."""

    coder: bool = False
    seed: int = 0
    target_vocab_size: int = 2048
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    # head_dim 64 (not hidden/heads = 32) keeps the model loadable by GPU attention kernels
    # (FlashInfer/FA3) so deploy/gpu_check_sglang.sh can serve it with real SGLang.
    head_dim: int = 64
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    format_version: int = _FORMAT_VERSION
    # The MoE variant (``moe=True``): every layer's MLP is a Qwen3-MoE sparse block of
    # ``num_experts`` SwiGLU experts (each ``moe_intermediate_size`` wide), ``num_experts_per_tok``
    # chosen per token by a linear router. See :func:`_moe_config` for the routing choices.
    moe: bool = False
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64


def _train_tokenizer(target_vocab_size: int) -> object:
    """Train the byte-level BPE tokenizer (a ``tokenizers.Tokenizer``) on the embedded corpus."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # The added tokens take ids after the trained vocabulary, like Qwen's.
    trained_size = target_vocab_size - len(SPECIAL_TOKENS) - len(MARKER_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=trained_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(list(CORPUS), trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return tokenizer


def _write_tokenizer(out: Path, spec: TinyModelSpec) -> int:
    """Save the tokenizer files into ``out``; return the vocabulary size (model rows)."""
    from transformers import PreTrainedTokenizerFast

    raw = _train_tokenizer(spec.target_vocab_size)
    template = QWEN3_CODER_XML_TOOLS_TEMPLATE if spec.coder else QWEN_JSON_TOOLS_TEMPLATE
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        chat_template=template,
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
    )
    wrapped.save_pretrained(str(out))
    _normalise_tokenizer_config(out)
    return len(wrapped)


def _normalise_tokenizer_config(out: Path) -> None:
    """Name a tokenizer class every recent transformers (4.5x and 5.x, SGLang's too) can load."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _common_config(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int) -> dict:
    """Config fields shared by the dense and the MoE variant."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype="float32",
    )


def _moe_config(common: dict, spec: TinyModelSpec) -> object:
    """A ``Qwen3MoeConfig`` (the architecture of Qwen3-30B-A3B / Qwen3-Coder-30B-A3B), tiny.

    Routing, stated once because every backend must agree on it for parity:
    - the router is ``softmax(x W_r^T)`` over all experts in fp32, then the top-k experts are
      kept and **their probabilities renormalised to sum to 1** (``norm_topk_prob=True``, as in
      Qwen3-30B-A3B's config); the expert outputs are summed with those weights;
    - no capacity limit, so **no token is ever dropped** (transformers' experts loop and
      megatron-core with ``moe_expert_capacity_factor=None`` both route every token);
    - the router's load-balancing auxiliary loss is **off** (``output_router_logits=False``,
      ``router_aux_loss_coef=0``): the RL objective is the only loss, so the torch and Megatron
      backends compute the same gradients;
    - every layer is sparse (``decoder_sparse_step=1``, no ``mlp_only_layers``), no shared expert.
    """
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **common,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        norm_topk_prob=True,
        output_router_logits=False,
        router_aux_loss_coef=0.0,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _write_model(out: Path, spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeForCausalLM,
    )

    common = _common_config(spec, vocab_size, eos_id, pad_id)
    torch.manual_seed(spec.seed)
    if spec.moe:
        model = Qwen3MoeForCausalLM(_moe_config(common, spec))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    model = model.to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, do_sample=True
    )
    model.save_pretrained(str(out))
    if spec.moe:
        _name_experts_like_qwen(out)


def _name_experts_like_qwen(out: Path) -> None:
    """Also write ``num_experts``, the key of Qwen3-30B-A3B's config.json: transformers 5 saves
    only its alias ``num_local_experts``, which older readers (SGLang's transformers) ignore."""
    path = out / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["num_experts"] = config["num_local_experts"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def model_spec(
    coder: bool = False,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    moe: bool = False,
) -> TinyModelSpec:
    """The spec of a build: the tiny model's shape, or that shape with ``sizes`` changed
    (``{"hidden_size": 512, "num_hidden_layers": 6, ...}``: a larger model of the same family,
    e.g. for ``bench/bench_trainer.py``); ``moe`` selects the Qwen3-MoE variant (its expert
    sizes are ``sizes`` too). An unknown or non-positive size is a ValueError."""
    sizes = dict(sizes or {})
    known = {f.name for f in fields(TinyModelSpec)} - {"coder", "seed", "format_version", "moe"}
    unknown = sorted(set(sizes) - known)
    if unknown:
        raise ValueError(f"unknown model sizes {unknown}; known: {sorted(known)}")
    bad = {k: v for k, v in sizes.items() if not (isinstance(v, int | float) and v > 0)}
    if bad:
        raise ValueError(f"model sizes must be positive numbers, got {bad}")
    spec = replace(TinyModelSpec(coder=coder, seed=seed, moe=moe), **sizes)
    if spec.num_experts_per_tok > spec.num_experts:
        raise ValueError(
            f"num_experts_per_tok ({spec.num_experts_per_tok}) exceeds num_experts "
            f"({spec.num_experts})"
        )
    return spec


def build_tiny_model(
    directory: str | os.PathLike[str],
    coder: bool = False,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    moe: bool = False,
) -> Path:
    """Build the tiny model into ``directory`` (created or overwritten); return its path.

    ``sizes`` changes fields of :class:`TinyModelSpec` (see :func:`model_spec`); ``moe`` builds
    the Qwen3-MoE variant (same tokenizer and template, sparse MLPs). The build
    happens in a sibling temporary directory that is renamed into place, so a reader never sees
    a half-written model.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    target = Path(directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    spec = model_spec(coder, seed, sizes, moe=moe)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        vocab_size = _write_tokenizer(staging, spec)
        tokenizer = AutoTokenizer.from_pretrained(str(staging))
        eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
        _write_model(staging, spec, vocab_size, eos_id, pad_id)
        stamp = {**asdict(spec), "vocab_size": vocab_size, "eos_token_id": eos_id}
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        publish_build(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def publish_build(staging: Path, target: Path) -> None:
    """Move a finished build from its sibling ``staging`` directory to ``target`` (replacing
    it), readable by everyone (sandboxes and engine containers mount it) whatever the umask."""
    for item in staging.iterdir():
        item.chmod(0o644)
    staging.chmod(0o755)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)


def read_stamp(directory: str | os.PathLike[str]) -> dict[str, object] | None:
    """The build parameters of a tiny model directory, or None if it is not a complete build."""
    path = Path(directory) / STAMP_FILE
    if not path.is_file():
        return None
    required = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    if not all((Path(directory) / name).is_file() for name in required):
        return None
    stamp: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return stamp


def ensure_tiny_model(
    directory: str | os.PathLike[str],
    coder: bool = False,
    seed: int = 0,
    sizes: Mapping[str, int] | None = None,
    moe: bool = False,
) -> Path:
    """Return ``directory`` holding the tiny model (with ``sizes`` changed, see
    :func:`model_spec`; the MoE variant with ``moe``), building it only if it is missing.

    A directory holding a different variant (other seed, template or format) is an error rather
    than being silently overwritten: callers should use one cache directory per variant.
    """
    target = Path(directory).resolve()
    stamp = read_stamp(target)
    if stamp is None:
        if target.exists() and any(target.iterdir()):
            raise FileExistsError(f"{target} exists and is not a complete tiny model build")
        return build_tiny_model(target, coder=coder, seed=seed, sizes=sizes, moe=moe)
    wanted = asdict(model_spec(coder, seed, sizes, moe=moe))
    # Builds stamped before a field existed were built with that field's default.
    defaults = asdict(TinyModelSpec())
    mismatched = {
        k: (stamp.get(k, defaults[k]), v)
        for k, v in wanted.items()
        if stamp.get(k, defaults[k]) != v
    }
    if mismatched:
        raise ValueError(
            f"{target} holds a different tiny model variant (stamp vs wanted: {mismatched}); "
            "use a separate directory per variant"
        )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.tiny_model.build",
        description="Build the tiny random-weight Qwen3-architecture test model (offline).",
    )
    parser.add_argument("directory", type=Path, help="output directory (overwritten)")
    parser.add_argument(
        "--coder", action="store_true", help="use the Qwen3-Coder XML tool-call chat template"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (>= 0)")
    parser.add_argument(
        "--moe",
        action="store_true",
        help="build the Qwen3-MoE variant (4 experts, top-2, renormalised top-k, no aux loss)",
    )
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    path = build_tiny_model(args.directory, coder=args.coder, seed=args.seed, moe=args.moe)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    print(f"tiny model written to {path} ({size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
