"""Load SWE-bench / SWE-Gym / SWE-smith style task instances from a local file.

Formats, chosen by the file suffix: ``.jsonl`` (one instance per line, blank lines ignored),
``.json`` (a list of instances) and ``.parquet`` (the Hugging Face dataset files; needs
``pyarrow``). Every row is validated as a :class:`~services.protocol.instance.SWEInstance`; the
first bad row stops loading with a :class:`DatasetError` naming the file, the line (JSONL) or
row (parquet/JSON), the instance and every offending field, because a dataset with a broken row
is almost always a dataset built wrongly, and training on the rest would hide it.

:func:`load_instances_collect` is the collect-all form ``validate`` uses: every row is read, a
bad row (bad JSON on its line, a missing field, an unparseable gold ``patch``, a duplicate id)
becomes a :class:`RowError` of that row and the rest still load; only file-level problems
(missing file, unknown format, a ``.json`` file that is not a list) raise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from services.protocol.instance import SWEInstance

SUFFIXES = (".jsonl", ".json", ".parquet")


class DatasetError(ValueError):
    """A dataset file is missing, unreadable or holds an invalid instance."""


@dataclass(frozen=True)
class RowError:
    """One bad row of a collect-all load: where it is, its id when it has one, and why."""

    where: str  # "line N" / "row N"
    instance_id: str | None
    message: str  # the full message, naming file, place and field


def load_instances(path: str | Path, only: Iterable[str] | None = None) -> list[SWEInstance]:
    """Every instance in ``path``, in file order; with ``only``, just those ids (all must exist)."""
    path = Path(path)
    instances: list[SWEInstance] = []
    seen: dict[str, str] = {}
    for where, record in _records(path):
        instance = _validate(path, where, record)
        if instance.instance_id in seen:
            raise DatasetError(
                f"{path}:{where}: duplicate instance_id {instance.instance_id!r} "
                f"(first at {seen[instance.instance_id]})"
            )
        seen[instance.instance_id] = where
        instances.append(instance)
    if not instances:
        raise DatasetError(f"{path}: no instances in the file")
    if only is not None:
        wanted = list(dict.fromkeys(only))
        missing = [iid for iid in wanted if iid not in seen]
        if missing:
            raise DatasetError(f"{path}: no instance with id {', '.join(map(repr, missing))}")
        instances = [inst for inst in instances if inst.instance_id in set(wanted)]
    return instances


def load_instances_collect(path: str | Path) -> tuple[list[SWEInstance], list[RowError]]:
    """Every valid instance of ``path`` and a :class:`RowError` for every bad row."""
    path = Path(path)
    instances: list[SWEInstance] = []
    errors: list[RowError] = []
    seen: dict[str, str] = {}
    for where, record in _records(path, collect=True):
        iid = record.get("instance_id") if isinstance(record, dict) else None
        iid = iid if isinstance(iid, str) and iid else None
        try:
            if isinstance(record, DatasetError):
                raise record
            instance = _validate(path, where, record)
            if instance.instance_id in seen:
                raise DatasetError(
                    f"{path}:{where}: duplicate instance_id {instance.instance_id!r} "
                    f"(first at {seen[instance.instance_id]})"
                )
        except DatasetError as exc:
            errors.append(RowError(where, iid, str(exc)))
            continue
        seen[instance.instance_id] = where
        instances.append(instance)
    if not instances and not errors:
        raise DatasetError(f"{path}: no instances in the file")
    return instances, errors


def _records(path: Path, *, collect: bool = False) -> Iterator[tuple[str, Any]]:
    """``(location, raw record)`` pairs; location is ``line N`` or ``row N`` (1-based)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DatasetError(f"{path}: unsupported dataset format (use one of {', '.join(SUFFIXES)})")
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    if suffix == ".parquet":
        for index, row in enumerate(_parquet_rows(path), start=1):
            yield f"row {index}", row
        return
    text = read_text(path)
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise invalid_json(path, exc.lineno, exc) from None
        if not isinstance(rows, list):
            raise DatasetError(f"{path}: a .json dataset must be a list of instances")
        for index, row in enumerate(rows, start=1):
            yield f"row {index}", row
        return
    yield from jsonl_records(path, text, collect=collect)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc


def jsonl_records(path: Path, text: str, *, collect: bool = False) -> Iterator[tuple[str, Any]]:
    """``(line N, record)`` of each non-blank line of a JSONL text; with ``collect`` a line of
    bad JSON yields its :class:`DatasetError` as the record instead of raising it."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if not collect:
                raise invalid_json(path, lineno, exc) from None
            record = invalid_json(path, lineno, exc)
        yield f"line {lineno}", record


def invalid_json(path: Path, lineno: int, exc: json.JSONDecodeError) -> DatasetError:
    return DatasetError(f"{path}:line {lineno}: invalid JSON: {exc.msg} (column {exc.colno})")


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # optional dependency, needed only for parquet
    except ImportError:
        raise DatasetError(
            f"{path}: reading parquet files needs the 'pyarrow' package, which is not installed"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own error family for corrupt files
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from exc


def _validate(path: Path, where: str, record: Any) -> SWEInstance:
    return validate_record(path, where, record, SWEInstance)


def validate_record[M: BaseModel](path: Path, where: str, record: Any, model: type[M]) -> M:
    """``record`` as a ``model``; a :class:`DatasetError` naming file, place, id and fields."""
    if not isinstance(record, dict):
        raise DatasetError(f"{path}:{where}: expected a JSON object, got {type(record).__name__}")
    try:
        return model.model_validate(record)
    except ValidationError as exc:
        iid = record.get("instance_id")
        who = f" (instance {iid!r})" if isinstance(iid, str) and iid else ""
        problems = "; ".join(describe_error(err) for err in exc.errors())
        raise DatasetError(f"{path}:{where}{who}: {problems}") from None


def describe_error(error: Any) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "<record>"
    if error["type"] == "missing":
        return f"missing required field {field!r}"
    return f"field {field!r}: {error['msg']}"
