"""The engines compose.yaml starts report the served checkpoint's weight version from the
start: SGLang says ``"default"`` without ``--weight-version`` until the first publish, which
the adapter cannot read as a version (every turn would be recorded under the adapter's)."""

from __future__ import annotations

import re

import yaml

from deploy.compose_lint import COMPOSE_FILE


def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def test_every_sglang_service_starts_with_the_served_checkpoints_weight_version() -> None:
    engines = {name: s for name, s in services().items() if name.startswith("sglang-")}
    assert len(engines) == 4
    for name, service in engines.items():
        flags = [a for a in service["command"] if str(a).startswith("--weight-version=")]
        assert flags == ["--weight-version=${SWERL_WEIGHT_VERSION:-0}"], name


def test_the_reference_engine_starts_at_the_same_version_by_default() -> None:
    reference = services()["reference-engine"]
    assert "--weight-version" in " ".join(reference["command"])
    default = re.fullmatch(r"\$\{\w+:-(\d+)\}", reference["environment"]["WEIGHT_VERSION"])
    assert default is not None and default.group(1) == "0"
