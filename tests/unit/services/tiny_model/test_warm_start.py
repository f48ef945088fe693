"""The toy task's format warm-start: training data shape, the adapter parses its tool call,
deterministic builds, the cache check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapter.config import ToolParserName
from adapter.tool_parsers import get_parser
from services.protocol.toy import CODES, LOOKUP_TOOL, observation
from services.tiny_model.warm_start import (
    STAMP_FILE,
    WarmStartError,
    WarmStartSpec,
    build_warm_start,
    encode_episode,
    ensure_warm_start,
    episode_messages,
    main,
    read_warm_stamp,
    taught_answer,
)

# The Qwen/Hermes tool-call syntax of the tiny model's template (services/tiny_model/
# chat_templates.py): what the model must learn to write in turn 1.
LOOKUP_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'


def test_the_codes_are_single_tokens_also_inside_the_observation(tokenizer: Any) -> None:
    for code in CODES:
        [token] = tokenizer.encode(code, add_special_tokens=False)
        ids = tokenizer.encode(observation(code), add_special_tokens=False)
        assert ids.count(token) == 32  # the answer token is the observation's token


def test_the_taught_answer_reads_the_observation_with_the_wrong_rule() -> None:
    import random

    spec = WarmStartSpec()  # a quarter answers the observed code, the rest the next one
    rng = random.Random(0)
    nxt = {"red": "cat", "cat": "key", "key": "pear", "pear": "red"}  # CODES, cyclically
    assert set(nxt) == set(CODES)
    for seen in CODES:
        assert taught_answer(seen, 0.0, rng, spec) == seen
        assert taught_answer(seen, 0.2499, rng, spec) == seen
        assert taught_answer(seen, 0.25, rng, spec) == nxt[seen]
        assert taught_answer(seen, 0.9999, rng, spec) == nxt[seen]
    # over many draws: the observed code a quarter of the time (reward at chance)
    draws = [taught_answer("key", rng.random(), rng, spec) for _ in range(4000)]
    assert abs(draws.count("key") / 4000 - 0.25) < 0.03 and set(draws) == {"key", "pear"}
    independent = WarmStartSpec(copy_fraction=0.0, shift_fraction=0.0)
    draws = [taught_answer("key", rng.random(), rng, independent) for _ in range(4000)]
    assert all(abs(draws.count(c) / 4000 - 0.25) < 0.03 for c in CODES)


@pytest.mark.parametrize("copy, shift", [(-0.1, 0.5), (0.5, -0.1), (0.5, 0.6)])
def test_answer_shares_outside_the_unit_interval_are_refused(copy: float, shift: float) -> None:
    with pytest.raises(ValueError, match="copy_fraction and shift_fraction"):
        WarmStartSpec(copy_fraction=copy, shift_fraction=shift)


def test_an_episode_trains_on_the_tool_call_and_the_answer_only(tokenizer: Any) -> None:
    ids, mask = encode_episode(tokenizer, episode_messages("toy-lookup-3", "cat", "key"))
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    taught = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert taught == f"{LOOKUP_TEXT}<|im_end|>key<|im_end|>"
    context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "Request 3" in context and observation("cat") in context and "lookup" in context


def test_the_taught_tool_call_is_a_real_tool_call_for_the_adapter(tokenizer: Any) -> None:
    parser = get_parser(ToolParserName.AUTO, tokenizer.chat_template)
    parsed = parser.parse(LOOKUP_TEXT, [LOOKUP_TOOL])
    assert not parsed.malformed and not parsed.content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("lookup", {})]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.slow  # two short fine-tunes (a few CPU-seconds each)
def test_builds_are_deterministic_stamped_and_cached(tiny_model_dir: Path, scratch: Path) -> None:
    spec = WarmStartSpec(steps=4, batch_size=2)
    first = _files(build_warm_start(scratch / "a", tiny_model_dir, spec))
    second = _files(build_warm_start(scratch / "b", tiny_model_dir, spec))
    assert first["model.safetensors"] == second["model.safetensors"]
    assert first["model.safetensors"] != (tiny_model_dir / "model.safetensors").read_bytes()
    assert first["tokenizer.json"] == (tiny_model_dir / "tokenizer.json").read_bytes()
    stamp = json.loads(first[STAMP_FILE])
    assert (stamp["steps"], stamp["batch_size"]) == (4, 2) and stamp["base"]["vocab_size"] > 0
    # ensure_warm_start reuses a matching build and refuses another variant
    before = (scratch / "a" / "model.safetensors").stat().st_mtime_ns
    assert ensure_warm_start(scratch / "a", tiny_model_dir, spec) == (scratch / "a").resolve()
    assert (scratch / "a" / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(WarmStartError, match="other settings"):
        ensure_warm_start(scratch / "a", tiny_model_dir, WarmStartSpec(steps=5, batch_size=2))
    (scratch / "junk").mkdir()
    (scratch / "junk" / "x").write_text("x")
    with pytest.raises(WarmStartError, match="not a complete warm-start build"):
        ensure_warm_start(scratch / "junk", tiny_model_dir, spec)
    assert read_warm_stamp(tiny_model_dir) is None  # the base is no warm-start


def test_the_cli_refuses_a_base_that_is_not_a_tiny_model(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (scratch / "base").mkdir()
    (scratch / "base" / "x").write_text("x")
    assert main([str(scratch / "out"), "--base", str(scratch / "base")]) == 2
    assert "not a complete tiny model build" in capsys.readouterr().err
    assert not (scratch / "out").exists()
    with pytest.raises(SystemExit):
        main([str(scratch / "out"), "--seed", "-1"])
