"""The engine under test (reference engine, or a real SGLang server when configured)."""

from tests.support.engine_under_test import (  # noqa: F401 (fixtures)
    engine,
    engine_tokenizer,
    reference_server,
    scratch,
    tiny_model_dir_fixture,
)
