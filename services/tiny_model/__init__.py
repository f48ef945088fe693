"""The tiny model: a small Qwen3-family causal LM built locally (no downloads) for tests and the
demo; ``python -m services.tiny_model.build DIR [--coder]``."""
