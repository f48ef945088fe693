"""Forward passes, KV caches, sampling and weight loading for the reference engine (CPU, fp32).

The reference engine must report logprobs that a plain forward pass of the same model over the
same tokens reproduces within 1e-5. Everything here therefore runs in float32 and the KV cache of
each request is only ever extended by exactly the tokens the request saw: a prefill over the
prompt (optionally continuing a cached prefix), then one decode step per generated token.

Decode steps of several requests are batched: their caches are right-aligned in one set of
buffers (left padding masked out), which changes results only at rounding level (the tests check
the 1e-5 bound against a full forward pass). Buffers keep spare columns and are appended to in
place, so a batch whose members do not change costs no copying from one step to the next; a new
batch is assembled (one copy) only when requests join or leave.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.hf_weights import checkpoint_tensors

logger = logging.getLogger(__name__)


class _Buffers:
    """Per-layer key/value buffers shared by the rows of one batch, with spare columns.

    Row ``r`` of a batch holds its tokens right-aligned in columns ``[start_r, length)``;
    columns left of ``start_r`` are zero padding (masked). Every forward appends the same number
    of columns to all rows, in place while capacity lasts.
    """

    def __init__(self, num_layers: int, rows: int) -> None:
        self.rows = rows
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    @property
    def length(self) -> int:
        return self.lengths[0]

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        at = self.lengths[layer]
        need = at + keys.shape[2]
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is None or old_v is None or need > old_k.shape[2]:
            shape = (self.rows, keys.shape[1], need + max(64, need // 4), keys.shape[3])
            new_k = torch.zeros(shape, dtype=keys.dtype)
            new_v = torch.zeros(shape, dtype=values.dtype)
            if old_k is not None and old_v is not None and at:
                new_k[:, :, :at] = old_k[:, :, :at]
                new_v[:, :, :at] = old_v[:, :, :at]
            self.keys[layer], self.values[layer] = new_k, new_v
        k_buf, v_buf = self.keys[layer], self.values[layer]
        assert k_buf is not None and v_buf is not None
        k_buf[:, :, at:need] = keys
        v_buf[:, :, at:need] = values
        self.lengths[layer] = need
        return k_buf[:, :, :need], v_buf[:, :, :need]


@dataclass(frozen=True)
class KVState:
    """One request's KV cache: row ``row`` of ``buffers``, token columns ``[start, end)``."""

    buffers: _Buffers
    row: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.buffers.keys[index], self.buffers.values[index]
        assert k is not None and v is not None
        return (
            k[self.row : self.row + 1, :, self.start : self.end],
            v[self.row : self.row + 1, :, self.start : self.end],
        )

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.layer(i) for i in range(len(self.buffers.keys))]

    @property
    def owns_tail(self) -> bool:
        """True if appending in place cannot clobber anyone (no other branch wrote past us)."""
        return self.end == self.buffers.length and all(
            n == self.buffers.length for n in self.buffers.lengths
        )


def _state_from_layers(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> KVState:
    """A fresh single-row state holding copies of per-layer ``[1, heads, n, dim]`` tensors."""
    buffers = _Buffers(len(layers), rows=1)
    for i, (k, v) in enumerate(layers):
        buffers.write(i, k, v)
    return KVState(buffers, 0, 0, layers[0][0].shape[2])


class WeightLoadError(ValueError):
    """New weights cannot be loaded (missing files, unknown or missing tensors, wrong shapes)."""


@dataclass
class SamplingState:
    """Per-request sampling configuration in the form the sampler needs."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    greedy: bool
    generator: torch.Generator | None = None


def _hf_cache(buffers: _Buffers) -> Any:
    """A transformers DynamicCache whose layers append into ``buffers`` in place."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class _BufferLayer(DynamicLayer):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index
            k, v = buffers.keys[index], buffers.values[index]
            if k is not None and v is not None:
                self.is_initialized = True
                self.device = k.device
                self.keys = k[:, :, : buffers.lengths[index]]
                self.values = v[:, :, : buffers.lengths[index]]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            self.is_initialized = True
            self.device = key_states.device
            self.keys, self.values = buffers.write(self.index, key_states, value_states)
            return self.keys, self.values

    cache = DynamicCache()
    cache.layers.extend(_BufferLayer(i) for i in range(len(buffers.keys)))
    return cache


class ModelRunner:
    """Owns the transformers model; all methods must be called from the engine thread."""

    def __init__(self, model_dir: str | Path, threads: int = 1) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        torch.set_num_threads(max(1, threads))
        self.model_dir = str(Path(model_dir).resolve())
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.eval()
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        self.context_length = int(getattr(self.config, "max_position_embeddings", 32768))
        eos: set[int] = set()
        try:
            gen = GenerationConfig.from_pretrained(self.model_dir)
            eos.update(_as_ids(gen.eos_token_id))
        except OSError:
            pass
        eos.update(_as_ids(getattr(self.config, "eos_token_id", None)))
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(eos)
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self._tied_keys = {"lm_head.weight"} if tied else set()
        self.num_layers = int(self.config.num_hidden_layers)

    # ----------------------------------------------------------------------------- forward

    @torch.inference_mode()
    def prefill(
        self, tokens: list[int], prefix: KVState | None, logits_from: int
    ) -> tuple[KVState, torch.Tensor]:
        """Run the prompt; return its KV state and float32 logits for positions >= logits_from.

        ``prefix`` covers ``tokens[:prefix.length]`` already; ``logits_from`` must be >= that
        length and < len(tokens). The last returned row predicts the first output token.
        """
        done = 0 if prefix is None else prefix.length
        if not done <= logits_from < len(tokens):
            raise ValueError(f"bad prefill range: cached {done}, logits from {logits_from}")
        if prefix is None:
            buffers = _Buffers(self.num_layers, rows=1)
        elif prefix.buffers.rows == 1 and prefix.start == 0 and prefix.owns_tail:
            buffers = prefix.buffers
        else:
            buffers = _state_from_layers(prefix.layers()).buffers
        out = self.model(
            input_ids=torch.tensor([tokens[done:]], dtype=torch.long),
            cache=_hf_cache(buffers),
            use_cache=True,
            position_ids=torch.arange(done, len(tokens), dtype=torch.long).unsqueeze(0),
        )
        logits = out.logits[0, logits_from - done :].float()
        return KVState(buffers, 0, 0, len(tokens)), logits

    @torch.inference_mode()
    def decode(self, batch: list[tuple[KVState, int]]) -> list[tuple[KVState, torch.Tensor]]:
        """One decode step for each ``(state, new_token)``; return new states and next logits.

        If the states are exactly the rows of one buffer set, in order, and own its tail (the
        previous step of the same batch), the step appends in place; otherwise the caches are
        copied, right-aligned, into a new buffer set.
        """
        states = [state for state, _ in batch]
        first = states[0].buffers
        in_place = first.rows == len(states) and all(
            s.buffers is first and s.row == row and s.owns_tail for row, s in enumerate(states)
        )
        if in_place:
            buffers = first
            starts = [s.start for s in states]
        else:
            width = max(s.length for s in states)
            buffers = _Buffers(self.num_layers, rows=len(states))
            starts = [width - s.length for s in states]
            for layer in range(self.num_layers):
                k_first, _ = states[0].layer(layer)
                shape = (len(states), k_first.shape[1], width, k_first.shape[3])
                keys = torch.zeros(shape, dtype=k_first.dtype)
                values = torch.zeros(shape, dtype=k_first.dtype)
                for row, state in enumerate(states):
                    k, v = state.layer(layer)
                    keys[row, :, starts[row] :] = k[0]
                    values[row, :, starts[row] :] = v[0]
                buffers.write(layer, keys, values)
        width = buffers.length
        lengths = [width - start for start in starts]
        mask = None
        if any(starts):
            mask = torch.zeros((len(states), width + 1), dtype=torch.long)
            for row, start in enumerate(starts):
                mask[row, start:] = 1
        out = self.model(
            input_ids=torch.tensor([[token] for _, token in batch], dtype=torch.long),
            attention_mask=mask,
            cache=_hf_cache(buffers),
            use_cache=True,
            position_ids=torch.tensor([[n] for n in lengths], dtype=torch.long),
        )
        logits = out.logits[:, -1].float()
        return [
            (KVState(buffers, row, start, width + 1), logits[row])
            for row, start in enumerate(starts)
        ]

    # ----------------------------------------------------------------------------- sampling

    @staticmethod
    def reported_logprobs(
        logits: torch.Tensor, state: SamplingState, original: bool
    ) -> torch.Tensor:
        """Log-probabilities as SGLang reports them.

        SGLang's sampler reports ``log_softmax(logits / temperature)`` -- after temperature
        scaling, before top-k/top-p/min-p filtering -- and ``log_softmax(logits)`` for greedy
        requests (it treats temperature ~0 as temperature 1 with top_k 1). With
        ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (here ``original``) it reports the raw
        ``log_softmax(logits)`` always. The reference engine does the same.
        """
        if original or state.greedy or state.temperature == 1.0:
            return torch.log_softmax(logits, dim=-1)
        return torch.log_softmax(logits / state.temperature, dim=-1)

    @staticmethod
    def reported_logprobs_batch(
        logits: torch.Tensor, states: list[SamplingState], original: bool
    ) -> torch.Tensor:
        """:meth:`reported_logprobs` for the rows of ``logits`` ([N, vocab]) at once."""
        temps = [1.0 if original or s.greedy else s.temperature for s in states]
        if all(t == 1.0 for t in temps):
            return torch.log_softmax(logits, dim=-1)
        return torch.log_softmax(logits / torch.tensor(temps).unsqueeze(1), dim=-1)

    @staticmethod
    def choose_batch(
        logits: torch.Tensor,
        reported: torch.Tensor,
        states: list[SamplingState],
        original: bool,
        forced: list[int | None],
    ) -> list[int]:
        """Next token of every row: forced (scripted), greedy, or sampled.

        Rows without top-k/top-p/min-p filters are sampled together by inverse CDF over the
        reported (temperature-scaled) distribution -- a handful of tensor ops for the whole
        batch instead of several per row; each row still draws from its own generator.
        """
        tokens: list[int | None] = list(forced)
        greedy: list[int] = []
        plain: list[int] = []
        vocab = logits.shape[-1]
        for row, state in enumerate(states):
            if tokens[row] is not None:
                continue
            if state.greedy:
                greedy.append(row)
            elif (
                not original
                and (state.top_k < 1 or state.top_k >= vocab)
                and state.top_p >= 1.0
                and state.min_p <= 0.0
            ):
                plain.append(row)
            else:
                tokens[row] = ModelRunner.sample(logits[row], state)
        if greedy:
            picks = torch.argmax(logits[greedy], dim=-1).tolist()
            for row, token in zip(greedy, picks, strict=True):
                tokens[row] = int(token)
        if plain:
            weights = torch.exp(reported[plain])
            cdf = torch.cumsum(weights, dim=-1)
            uniform = torch.stack([torch.rand((), generator=states[r].generator) for r in plain])
            targets = (uniform * cdf[:, -1]).unsqueeze(1)
            picks = torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp(max=vocab - 1)
            for i, (row, token) in enumerate(zip(plain, picks.tolist(), strict=True)):
                if weights[i, token] <= 0:  # rounding put the target on the very end
                    token = int(torch.nonzero(weights[i] > 0)[-1].item())
                tokens[row] = int(token)
        return [int(t) for t in tokens]  # type: ignore[arg-type]

    @staticmethod
    def sample(logits: torch.Tensor, state: SamplingState) -> int:
        """Draw a token the way SGLang's torch sampler does (filters on the sorted probs)."""
        if state.greedy:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / state.temperature, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        if 0 < state.top_k < sorted_probs.shape[-1]:
            sorted_probs[state.top_k :] = 0.0
        if state.top_p < 1.0:
            sorted_probs[(cumulative - sorted_probs) > state.top_p] = 0.0
        if state.min_p > 0.0:
            sorted_probs[sorted_probs < sorted_probs[0] * state.min_p] = 0.0
        return int(order[_draw(sorted_probs, state.generator)].item())

    # ----------------------------------------------------------------------------- weights

    def read_weights(self, model_path: str) -> dict[str, torch.Tensor]:
        """Read and check new weights (any thread); apply them with :meth:`apply_weights`."""
        from safetensors.torch import load_file

        path = Path(model_path)
        if path.is_dir():
            files = sorted(path.glob("*.safetensors"))
        elif path.is_file() and path.suffix == ".safetensors":
            files = [path]
        else:
            raise WeightLoadError(
                f"model_path {model_path!r} is not a directory or .safetensors file"
            )
        if not files:
            raise WeightLoadError(f"no *.safetensors files in {model_path!r}")
        tensors: dict[str, torch.Tensor] = {}
        for file in files:
            try:
                tensors.update(load_file(str(file), device="cpu"))
            except Exception as exc:  # safetensors raises several error types
                raise WeightLoadError(f"cannot read {file}: {exc}") from exc
        expected = {k: v for k, v in self._checkpoint().items() if k not in self._tied_keys}
        unknown = sorted(set(tensors) - set(expected) - self._tied_keys)
        missing = sorted(set(expected) - set(tensors))
        if unknown or missing:
            raise WeightLoadError(
                f"weights in {model_path!r} do not fit the served model: "
                f"unknown {unknown[:5]}, missing {missing[:5]}"
            )
        for name, tensor in tensors.items():
            if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
                raise WeightLoadError(
                    f"tensor {name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(expected[name].shape)}"
                )
            if not torch.is_floating_point(tensor) or not torch.isfinite(tensor).all():
                raise WeightLoadError(f"tensor {name} is not a finite floating-point tensor")
        return tensors

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the tensors a weight update may name (tied aliases excluded)."""
        return {
            name: tuple(tensor.shape)
            for name, tensor in self._checkpoint().items()
            if name not in self._tied_keys
        }

    def weight_by_name(self, name: str) -> torch.Tensor | None:
        """The tensor under its checkpoint name (None if the model has none of that name)."""
        return self._checkpoint().get(name)

    def _checkpoint(self) -> dict[str, torch.Tensor]:
        """The model's tensors under checkpoint names (a MoE's experts one matrix each, as
        views of the fused parameters: copying into them updates the model in place)."""
        return checkpoint_tensors(self.model.state_dict())

    @torch.inference_mode()
    def apply_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        state = self._checkpoint()
        for name, tensor in tensors.items():
            if name in state and name not in self._tied_keys:
                state[name].copy_(tensor.to(torch.float32))


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """Index drawn with probability proportional to ``weights`` (inverse CDF).

    ``torch.multinomial`` costs ~0.5 ms per draw on the CPU for a 2k vocabulary; one uniform
    number and a binary search over the cumulative sum cost a few microseconds. Zero-weight
    entries are never drawn (their CDF interval is empty).
    """
    cdf = torch.cumsum(weights, dim=0)
    u = torch.rand((), generator=generator) * cdf[-1]
    index = int(torch.searchsorted(cdf, u, right=True).item())
    if index >= weights.shape[0] or weights[index] <= 0:  # u hit the total exactly (rounding)
        index = int(torch.nonzero(weights > 0)[-1].item())
    return index


def _as_ids(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return []


@dataclass
class _CacheEntry:
    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # own contiguous [1, heads, n, dim] copies


@dataclass
class PrefixCache:
    """A small LRU of finished sequences' KV caches, reused by requests sharing a prefix.

    It gives multi-turn trajectories the prefix reuse SGLang's radix cache gives them (reported as
    ``cached_tokens``), bounded by a token budget. A hit is always shorter than the new prompt so
    that the prompt's last position is computed afresh.
    """

    max_tokens: int = 131072
    _entries: OrderedDict[int, _CacheEntry] = field(default_factory=OrderedDict)
    _next_key: int = 0
    _tokens: int = 0

    def lookup(self, tokens: list[int], limit: int) -> tuple[int, KVState | None]:
        """Longest cached prefix of ``tokens`` (at most ``limit`` tokens), as a fresh copy."""
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = _common_prefix(entry.tokens, tokens, min(limit, len(entry.tokens)))
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None or best_len == 0:
            return 0, None
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        return best_len, _state_from_layers(
            [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in entry.layers]
        )

    def insert(self, tokens: list[int], state: KVState) -> None:
        """Remember ``state`` (which covers ``tokens[:state.length]``) for later prefixes."""
        if self.max_tokens <= 0 or state.length > self.max_tokens or state.length == 0:
            return
        tokens_t = tuple(tokens[: state.length])
        # Own copies: a state is a view into buffers that may be shared by a whole batch.
        layers = [(k.clone(), v.clone()) for k, v in state.layers()]
        # Drop entries that are prefixes of the new one: the new one serves them as well.
        for key in [k for k, e in self._entries.items() if tokens_t[: len(e.tokens)] == e.tokens]:
            self._tokens -= len(self._entries.pop(key).tokens)
        self._entries[self._next_key] = _CacheEntry(tokens_t, layers)
        self._next_key += 1
        self._tokens += len(tokens_t)
        while self._tokens > self.max_tokens and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self._tokens -= len(dropped.tokens)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)


def _common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    n = 0
    limit = min(limit, len(a), len(b))
    # Compare in blocks first (fast path for long shared histories), then token by token.
    block = 256
    while n + block <= limit and list(a[n : n + block]) == b[n : n + block]:
        n += block
    while n < limit and a[n] == b[n]:
        n += 1
    return n
