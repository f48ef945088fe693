"""One large prompt must not freeze the adapter: bounded bodies, bounded prompts, work off the loop.

The ordering test gates the big request inside its rendering and inside its tokenising (the
real functions run once the gate opens) and asks ``/health`` at each gate: it must answer while
the big request is provably still in flight. No timings are asserted; the bench measures them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.integration.adapter.conftest import AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a")

WORDS = "def class return import value module python line file test error assert self "


class Gate:
    """Holds a wrapped call until :meth:`open` (``entered`` is set when a call arrives)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            if not self.opened.wait(timeout=600):
                raise RuntimeError("gate never opened")
            return fn(*args, **kwargs)

        return gated

    def open(self) -> None:
        self.opened.set()


def test_health_answers_while_a_maximal_prompt_is_in_flight(
    adapter: AdapterFactory, engines: EnginePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with adapter([engines.a.url]) as a:
        renderer = a.service.renderer
        # The largest prompt the byte bound lets through to the tokenizer (minus template text).
        size = int(renderer.context_length * renderer.bytes_per_token) - 200
        content = (WORDS * (size // len(WORDS) + 1))[:size]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
        rendering, tokenising = Gate(), Gate()
        monkeypatch.setattr(renderer, "render", rendering.wrap(renderer.render))
        monkeypatch.setattr(
            renderer, "large_text_encoder", tokenising.wrap(renderer.large_text_encoder)
        )
        client = httpx.Client(timeout=600)
        try:
            with ThreadPoolExecutor(1) as pool:
                big = pool.submit(client.post, f"{a.t('big-prompt')}/chat/completions", json=body)
                for gate in (rendering, tokenising):
                    assert gate.entered.wait(timeout=600), "the big request never got there"
                    health = httpx.get(f"{a.url}/health", timeout=60)
                    assert health.status_code == 200
                    assert not big.done()  # answered while the big request is in flight
                    gate.open()
                response = big.result(timeout=600)
        finally:
            rendering.open()
            tokenising.open()
            client.close()
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "the prompt is" in error["message"]
        assert f"maximum context length is {renderer.context_length} tokens" in error["message"]
        assert a.http.get(f"{a.url}/health").status_code == 200


def test_oversized_bodies_are_a_413_json_error(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url], max_body_bytes=100_000) as a:
        url = f"{a.t('big-body')}/chat/completions"
        body = b'{"messages": [{"role": "user", "content": "' + b"x" * 200_000 + b'"}]}'
        declared = httpx.post(url, content=body, headers={"content-type": "application/json"})

        def chunks() -> Any:  # no Content-Length: the limit holds while reading
            for start in range(0, len(body), 16_384):
                yield body[start : start + 16_384]

        chunked = httpx.post(url, content=chunks(), headers={"content-type": "application/json"})
        for response in (declared, chunked):
            assert response.status_code == 413, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "larger than 100000 bytes" in error["message"]
        ok = a.chat("big-body", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200


def test_prompt_over_the_byte_bound_is_refused_and_records_nothing(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url], context_length=64) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        first = a.chat("over-bytes", {"messages": messages, "max_tokens": 2})
        assert first.status_code == 200, first.text
        before = a.record("over-bytes")
        too_big = "x" * int(64 * a.service.renderer.bytes_per_token + 1)
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": too_big}]
        response = a.chat("over-bytes", {"messages": messages, "max_tokens": 2})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "maximum context length is 64 tokens" in error["message"]
        assert "bytes of text" in error["message"]
        assert a.record("over-bytes") == before
