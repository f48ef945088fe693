"""The adapter's Renderer needs neither torch nor transformers, and renders, encodes and decodes
as transformers' tokenizer does for the model's own template."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from adapter.rendering import Renderer
from tests.unit.adapter.test_chat_template import CONVERSATIONS, TOOLS

REPO = Path(__file__).resolve().parents[3]


def test_the_adapter_imports_and_loads_a_model_without_torch_or_transformers(
    tiny_model_dir: Path,
) -> None:
    """A fresh interpreter imports every adapter module and builds a Renderer: neither torch
    nor transformers is imported (they cost ~700 MB and seconds of start-up)."""
    adapter_modules = sorted(
        "adapter." + ".".join(p.relative_to(REPO / "adapter").with_suffix("").parts)
        for p in (REPO / "adapter").rglob("*.py")
        if p.name != "__init__.py"
    )
    script = textwrap.dedent(
        f"""
        import importlib, json, sys
        for name in {adapter_modules!r}:
            importlib.import_module(name)
        from adapter.rendering import Renderer
        r = Renderer({str(tiny_model_dir)!r})
        r.encode_prompt(r.render([{{"role": "user", "content": "hi"}}], None, True))
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
        print(json.dumps(heavy))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "adapter.app" in adapter_modules and "adapter.tokenize_worker" in adapter_modules
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.fixture(scope="module", params=["tiny", "tiny_coder"])
def pair(request: pytest.FixtureRequest, tiny_model_dir: Path, tiny_coder_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    model_dir = tiny_model_dir if request.param == "tiny" else tiny_coder_dir
    return Renderer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


def test_render_and_encode_match_transformers(pair: tuple[Renderer, Any]) -> None:
    renderer, hf = pair
    coder = "render_value" in renderer.chat_template
    for name, messages in CONVERSATIONS.items():
        if coder != name.endswith("object_args") and "agent_loop" in name:
            continue  # each template takes tool-call arguments in one form
        for tools in (None, TOOLS):
            for agp in (True, False):
                expected = hf.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=agp, tokenize=False
                )
                text = renderer.render(messages, tools, agp)
                assert text == expected, name
                ids = hf.encode(expected, add_special_tokens=False)
                assert renderer.encode_prompt(text) == renderer.encode(text) == ids
                assert renderer.decode(ids) == hf.decode(ids, skip_special_tokens=True)
                assert [renderer.token_text(i) for i in ids[:50]] == [
                    hf.decode([i], skip_special_tokens=False) for i in ids[:50]
                ]


def test_stop_tokens_and_context_match_the_model_files(pair: tuple[Renderer, Any]) -> None:
    renderer, hf = pair
    generation = json.loads((renderer.model_dir / "generation_config.json").read_text())
    config = json.loads((renderer.model_dir / "config.json").read_text())
    assert renderer.stop_token_ids == {generation["eos_token_id"], hf.eos_token_id}
    assert renderer.end_of_turn == hf.eos_token
    assert renderer.context_length == config["max_position_embeddings"]
    assert json.loads(renderer.tokenizer_json() or "{}") == json.loads(
        hf.backend_tokenizer.to_str()
    )


def test_chat_template_kwargs_reach_the_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (tmp_path / name).write_bytes((tiny_model_dir / name).read_bytes())
    qwen3 = Path(__file__).resolve().parents[2] / "data" / "chat_templates" / "qwen3.jinja"
    (tmp_path / "chat_template.jinja").write_bytes(qwen3.read_bytes())
    thinking_off = Renderer(tmp_path, chat_template_kwargs={"enable_thinking": False})
    text = thinking_off.render([{"role": "user", "content": "hi"}], None, True)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert (
        not Renderer(tmp_path)
        .render([{"role": "user", "content": "hi"}], None, True)
        .endswith("</think>\n\n")
    )
