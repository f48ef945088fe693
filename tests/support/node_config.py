"""One configuration file for a whole node: every section of the root schema, as an operator
would write it, each with values that differ from the defaults (so a test can tell that each
service read its own section and nothing else)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Section -> the values the file sets (and the service must read back).
WHOLE_NODE: dict[str, dict[str, Any]] = {
    "adapter": {"engines": ["http://127.0.0.1:30001"], "model": "/models/m", "port": 8111},
    "api": {"port": 8301, "runner": {"concurrency": 2}, "queue": {"prefix": "node1:"}},
    "manager": {"prefetch": 3, "queue": {"prefix": "node1:"}},
    "worker": {"node": "n1", "slots": 5, "backend": "simulated", "queue": {"prefix": "node1:"}},
    "trainer": {"model": "/models/m", "seed": 7},
    "publish": {
        "adapter_url": "http://127.0.0.1:8111",
        "admin_token": "t0ken",
        "weights_dir": "/weights",
    },
    "train": {"run_dir": "/runs/r1", "steps": 20, "dataset": {"instance_ids": ["i1", "i2"]}},
    "trainer_service": {
        "group": "g2",
        "runs_dir": "/runs",
        "command": ["torchrun", "-m", "trainer", "train"],
    },
    "eval_service": {
        "group": "g3",
        "runs_dir": "/eval-runs",
        "backend": "bwrap",
        "engine_url": ["http://sglang-0:30000"],
    },
}


def write_node_config(directory: Path) -> Path:
    """``WHOLE_NODE`` as ``directory/swerl.yaml``; returns the file's path."""
    path = directory / "swerl.yaml"
    path.write_text(yaml.safe_dump(WHOLE_NODE, sort_keys=False))
    return path


def assert_holds(printed: dict[str, Any], expected: dict[str, Any]) -> None:
    """Every value of ``expected`` (nested mappings compared key by key) is in ``printed``."""
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_holds(printed[key], value)
        else:
            assert printed[key] == value, (key, printed[key], value)
