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

The registry of one's own task sets (``python -m sandbox_worker.images add|list|remove``) is
that directory: ``<name>.jsonl`` (the valid rows, what workers read) and ``<name>.json`` (a
:class:`TaskSetManifest`: the source file and every image ``add`` built, what ``remove``
deletes). One naming rule for a set ``<name>``: its keys are ``<name>/<instance_id>``
(:func:`task_set_key`) and its images ``swerl/<name>/sweb.eval.<arch>.<id>:latest``
(:func:`sandbox_worker.images.local_image`); a reference to a set is its name or its file
(:func:`resolve_task_set`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from sandbox_worker import image_pull, images
from services.datasets import DatasetError, load_instances
from services.datasets.mixture import DATASET_NAME_PATTERN, parse_mixture
from services.protocol.instance import SWEInstance

ImageRule = Literal["local", "swebench", "swegym", "swesmith"]
TASK_SETS = "tasksets"
MANIFEST_SUFFIX = ".json"


class TaskSetError(ValueError):
    """A task-set reference or registry entry that cannot be used (the message says why)."""


class TaskSetManifest(BaseModel):
    """What ``images add`` registered for a set: ``<dir>/<name>.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str  # the --instances file the rows came from
    images: tuple[str, ...]  # every image the add built (valid instances or not)
    valid: int  # rows in <name>.jsonl (0: no rows file, nothing for a worker)


def task_set_key(name: str, instance_id: str) -> str:
    """The key a request names an instance of set ``name`` by: ``<name>/<instance_id>``."""
    return f"{name}/{instance_id}"


def rows_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.jsonl"


def manifest_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{MANIFEST_SUFFIX}"


def write_manifest(directory: Path, manifest: TaskSetManifest) -> Path:
    """Register ``manifest`` in ``directory`` (created if absent); returns its file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = manifest_path(directory, manifest.name)
    path.write_text(manifest.model_dump_json(indent=1) + "\n")
    return path


def read_manifest(directory: Path, name: str) -> TaskSetManifest | None:
    """The manifest of set ``name`` (None when the set has none, e.g. a copied rows file)."""
    path = manifest_path(directory, name)
    try:
        return TaskSetManifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        raise TaskSetError(f"unreadable task-set manifest {path}: {exc}") from exc


def registered_sets(directory: Path) -> list[str]:
    """Names of the sets registered in ``directory``: a rows file or a manifest."""
    if not directory.is_dir():
        return []
    names = {p.stem for p in directory.glob(f"*{MANIFEST_SUFFIX}")} | set(task_set_files(directory))
    return sorted(n for n in names if DATASET_NAME_PATTERN.match(n))


def unregister(directory: Path, name: str) -> bool:
    """Delete set ``name``'s rows file and manifest; False when there was neither."""
    removed = False
    for path in (rows_path(directory, name), manifest_path(directory, name)):
        if path.is_file():
            path.unlink()
            removed = True
    return removed


def known_sets_hint(directory: Path) -> str:
    known = registered_sets(directory)
    listed = ", ".join(known) if known else "none"
    return (
        f"registered task sets in {directory}: {listed} (add one: python -m "
        "sandbox_worker.images add --instances FILE --name NAME)"
    )


def resolve_task_set(ref: str, directory: Path) -> tuple[str, Path] | None:
    """``ref`` -> (set name, rows file) when it names a set registered in ``directory`` (its
    name, or the path of its rows file); None when ``ref`` is some other existing file;
    :class:`TaskSetError` (listing the known sets) when it is neither."""
    files = task_set_files(directory)
    if ref in files:
        return ref, files[ref]
    path = Path(ref).expanduser()
    if path.is_file():
        for name, file in files.items():
            if file.resolve() == path.resolve():
                return name, file
        return None
    if DATASET_NAME_PATTERN.match(ref) and manifest_path(directory, ref).is_file():
        raise TaskSetError(f"task set {ref!r} has no valid instances (its add validated none)")
    raise TaskSetError(f"{ref!r} is neither a file nor a task set; {known_sets_hint(directory)}")


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
        task_set_key(name, inst.instance_id): inst
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
