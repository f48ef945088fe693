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
(and the dataset's name), so the same seed and files give the same sequence on every machine.
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
from services.protocol.instance import SWEInstance

DATASET_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$")


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


def parse_mixture(spec: str) -> DatasetMixture:
    """``[name=]path[:weight],...`` -> a validated :class:`DatasetMixture` (or DatasetError)."""
    raw_parts = [part.strip() for part in spec.split(",")]
    if not spec.strip() or any(not part for part in raw_parts):
        raise DatasetError(f"dataset mixture {spec!r}: empty part (use path[:weight],...)")
    named: list[tuple[str, Path, float]] = [_parse_part(part) for part in raw_parts]
    _check_unique(named)
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


def _parse_part(part: str) -> tuple[str, Path, float]:
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
    if not path.is_file():
        raise DatasetError(f"dataset {part!r}: no such dataset file {str(path)!r}")
    name = path.stem if name is None else name
    if not DATASET_NAME_PATTERN.match(name):
        raise DatasetError(
            f"dataset {part!r}: name {name!r} must match {DATASET_NAME_PATTERN.pattern} "
            "(give one with name=path)"
        )
    return name, path, weight


def _check_unique(named: list[tuple[str, Path, float]]) -> None:
    names: dict[str, Path] = {}
    files: dict[Path, str] = {}
    for name, path, _ in named:
        if name in names:
            raise DatasetError(
                f"dataset name {name!r} is used for both {str(names[name])!r} and "
                f"{str(path)!r} (name them: a={names[name]},b={path})"
            )
        resolved = path.resolve()
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
    """Draws entries of a loaded mixture: dataset by weight, then a per-dataset shuffled pass."""

    def __init__(self, mixture: DatasetMixture, seed: int) -> None:
        loaded = load_mixture(mixture)
        self._names = [part.name for part in mixture.parts]
        self._weights = [part.weight for part in mixture.parts]
        self._pick = random.Random(f"swerl-mixture:{seed}")
        self._orders = {name: _passes(loaded[name], seed, name) for name in self._names}

    def draw(self, count: int) -> list[MixtureEntry]:
        """The next ``count`` entries of the sequence."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        names = self._pick.choices(self._names, weights=self._weights, k=count)
        return [next(self._orders[name]) for name in names]


def _passes(entries: list[MixtureEntry], seed: int, name: str) -> Iterator[MixtureEntry]:
    shuffle = random.Random(f"swerl-mixture:{seed}:{name}")
    while True:
        order = list(entries)
        shuffle.shuffle(order)
        yield from order
