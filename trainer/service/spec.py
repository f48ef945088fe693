"""A train job's spec (:class:`services.api.schemas.TrainSpec`) as the run config file of
``python -m trainer train``: the service's base file (manager, publish, defaults) with the
job's fields over it, validated by the driver's own loader before anything is spawned.

Mapping: ``model`` -> ``trainer.model``, ``algorithm`` -> ``trainer.algorithm``,
``checkpoint_dir`` -> ``trainer.checkpoint.dir``, ``steps`` -> ``train.steps``, ``dataset`` ->
``train.dataset.mixture`` when it names dataset files (``[name=]path[:weight],...``, read
here; services/datasets/mixture.py), else ``train.dataset.instances_file`` (a file of
instance ids, one a line, readable here),
``batch.prompts_per_step`` x ``batch.samples_per_prompt`` -> ``train.bootstrap`` (prompts,
group_size) and ``train.single.batch_size`` (their product: the same trajectories per step);
with one sample per prompt only the single phase's batch is set. ``run_dir`` is
``<runs_dir>/<job id>`` and ``run_id`` the job id.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from services.api.schemas import TrainSpec
from services.config import ConfigError
from services.datasets import DatasetError
from services.datasets.mixture import is_mixture_spec, parse_mixture
from trainer.loop.cli import load_run_config

# Environment overrides of the keys a job sets: dropped from the training process's
# environment, so a deployment-wide SWERL_TRAINER__CHECKPOINT__DIR cannot redirect a job.
SPEC_ENV_KEYS = (
    "SWERL_TRAIN__RUN_DIR",
    "SWERL_TRAIN__RUN_ID",
    "SWERL_TRAIN__STEPS",
    "SWERL_TRAIN__DATASET__INSTANCES_FILE",
    "SWERL_TRAIN__DATASET__MIXTURE",
    "SWERL_TRAINER__MODEL",
    "SWERL_TRAINER__ALGORITHM",
    "SWERL_TRAINER__CHECKPOINT__DIR",
)


class SpecError(ValueError):
    """The job's spec cannot become a valid run config (the job fails with this message)."""


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        both = isinstance(old, Mapping) and isinstance(value, Mapping)
        out[key] = _merge(old, value) if both else value
    return out


def load_base(path: str) -> dict[str, Any]:
    """The service's base run file (empty path: no base)."""
    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the base run config must be a mapping of sections")
    return data


def job_sections(spec: TrainSpec, job_id: str, run_dir: Path) -> dict[str, Any]:
    """The sections the job's spec sets (see the module docstring)."""
    shape = spec.batch
    train: dict[str, Any] = {
        "run_dir": str(run_dir),
        "run_id": job_id,
        "steps": spec.steps,
        "dataset": _dataset_section(spec.dataset),
        "single": {"batch_size": shape.prompts_per_step * shape.samples_per_prompt},
    }
    if shape.samples_per_prompt > 1:
        n = shape.samples_per_prompt
        train["bootstrap"] = {"prompts": shape.prompts_per_step, "group_size": n}
    trainer = {
        "model": spec.model,
        "algorithm": spec.algorithm,
        "checkpoint": {"dir": spec.checkpoint_dir},
    }
    return {"train": train, "trainer": trainer}


def _dataset_section(value: str) -> dict[str, str]:
    """``train.dataset`` of the job: a mixture of dataset files, or a file of instance ids."""
    if is_mixture_spec(value):
        try:
            parse_mixture(value)
        except DatasetError as exc:
            raise SpecError(f"spec.dataset: {exc}") from None
        return {"mixture": value}
    dataset = Path(value)
    if not dataset.is_file():
        raise SpecError(
            f"spec.dataset {value!r} is neither a dataset mixture ([name=]path[:weight],... of "
            ".jsonl/.json/.parquet files) nor a file of instance ids on this trainer"
        )
    return {"instances_file": str(dataset.resolve())}


def training_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The training process's environment: ``environ`` without :data:`SPEC_ENV_KEYS`."""
    return {k: v for k, v in environ.items() if k not in SPEC_ENV_KEYS}


def write_run_config(
    raw_spec: Mapping[str, Any],
    job_id: str,
    run_dir: Path,
    base: Mapping[str, Any],
    environ: Mapping[str, str],
) -> Path:
    """Write ``run_dir/run.yaml`` for the job and validate it as the driver will (with the
    environment the driver gets); :class:`SpecError` names every problem."""
    try:
        spec = TrainSpec.model_validate(raw_spec)
    except ValidationError as exc:
        raise SpecError(f"invalid train spec: {exc}") from None
    sections = _merge(base, job_sections(spec, job_id, run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.yaml"
    path.write_text(yaml.safe_dump(sections, sort_keys=True))
    try:
        load_run_config(str(path), environ=training_env(environ))
    except ConfigError as exc:
        raise SpecError(f"the job's run config is invalid: {exc}") from None
    return path
