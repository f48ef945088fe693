"""Path confinement: every path a caller hands the services must lie under a configured root.

Why: the trainer and the evaluator act on a job's paths with their own privileges (read a
dataset or a model, write checkpoints). Without a check a caller could have them read
``/etc/shadow`` as a "dataset" or write checkpoints into ``/etc/cron.d``. The rule, one for
every feature that takes a path (job specs now, eval-input uploads next):

1. the value must be a non-empty absolute path without NUL bytes (a relative path would be
   resolved in the consumer's working directory, which the API cannot judge);
2. it is resolved with ``os.path.realpath``: ``..`` is collapsed and every symlink that exists
   here is followed, so ``/data/../etc`` and ``/data/link-to-etc`` are judged as ``/etc``;
3. the result must be one of the roots or below one, compared component by component
   (``/data2`` is not under ``/data``).

Inputs (read) may lie under the input roots or the output roots (a checkpoint written by a
train job is evaluated later); outputs (written) only under the output roots.

Which fields are paths is declared in the schemas (:func:`path_field` metadata, shown in
``/openapi.json`` as ``x-swerl-path``), so a new path field is confined by declaring it.

Limits (docs/api.md "Path roots"): the check runs on the API's host. Where the consumer runs
elsewhere (compose: another container) symlinks that exist only there are not seen here, so
the consumer should apply the same :class:`PathPolicy` before acting on a path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from services.api.config import PathRoots
from services.datasets.mixture import is_mixture_spec, parse_mixture

PATH_KEY = "x-swerl-path"


class Access(StrEnum):
    INPUT = "input"  # read by a service
    OUTPUT = "output"  # written by a service


class PathRefused(ValueError):
    """A path outside its roots, or not a usable path; ``field`` is the dotted field name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def path_field(
    access: Access, *, mixture: bool = False, literals: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``json_schema_extra`` marking a spec field as a path: how it is used (``access``),
    whether it may be a dataset mixture (``[name=]path[:weight],...``: each file checked),
    and the non-path words it also accepts (``gold``)."""
    return {PATH_KEY: {"access": access.value, "mixture": mixture, "literals": list(literals)}}


@dataclass(frozen=True)
class PathSpec:
    """A declared path field of a spec model."""

    name: str
    access: Access
    mixture: bool
    literals: tuple[str, ...]


def path_fields(model: type[BaseModel]) -> list[PathSpec]:
    """The fields of ``model`` declared with :func:`path_field`."""
    found = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        meta = extra.get(PATH_KEY) if isinstance(extra, dict) else None
        if isinstance(meta, dict):
            found.append(
                PathSpec(
                    name,
                    Access(str(meta["access"])),
                    bool(meta.get("mixture")),
                    tuple(str(w) for w in meta.get("literals") or ()),
                )
            )
    return found


def resolve(value: str) -> str:
    """``value`` resolved as the checks judge it (ValueError: not a usable absolute path)."""
    if not value:
        raise ValueError("is empty: give an absolute path")
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    if not os.path.isabs(value):
        raise ValueError(
            f"{value!r} is relative: give an absolute path as the trainer / evaluator sees it"
        )
    return os.path.realpath(value)


def within(path: str, root: str) -> bool:
    """Whether resolved ``path`` is ``root`` or below it, component-wise (both absolute and
    resolved; ``/data2`` is not within ``/data``)."""
    return os.path.commonpath([path, root]) == root


@dataclass(frozen=True)
class PathPolicy:
    """The configured roots (``api.paths``), and the check every caller-given path passes."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @classmethod
    def from_config(cls, roots: PathRoots) -> PathPolicy:
        return cls(tuple(roots.inputs), tuple(roots.outputs))

    def roots(self, access: Access) -> tuple[str, ...]:
        if access is Access.OUTPUT:
            return self.outputs
        return tuple(dict.fromkeys((*self.inputs, *self.outputs)))

    def check(self, value: str, access: Access, field: str) -> str:
        """The resolved path, or :class:`PathRefused` naming ``field`` and the roots."""
        roots = self.roots(access)
        try:
            resolved = resolve(value)
        except ValueError as exc:
            raise PathRefused(field, f"not a usable path: {exc}") from None
        if not any(within(resolved, root) for root in roots):
            shown = f"{value!r}" if resolved == value else f"{value!r} (resolves to {resolved})"
            raise PathRefused(
                field,
                f"{shown} is outside the allowed {access.value} roots "
                f"({', '.join(roots) or 'none configured'}); api.paths."
                f"{'outputs' if access is Access.OUTPUT else 'inputs'} sets them",
            )
        return resolved

    def check_spec(self, spec: BaseModel, prefix: str = "body") -> None:
        """Check every declared path field of ``spec`` (:class:`PathRefused` on the first)."""
        for field, value, access in self._paths(spec, prefix):
            self.check(value, access, field)

    def _paths(self, spec: BaseModel, prefix: str) -> Iterator[tuple[str, str, Access]]:
        for decl in path_fields(type(spec)):
            value = getattr(spec, decl.name)
            field = f"{prefix}.{decl.name}"
            if value is None or value in decl.literals:
                continue
            if not isinstance(value, str):
                raise PathRefused(field, "must be a string path")
            if decl.mixture and is_mixture_spec(value):
                for part in parse_mixture(value, check_files=False).parts:
                    yield field, str(part.path), decl.access
            else:
                yield field, value, decl.access
