"""A weighted mixture of dataset files and a deterministic, seeded sampler over it.

The paper trains on a mixture of SWE-Gym and SWE-smith; a mixture is written as
``--dataset swe-gym.parquet:0.5,swe-smith.jsonl:0.5``: comma-separated ``[name=]path[:weight]``
parts. The name (default: the file's stem) namespaces instance ids, because two datasets may
reuse one (``<name>/<instance_id>`` is the mixture key); the weight (default 1) is relative:
weights are normalised to sum to 1. Nothing is fetched: every path must be an existing local
file in a supported format, and any error names the part it comes from.

Sampling: each draw picks a dataset with probability equal to its weight, then the next
instance of that dataset's shuffled order (every instance once per pass, reshuffled for the
next pass). The picks and each dataset's order come from ``random.Random`` seeded by the seed
(and the dataset's name), so the same seed and files give the same sequence on every machine;
``MixtureSampler.position`` counts the draws, and a sampler built again and moved to a position
(:meth:`MixtureSampler.seek`) continues exactly the sequence (a training run's resumed cursor).

Training on a mixture: ``train.dataset.mixture`` (``swerl submit train --dataset SPEC``), the
worker's ``worker.rollout.datasets``; a request names ``<dataset>/<instance_id>`` keys.
"""

from __future__ import annotations

import argparse
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.datasets.loader import SUFFIXES, DatasetError, load_instances
from services.protocol.ids import DATASET_NAME_PATTERN as _NAME_PATTERN
from services.protocol.instance import SWEInstance

DATASET_NAME_PATTERN = re.compile(_NAME_PATTERN)


@dataclass(frozen=True)
class MixturePart:
    """One dataset file of a mixture; ``weight`` is already normalised."""

    name: str
    path: Path
    weight: float


@dataclass(frozen=True)
class DatasetMixture:
    """The parsed ``--dataset`` value: parts with unique names and weights summing to 1."""

    parts: tuple[MixturePart, ...]


@dataclass(frozen=True)
class MixtureEntry:
    """An instance of a mixture; ``key`` (``<dataset>/<instance_id>``) is unique across it."""

    dataset: str
    instance: SWEInstance

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.instance.instance_id}"


def parse_mixture(spec: str, *, check_files: bool = True) -> DatasetMixture:
    """``[name=]path[:weight],...`` -> a validated :class:`DatasetMixture` (or DatasetError);
    ``check_files=False`` checks the syntax only (where the files are read on another host)."""
    raw_parts = [part.strip() for part in spec.split(",")]
    if not spec.strip() or any(not part for part in raw_parts):
        raise DatasetError(f"dataset mixture {spec!r}: empty part (use path[:weight],...)")
    named = [_parse_part(part, check_files) for part in raw_parts]
    _check_unique(named, check_files)
    total = math.fsum(weight for _, _, weight in named)
    return DatasetMixture(
        tuple(MixturePart(name, path, weight / total) for name, path, weight in named)
    )


def mixture_argument(value: str) -> DatasetMixture:
    """``argparse`` ``type=`` for ``--dataset``: a bad value is a usage error (exit 2)."""
    try:
        return parse_mixture(value)
    except DatasetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def is_mixture_spec(value: str) -> bool:
    """Whether ``value`` is a mixture (some part names a dataset file: ``.jsonl``, ``.json``,
    ``.parquet``, maybe with a weight) rather than a file of instance ids."""
    for part in value.split(","):
        path = part.split("=", 1)[-1].strip()
        head, sep, tail = path.rpartition(":")
        if sep and not tail.endswith(SUFFIXES):
            path = head
        if path.lower().endswith(SUFFIXES):
            return True
    return False


def _parse_part(part: str, check_files: bool = True) -> tuple[str, Path, float]:
    name: str | None = None
    if "=" in part:
        name, part = (piece.strip() for piece in part.split("=", 1))
    path_text, weight = part, 1.0
    head, sep, tail = part.rpartition(":")
    if sep and not tail.endswith(SUFFIXES):  # a ':' in a path is kept when no weight follows
        path_text = head
        try:
            weight = float(tail)
        except ValueError:
            raise DatasetError(f"dataset {part!r}: weight {tail!r} is not a number") from None
    if not math.isfinite(weight) or weight <= 0:
        raise DatasetError(f"dataset {part!r}: weight must be a positive number, got {tail!r}")
    path = Path(path_text)
    if path.suffix.lower() not in SUFFIXES:
        raise DatasetError(
            f"dataset {part!r}: unsupported dataset format (use one of {', '.join(SUFFIXES)})"
        )
    if check_files and not path.is_file():
        raise DatasetError(f"dataset {part!r}: no such dataset file {str(path)!r}")
    name = path.stem if name is None else name
    if not DATASET_NAME_PATTERN.match(name):
        raise DatasetError(
            f"dataset {part!r}: name {name!r} must match {DATASET_NAME_PATTERN.pattern} "
            "(give one with name=path)"
        )
    return name, path, weight


def _check_unique(named: list[tuple[str, Path, float]], check_files: bool = True) -> None:
    names: dict[str, Path] = {}
    files: dict[Path, str] = {}
    for name, path, _ in named:
        if name in names:
            raise DatasetError(
                f"dataset name {name!r} is used for both {str(names[name])!r} and "
                f"{str(path)!r} (name them: a={names[name]},b={path})"
            )
        resolved = path.resolve() if check_files else path
        if resolved in files:
            raise DatasetError(f"dataset file {str(path)!r} is given twice")
        names[name], files[resolved] = path, name


def load_mixture(mixture: DatasetMixture) -> dict[str, list[MixtureEntry]]:
    """Every part's instances (each file loaded strictly), by dataset name."""
    return {
        part.name: [MixtureEntry(part.name, inst) for inst in load_instances(part.path)]
        for part in mixture.parts
    }


class MixtureSampler:
    """Draws entries of a loaded mixture: dataset by weight, then a per-dataset shuffled pass.

    ``loaded`` (default: every part's file, loaded strictly) lets a caller leave entries out
    first (a deny-list, a contamination check); every part must keep at least one entry.
    """

    def __init__(
        self,
        mixture: DatasetMixture,
        seed: int,
        loaded: dict[str, list[MixtureEntry]] | None = None,
    ) -> None:
        loaded = load_mixture(mixture) if loaded is None else loaded
        self._names = [part.name for part in mixture.parts]
        empty = [name for name in self._names if not loaded.get(name)]
        if empty:
            raise DatasetError(f"dataset mixture: no instances left in {', '.join(empty)}")
        self._weights = [part.weight for part in mixture.parts]
        self._loaded = {name: list(loaded[name]) for name in self._names}
        self.seed = seed
        self.position = 0
        self._restart()

    def _restart(self) -> None:
        self._pick = random.Random(f"swerl-mixture:{self.seed}")
        self._orders = {n: _passes(self._loaded[n], self.seed, n) for n in self._names}
        self.position = 0

    def parts(self) -> list[tuple[str, float]]:
        """``(name, normalised weight)`` of every part, in the mixture's order."""
        return list(zip(self._names, self._weights, strict=True))

    @property
    def entries(self) -> list[MixtureEntry]:
        """Every entry that can be drawn, part by part."""
        return [entry for name in self._names for entry in self._loaded[name]]

    def draw(self, count: int) -> list[MixtureEntry]:
        """The next ``count`` entries of the sequence."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        out = []
        for _ in range(count):  # one pick per draw: the sequence does not depend on batching
            name = self._pick.choices(self._names, weights=self._weights)[0]
            out.append(next(self._orders[name]))
        self.position += count
        return out

    def seek(self, position: int) -> None:
        """Continue the sequence after its first ``position`` draws (replayed from the seed)."""
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        if position < self.position:
            self._restart()
        self.draw(position - self.position)


def _passes(entries: list[MixtureEntry], seed: int, name: str) -> Iterator[MixtureEntry]:
    shuffle = random.Random(f"swerl-mixture:{seed}:{name}")
    while True:
        order = list(entries)
        shuffle.shuffle(order)
        yield from order
