"""Fixtures of the backend tests: the tiny model (dense and MoE) and a reference engine serving
the dense one."""

from __future__ import annotations

from transformers.utils import logging as hf_logging

from tests.support.engines import (  # noqa: F401 (fixtures)
    engine_url,
    tiny_model_dir_fixture,
    tiny_moe_dir_fixture,
)

hf_logging.disable_progress_bar()
