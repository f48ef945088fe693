"""Named registries of advantage estimators, policy losses and algorithms.

:func:`~trainer.algorithms.objectives.compute_objective` looks an algorithm up by name, and a
composed algorithm looks its estimator and policy loss up by name, so a new baseline is a
module that registers itself (``@ESTIMATORS.register("name")``, ``@POLICY_LOSSES.register``,
:func:`~trainer.algorithms.objectives.register_composed`), not an edit of a dispatch chain.
Modules placed in :mod:`trainer.algorithms.baselines` are imported with the package.
An unknown name is a ``ValueError`` that lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable


class Registry[T]:
    """Name -> entry, filled by ``register``; ``kind`` names the entries in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator adding ``entry`` under ``name``; a second entry for a name is an error
        unless ``replace`` (so two modules cannot silently shadow each other)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(entry: T) -> T:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test that registered a temporary entry cleans up with this)."""
        self.get(name)
        del self._entries[name]

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries
