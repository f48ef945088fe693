"""The one configuration system of swerl: typed pydantic models, YAML files, env overrides.

Every service (adapter, engines, rollout manager, sandbox worker, job API, trainer) describes
its settings as a pydantic model and loads it with :func:`load_config`. Precedence, lowest
first: the model's defaults < the YAML file < environment variables < explicit overrides
(command-line flags). Validation happens once, at start-up, and a bad value stops the service
with a :class:`ConfigError` that names every offending key and where the value came from.

Environment variables: ``SWERL_<SECTION>__<FIELD>[__<SUBFIELD>...]``, e.g.
``SWERL_ADAPTER__PORT=8100`` or ``SWERL_WORKER__LIMITS__MAX_STEPS=50``. Values are parsed as
YAML scalars/lists (``true``, ``8``, ``[a, b]``), so types follow the model. The YAML file is
``--config PATH`` or ``$SWERL_CONFIG``; a file holds one mapping per section
(``adapter:``, ``worker:``...), so one file can configure a whole node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

ENV_PREFIX = "SWERL_"
# Keys whose values are never logged: *_token, *_secret, *_password, api_key (not max_tokens).
_SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$")
CONFIG_ENV = "SWERL_CONFIG"


class ConfigError(ValueError):
    """A configuration could not be loaded or validated; the message lists every problem."""


class StrictModel(BaseModel):
    """Base for config models: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    return data


def _parse_env_value(raw: str) -> Any:
    """An env value as a YAML scalar or flow collection (``8``, ``true``, ``[a, b]``, ``{k: v}``).

    Block-style YAML is not meant here: ``prefix:`` or ``a: b`` stay the literal string.
    """
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw
    if isinstance(value, dict | list) and not raw.lstrip().startswith(("{", "[")):
        return raw
    return value


def _env_overrides(section: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    prefix = ENV_PREFIX + (f"{section.upper()}__" if section else "")
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix) or key == CONFIG_ENV:
            continue
        path = [p.lower() for p in key[len(prefix) :].split("__") if p]
        if not path:
            continue
        value = _parse_env_value(raw)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {key} conflicts with another override")
        node[path[-1]] = value
    return out


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_errors(exc: ValidationError, model: type[BaseModel], section: str | None) -> str:
    where = f"[{section}]" if section else model.__name__
    lines = [f"invalid configuration {where}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        dotted = f"{section}.{loc}" if section else loc
        parts = ([section.upper()] if section else []) + [str(p).upper() for p in err["loc"]]
        env = ENV_PREFIX + "__".join(parts)
        got = (
            f" (got {err['input']!r})"
            if "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        lines.append(f"  - {dotted}: {err['msg']}{got}  [env: {env}]")
    return "\n".join(lines)


def load_config[M: BaseModel](
    model: type[M],
    *,
    section: str | None = None,
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> M:
    """Build ``model`` from defaults, YAML (``path`` or ``$SWERL_CONFIG``), env and overrides.

    ``overrides`` holds values given explicitly (e.g. command-line flags); keys whose value is
    ``None`` are ignored so argparse namespaces can be passed through unchanged.
    """
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    file = path if path is not None else environ.get(CONFIG_ENV)
    if file:
        raw = _read_yaml(Path(file))
        if section is not None:
            part = raw.get(section, {})
            if not isinstance(part, dict):
                raise ConfigError(f"section '{section}' of {file} must be a mapping")
            data = part
        else:
            data = raw
    data = _deep_merge(data, _env_overrides(section, environ))
    if overrides:
        data = _deep_merge(data, {k: v for k, v in overrides.items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, model, section)) from None


def dump_config(cfg: BaseModel) -> str:
    """The effective configuration as YAML (logged at start-up; secrets are masked)."""
    data = cfg.model_dump(mode="json")

    def mask(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: ("***" if _SECRET_KEY.search(k) and v else mask(v)) for k, v in node.items()}
        return node

    return yaml.safe_dump(mask(data), sort_keys=True)
