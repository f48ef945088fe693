"""The runner protocol's pieces shared by every runner: the cancel token."""

from __future__ import annotations

from sandbox_worker.runner import CancelToken


def test_cancel_token_keeps_the_first_reason() -> None:
    tok = CancelToken()
    assert not tok.is_set() and tok.reason is None and tok.wait(0.01) is False
    assert tok.cancel("cancelled") is True
    assert tok.cancel("worker shutdown") is False
    assert tok.is_set() and tok.reason == "cancelled" and tok.wait(0) is True
