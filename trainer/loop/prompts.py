"""The data cursor: prompt ``i`` of a run is a pure function of ``(ids, seed, i)``.

Epoch ``e = i // len(ids)`` is a permutation of the instance ids seeded by ``(seed, e)``
(or the file order without shuffling); the cursor is the number of prompts drawn so far. A
resumed run restores the cursor and draws exactly what the dead run would have drawn next.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from services.datasets.denylist import load_denylist
from services.datasets.loader import DatasetError
from trainer.loop.config import DatasetConfig, EvalSettings

log = logging.getLogger("swerl.trainer.prompts")


def load_instance_ids(config: DatasetConfig | EvalSettings, section: str = "dataset") -> list[str]:
    """``instance_ids`` then the non-empty lines of ``instances_file``, less the ids on the
    ``deny_file`` deny-list; duplicates are an error, so is a list that the deny-list empties
    (``section`` names the config section in the messages)."""
    ids = list(config.instance_ids)
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
