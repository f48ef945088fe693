"""``swerl submit -f job.yaml``: a job as a file.

    kind: rollout            # train | rollout | eval
    spec:                    # the fields of that kind's schema (docs/api.md)
      instance_ids: [a, b]
      n_samples: 4

The API validates the spec (and names a bad field); this module checks only the file's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from services.swerl_cli.errors import EXIT_USAGE, CliError

KINDS = ("train", "rollout", "eval")


def load_job_file(path: str) -> tuple[str, dict[str, Any]]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise CliError(EXIT_USAGE, f"cannot read job file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise CliError(EXIT_USAGE, f"job file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CliError(EXIT_USAGE, f"job file {path} must hold a mapping with kind: and spec:")
    unknown = set(data) - {"kind", "spec"}
    if unknown:
        raise CliError(EXIT_USAGE, f"job file {path}: unknown keys {sorted(unknown)}; "
                       "expected kind: and spec:")  # fmt: skip
    kind = data.get("kind")
    if kind not in KINDS:
        raise CliError(EXIT_USAGE, f"job file {path}: kind must be one of {', '.join(KINDS)}")
    spec = data.get("spec") or {}
    if not isinstance(spec, dict):
        raise CliError(EXIT_USAGE, f"job file {path}: spec must be a mapping")
    return kind, spec
