"""The data cursor: prompt ``i`` of a run is a pure function of ``(ids, seed, i)``.

Epoch ``e = i // len(ids)`` is a permutation of the instance ids seeded by ``(seed, e)``
(or the file order without shuffling); the cursor is the number of prompts drawn so far. A
resumed run restores the cursor and draws exactly what the dead run would have drawn next.

A mixture (``train.dataset.mixture``) is drawn by :class:`MixtureCursor` over the mixture's
seeded sampler (services/datasets/mixture.py): its position is the same checkpointed number
(draws so far), and a resumed run replays the sampler to it, so it continues the same sequence.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path

from services.datasets.denylist import load_denylist
from services.datasets.loader import DatasetError, load_instances
from services.datasets.mixture import MixtureEntry, MixtureSampler, load_mixture, parse_mixture
from services.datasets.overlap import find_overlaps
from trainer.checkpoint import CheckpointError
from trainer.loop.config import DatasetConfig, EvalSet

log = logging.getLogger("swerl.trainer.prompts")


def load_instance_ids(config: DatasetConfig | EvalSet, section: str = "dataset") -> list[str]:
    """``toy_prompts``' ids, ``instance_ids``, then the non-empty lines of ``instances_file``,
    less the ids on the ``deny_file`` deny-list; duplicates are an error, so is a list that the
    deny-list empties (``section`` names the config section in the messages)."""
    ids = config.toy_prompts.ids() if config.toy_prompts is not None else []
    ids += config.instance_ids
    if config.instances_file:
        path = Path(config.instances_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{section}.instances_file {path}: {exc.strerror}") from exc
        ids.extend(line.strip() for line in text.splitlines() if line.strip())
    seen: set[str] = set()
    for instance_id in ids:
        if instance_id in seen:
            raise ValueError(f"{section}: instance id {instance_id!r} is listed twice")
        seen.add(instance_id)
    if not ids:
        raise ValueError(f"{section}: no instance ids")
    if config.deny_file:
        ids = _without_denied(ids, config.deny_file, section)
    return ids


def _without_denied(ids: list[str], deny_file: str, section: str) -> list[str]:
    """``ids`` without those on the deny-list, each one left out logged with its reason."""
    try:
        denied = load_denylist(deny_file)
    except DatasetError as exc:
        raise ValueError(f"{section}.deny_file: {exc}") from exc
    kept = [i for i in ids if i not in denied]
    for instance_id in ids:
        if instance_id in denied:
            reason = denied[instance_id] or "no reason given"
            log.warning("%s: %s left out, on the deny-list %s (%s)", section, instance_id,
                        deny_file, reason)  # fmt: skip
    if not kept:
        raise ValueError(f"{section}: every instance id is on the deny-list {deny_file}")
    return kept


class PromptCursor:
    """Draws prompts in seeded shuffled epochs; ``position`` is the checkpointed cursor."""

    def __init__(self, ids: list[str], seed: int = 0, shuffle: bool = True) -> None:
        if not ids:
            raise ValueError("a prompt cursor needs at least one instance id")
        self.ids = list(ids)
        self.seed = seed
        self.shuffle = shuffle
        self.position = 0
        self._epoch: tuple[int, list[str]] | None = None

    def _order(self, epoch: int) -> list[str]:
        if self._epoch is None or self._epoch[0] != epoch:
            order = list(self.ids)
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epoch = (epoch, order)
        return self._epoch[1]

    @property
    def epoch(self) -> int:
        return self.position // len(self.ids)

    def fingerprint(self) -> str:
        """What the sequence of prompts depends on (ids in order, seed, shuffle), hashed: a
        checkpoint's cursor means the same prompts only under the same fingerprint."""
        return _digest({"ids": self.ids, "seed": self.seed, "shuffle": self.shuffle})

    def take(self, count: int) -> list[str]:
        """The next ``count`` prompts (crossing epochs as needed)."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        out = []
        for _ in range(count):
            epoch, index = divmod(self.position, len(self.ids))
            out.append(self._order(epoch)[index])
            self.position += 1
        return out


class MixtureCursor:
    """:class:`PromptCursor`'s interface over a mixture's sampler: prompts are entry keys
    (``<dataset>/<instance_id>``); setting ``position`` replays the sampler to it."""

    def __init__(self, sampler: MixtureSampler) -> None:
        self.sampler = sampler
        self.ids = [entry.key for entry in sampler.entries]

    @property
    def position(self) -> int:
        return self.sampler.position

    @position.setter
    def position(self, value: int) -> None:
        self.sampler.seek(value)

    def take(self, count: int) -> list[str]:
        """The next ``count`` prompts."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        return [entry.key for entry in self.sampler.draw(count)]

    def fingerprint(self) -> str:
        """:meth:`PromptCursor.fingerprint` of a mixture: its parts' names and weights, the
        entries left after the deny-list and overlap check, and the seed."""
        return _digest({"parts": self.sampler.parts(), "ids": self.ids, "seed": self.sampler.seed})


def same_dataset(checkpoint: Path, saved: object, mine: str, on_change: str) -> bool:
    """Whether a checkpoint's data cursor applies to this run's dataset (fingerprint ``mine``).

    The cursor counts draws of one dataset: under another (ids, files, weights, seed, shuffle,
    deny-list) it would continue a sequence the dead run never drew. A changed dataset is an
    error, or with ``on_change: restart`` False (draw the new dataset from its start).
    ``saved`` None: a checkpoint from before fingerprints, taken as the same."""
    if saved is None or saved == mine:
        return True
    if on_change == "restart":
        log.warning(
            "train.dataset changed since %s (fingerprint %s, now %s): the prompt sequence "
            "starts again from the new dataset's first draw", checkpoint, saved, mine,
        )  # fmt: skip
        return False
    raise CheckpointError(
        f"{checkpoint}: its prompts were drawn from another train.dataset (fingerprint "
        f"{saved}, now {mine}: the ids, files, weights, seed, shuffle or deny-list changed); "
        "resume with the same dataset, or set train.dataset.on_change: restart to draw the "
        "new dataset from its start"
    )


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def make_cursor(config: DatasetConfig) -> PromptCursor | MixtureCursor:
    """The run's prompt cursor: over the mixture when one is set, else over the instance ids
    (ValueError naming the file, line and field of a bad row, or what is wrong)."""
    if not config.mixture:
        return PromptCursor(load_instance_ids(config), config.seed, config.shuffle)
    try:
        mixture = parse_mixture(config.mixture)
        sampler = MixtureSampler(mixture, config.seed, load_mixture_entries(config))
    except DatasetError as exc:
        raise ValueError(f"dataset.mixture: {exc}") from exc
    return MixtureCursor(sampler)


def load_mixture_entries(config: DatasetConfig) -> dict[str, list[MixtureEntry]]:
    """Every entry of ``config.mixture`` (files loaded strictly), less those on the deny-list
    (by instance id) and those overlapping ``overlap_eval``, each one left out logged."""
    loaded = load_mixture(parse_mixture(config.mixture))
    if config.deny_file:
        try:
            denied = load_denylist(config.deny_file)
        except DatasetError as exc:
            raise DatasetError(f"deny_file: {exc}") from exc

        def deny_line(entry: MixtureEntry) -> str | None:  # by its key, or by its plain id
            return next((k for k in (entry.key, entry.instance.instance_id) if k in denied), None)

        for entry in (e for entries in loaded.values() for e in entries):
            line = deny_line(entry)
            if line is not None:
                log.warning("dataset: %s left out, on the deny-list %s (%s)", entry.key,
                            config.deny_file, denied[line] or "no reason given")  # fmt: skip
        loaded = _keep(loaded, lambda e: deny_line(e) is None)
    if config.overlap_eval:
        evaluation = load_instances(config.overlap_eval)
        flat = [e for entries in loaded.values() for e in entries]
        report = find_overlaps(flat, evaluation, config.overlap_threshold)
        overlapping = {o.train_key for o in report.overlaps}
        for o in report.overlaps:
            log.warning("dataset: %s left out, %s of %s in %s (similarity %.2f)", o.train_key,
                        o.kind, o.eval_id, config.overlap_eval, o.similarity)  # fmt: skip
        loaded = _keep(loaded, lambda e: e.key not in overlapping)
    return loaded


def _keep(
    loaded: dict[str, list[MixtureEntry]], keep: Callable[[MixtureEntry], bool]
) -> dict[str, list[MixtureEntry]]:
    return {name: [e for e in entries if keep(e)] for name, entries in loaded.items()}
