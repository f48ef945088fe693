"""Fixtures of the backend tests: the tiny model and a reference engine serving it."""

from __future__ import annotations

from transformers.utils import logging as hf_logging

from tests.support.engines import engine_url, tiny_model_dir_fixture  # noqa: F401 (fixtures)

hf_logging.disable_progress_bar()
