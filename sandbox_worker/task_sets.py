"""Namespaced task sets of a worker: ``<dataset>/<instance_id>`` keys to rows and images.

A training mixture (``train.dataset.mixture``, services/datasets/mixture.py) names its prompts
``<dataset>/<instance_id>``, because two datasets may reuse an id. A worker resolves such a key
with :func:`load_keyed_instances` over

* ``worker.rollout.datasets``: the same ``[name=]path[:weight],...`` spec as the mixture (the
  weights are ignored here), and
* the task-set directory (``worker.rollout.task_sets_dir``, default ``$SWERL_CACHE/tasksets``):
  every ``<name>.jsonl`` there is dataset ``<name>``; ``python -m sandbox_worker.images add``
  writes its validated task sets there, so a worker on that node knows them with nothing to
  set by hand.

The image of a key follows its dataset's rule (``worker.rollout.dataset_images``, name ->
rule; :func:`keyed_image`): ``local`` (the default) is the image swerl builds for the dataset,
``swerl/<dataset>/sweb.eval...`` (:func:`sandbox_worker.images.local_image`), so datasets never
collide; ``swebench`` / ``swegym`` / ``swesmith`` are that dataset's published images
(:func:`sandbox_worker.image_pull.image_name`; a SWE-smith row always gets SWE-smith's).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from sandbox_worker import image_pull, images
from services.datasets import DatasetError, load_instances
from services.datasets.mixture import DATASET_NAME_PATTERN, parse_mixture
from services.protocol.instance import SWEInstance

ImageRule = Literal["local", "swebench", "swegym", "swesmith"]
TASK_SETS = "tasksets"


def default_task_sets_dir() -> Path:
    """``$SWERL_CACHE/tasksets``: where ``images add`` writes task sets, the worker reads them."""
    return images.cache_dir() / TASK_SETS


def task_set_files(directory: Path) -> dict[str, Path]:
    """Dataset name -> file of every ``<name>.jsonl`` in ``directory`` (none if it is absent)."""
    if not directory.is_dir():
        return {}
    found = {}
    for path in sorted(directory.glob("*.jsonl")):
        if DATASET_NAME_PATTERN.match(path.stem):
            found[path.stem] = path
    return found


def load_keyed_instances(spec: str, directory: Path | None) -> dict[str, SWEInstance]:
    """``<dataset>/<instance_id>`` -> row for every dataset of ``spec`` and of ``directory``
    (DatasetError naming the file, line and field of a bad row, or a name given twice)."""
    files: dict[str, Path] = task_set_files(directory) if directory is not None else {}
    if spec:
        for part in parse_mixture(spec).parts:
            if part.name in files and files[part.name].resolve() != part.path.resolve():
                raise DatasetError(
                    f"dataset {part.name!r} is both {part.path} and the task set "
                    f"{files[part.name]} (rename one)"
                )
            files[part.name] = part.path
    return {
        f"{name}/{inst.instance_id}": inst
        for name, path in files.items()
        for inst in load_instances(path)
    }


def keyed_image(key: str, instance: SWEInstance, rules: Mapping[str, ImageRule]) -> str:
    """The image of a ``<dataset>/<instance_id>`` key by its dataset's rule (default local)."""
    dataset = key.rpartition("/")[0]
    rule = rules.get(dataset, "local")
    if rule == "local":
        return images.local_image(dataset.lower(), instance.instance_id)
    return image_pull.image_name(instance, rule)
