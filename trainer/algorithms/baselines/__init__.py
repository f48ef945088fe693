"""Baselines that register themselves: every module in this package is imported with
:mod:`trainer.algorithms`, so adding a baseline is adding a file here.

A module registers what it adds, for example a critic-free baseline built from a new
estimator and an existing policy loss::

    from trainer.algorithms.components import ESTIMATORS, Estimate
    from trainer.algorithms.objectives import register_composed

    @ESTIMATORS.register("rloo")
    def rloo_estimate(batch, config, all_reduce=None) -> Estimate: ...

    register_composed("rloo", estimator="rloo", policy_loss="ppo_clip")

after which ``compute_objective("rloo", batch)`` runs it. A whole algorithm with a critic
registers an :class:`~trainer.algorithms.objectives.AlgorithmEntry` in
:data:`~trainer.algorithms.objectives.ALGORITHM_REGISTRY`.
"""

from __future__ import annotations

import importlib
import pkgutil


def import_baselines(package: str = __name__) -> list[str]:
    """Import every module of ``package`` (this one by default; each module registers
    itself) and return their names; names starting with ``_`` are skipped."""
    path = importlib.import_module(package).__path__
    names = sorted(
        info.name for info in pkgutil.iter_modules(path) if not info.name.startswith("_")
    )
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
