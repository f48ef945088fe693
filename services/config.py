"""The one configuration system of swerl: typed pydantic models, YAML files, env overrides.

Every service (adapter, engines, rollout manager, sandbox worker, job API, trainer) describes
its settings as a pydantic model and loads it with :func:`load_config`. Precedence, lowest
first: the model's defaults < the YAML file < environment variables < explicit overrides
(command-line flags). Validation happens once, at start-up, and a bad value stops the service
with a :class:`ConfigError` that names every offending key and where the value came from.

Environment variables: ``SWERL_<SECTION>__<FIELD>[__<SUBFIELD>...]``, e.g.
``SWERL_ADAPTER__PORT=8100`` or ``SWERL_WORKER__LIMITS__MAX_STEPS=50``. Values are parsed as
YAML scalars/lists (``true``, ``8``, ``[a, b]``), so types follow the model. Only that
double-underscore form is configuration: ``SWERL_CACHE_DIR``, ``SWERL_SGLANG_URL`` and other
single-underscore variables belong to other tools and are not read here. The YAML file is
``--config PATH`` or ``$SWERL_CONFIG``; a file holds one mapping per section
(``adapter:``, ``worker:``...), so one file can configure a whole node.

The root schema: :data:`SECTIONS` names every section a node's file may hold. Each service reads
only its own section, but every section of the file and every ``SWERL_<SECTION>__`` prefix in
the environment must be one of these names; a misspelled one (``adpater:``,
``SWERL_ADPATER__PORT``) is an error that names the closest valid section, never a setting
silently ignored. The names are the contract and live here, so any service can check a whole
file without importing the others; the models stay with their services, which register them
(:func:`register_section`) when their config module is imported. A new service adds its name
to :data:`SECTIONS` and registers its model.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

ENV_PREFIX = "SWERL_"
# Keys whose values are never logged: *_token, *_secret, *_password, api_key (not max_tokens).
_SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$")
CONFIG_ENV = "SWERL_CONFIG"
# A configuration variable: SWERL_<SECTION>__<FIELD>...; the section ends at the first "__".
_CONFIG_VAR = re.compile(r"^SWERL_(?P<section>.*?)__(?P<path>.*)$", re.DOTALL)

# Every section of the configuration, one per service (the trainer's engine, its weight
# publishing and its training loop are three). The names are the contract between a node's
# file and its services.
SECTIONS: tuple[str, ...] = (
    "adapter",
    "api",
    "eval_service",
    "manager",
    "publish",
    "train",
    "trainer",
    "trainer_service",
    "worker",
)
_MODELS: dict[str, type[BaseModel]] = {}


class ConfigError(ValueError):
    """A configuration could not be loaded or validated; the message lists every problem."""


class StrictModel(BaseModel):
    """Base for config models: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def register_section(name: str, model: type[BaseModel]) -> None:
    """Record ``model`` as the schema of section ``name`` (called by the service's config module).

    ``name`` must be in :data:`SECTIONS`; one model per section (importing the module again
    registers the same class name again, which is fine).
    """
    if name not in SECTIONS:
        raise ValueError(
            f"section {name!r} is not in services.config.SECTIONS ({', '.join(SECTIONS)}); "
            "a new service adds its section name there"
        )
    current = _MODELS.get(name)
    if current is not None and _qualified(current) != _qualified(model):
        raise ValueError(f"section {name!r} is already registered to {_qualified(current)}")
    _MODELS[name] = model


def section_models() -> dict[str, type[BaseModel]]:
    """The registered models by section: those of the services imported so far."""
    return dict(_MODELS)


def _qualified(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _closest(name: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _check_sections(file_sections: Iterable[Any], file: object, environ: Mapping[str, str]) -> None:
    """Every section of the file and of ``SWERL_<SECTION>__`` variables must be in SECTIONS."""
    problems = []
    for name in file_sections:
        if name not in SECTIONS:
            close = _closest(str(name), SECTIONS)
            hint = f": did you mean '{close}'?" if close else ""
            problems.append(f"  - section {str(name)!r} of config file {file}{hint}")
    for key in sorted(environ):
        match = _CONFIG_VAR.match(key)
        if match is None or match["section"].lower() in SECTIONS:
            continue
        close = _closest(match["section"], SECTIONS)
        hint = f": did you mean {ENV_PREFIX}{close.upper()}__{match['path']}?" if close else ""
        problems.append(f"  - environment variable {key}{hint}")
    if problems:
        lines = ["unknown configuration section:", *problems, f"  sections: {', '.join(SECTIONS)}"]
        raise ConfigError("\n".join(lines))


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


def _env_overrides(section: str, environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        match = _CONFIG_VAR.match(key)
        if match is None or match["section"].lower() != section:
            continue
        path = [p.lower() for p in match["path"].split("__") if p]
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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models in an annotation: ``X``, ``X | None``, ``list[X]``, ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys valid at ``loc`` (a mapping inside ``model``), for a did-you-mean hint."""
    models = [model]
    for part in loc:
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if fields:  # else a list index, dict key or union tag: the same models hold the keys
            models = [sub for field in fields for sub in _models_in(field.annotation)]
    return sorted({key for m in models for key in m.model_fields})


def _format_errors(exc: ValidationError, model: type[BaseModel], section: str) -> str:
    lines = [f"invalid configuration [{section}]:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        env = ENV_PREFIX + "__".join([section.upper()] + [str(p).upper() for p in err["loc"]])
        key = str(err["loc"][-1]) if err["loc"] else ""
        unknown = err["type"] == "extra_forbidden"
        # The value is shown unless it may be a secret: a secret key's, or an unknown key's
        # (a misspelled admin_token); an unknown key is fixed by its name, not its value.
        hidden = unknown or _SECRET_KEY.search(key) or isinstance(err.get("input"), dict)
        got = f" (got {err['input']!r})" if "input" in err and not hidden else ""
        hint = ""
        if unknown and err["loc"]:
            close = _closest(key, _keys_at(model, err["loc"][:-1]))
            hint = f" (did you mean '{close}'?)" if close else ""
        lines.append(f"  - {section}.{loc}: {err['msg']}{hint}{got}  [env: {env}]")
    return "\n".join(lines)


def load_config[M: BaseModel](
    model: type[M],
    *,
    section: str,
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> M:
    """Build section ``section`` as ``model`` from defaults, YAML, env and overrides.

    The YAML file is ``path`` or ``$SWERL_CONFIG``. Other sections of the file and other
    sections' variables are not read, but must be known ones (:data:`SECTIONS`).
    ``overrides`` holds values given explicitly (e.g. command-line flags); keys whose value is
    ``None`` are ignored so argparse namespaces can be passed through unchanged.
    """
    if section not in SECTIONS:
        raise ValueError(f"unknown config section {section!r}: add it to services.config.SECTIONS")
    environ = os.environ if environ is None else environ
    file = path if path is not None else environ.get(CONFIG_ENV)
    raw = _read_yaml(Path(file)) if file else {}
    _check_sections(raw, file, environ)
    part = raw.get(section, {})
    if not isinstance(part, dict):
        raise ConfigError(f"section '{section}' of {file} must be a mapping")
    data = _deep_merge(part, _env_overrides(section, environ))
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
