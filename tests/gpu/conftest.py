"""Fixtures of the GPU checks: the tiny model, dense and MoE."""

from __future__ import annotations

from transformers.utils import logging as hf_logging

from tests.support.engines import (  # noqa: F401 (fixtures)
    tiny_model_dir_fixture,
    tiny_moe_dir_fixture,
    toy_model_dir_fixture,
)

hf_logging.disable_progress_bar()
