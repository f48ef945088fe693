"""The one rule for swerl's identifiers (trajectory, task, batch, group, job, node ids).

Ids travel in URL paths (``/t/<id>/v1``), Redis keys, sandbox labels and log lines, so they keep
to a small alphabet; ``:`` and ``.`` belong to it because real ids are built with them
(``<batch>:<prompt>:<sample>.a<attempt>``). The rule: 1-200 characters of letters, digits and
``. _ : -``, starting with a letter or digit, with no ``..`` anywhere (``..``, ``-`` or ``:``
alone, ``-x`` and ``a..b`` are refused). The adapter's routes and every queue / worker payload
validate ids with :data:`Ident` or :func:`check_id`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

ID_MAX_LENGTH = 200
# The JSON-schema form of the rule, published in the API schemas; check_id also bans ``..``
# (that needs a lookahead, which pydantic's regex engine does not have).
ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:\-]{{0,{ID_MAX_LENGTH - 1}}}$"
ID_RULE = (
    f"1-{ID_MAX_LENGTH} characters of letters, digits and . _ : -, "
    "starting with a letter or digit, without '..'"
)
_ID_RE = re.compile(ID_PATTERN)


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a valid id, or None if it is one."""
    if not isinstance(value, str):
        return f"an id must be a string, got {type(value).__name__}"
    if not _ID_RE.fullmatch(value) or ".." in value:
        return f"invalid id {value[:80]!r}: {ID_RULE}"
    return None


def check_id(value: str) -> str:
    """``value`` if it is a valid id; ValueError naming the rule otherwise."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Ident = Annotated[
    str,
    AfterValidator(check_id),
    Field(min_length=1, max_length=ID_MAX_LENGTH, json_schema_extra={"pattern": ID_PATTERN}),
]


# An instance key: a plain instance id, or ``<dataset>/<instance id>`` (a training mixture
# namespaces ids by dataset, services.datasets.mixture; two datasets may reuse an id). The
# dataset name follows the mixture's rule; ids keep to the rule above.
DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$"
_DATASET_NAME_RE = re.compile(DATASET_NAME_PATTERN)
INSTANCE_KEY_RULE = f"an instance id ({ID_RULE}), or <dataset>/<instance id>"


def split_instance_key(key: str) -> tuple[str | None, str]:
    """``<dataset>/<id>`` -> (dataset, id); a plain id -> (None, id). ValueError naming the
    rule when ``key`` is neither."""
    if not isinstance(key, str):
        raise ValueError(f"an instance key must be a string, got {type(key).__name__}")
    dataset, sep, instance_id = key.rpartition("/")
    if sep and not _DATASET_NAME_RE.match(dataset):
        raise ValueError(f"invalid instance key {key[:80]!r}: {INSTANCE_KEY_RULE}")
    problem = id_problem(instance_id)
    if problem is not None:
        raise ValueError(f"invalid instance key {key[:80]!r}: {INSTANCE_KEY_RULE}")
    return (dataset if sep else None), instance_id


def check_instance_key(value: str) -> str:
    """``value`` if it is a valid instance key (:func:`split_instance_key`)."""
    split_instance_key(value)
    return value


InstanceKey = Annotated[
    str,
    AfterValidator(check_instance_key),
    Field(min_length=1, max_length=ID_MAX_LENGTH + 65),
]
