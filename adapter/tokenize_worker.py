"""Tokenisation of large texts in worker processes, so that no big object ever lives in the adapter.

A fast (Rust) tokenizer releases the GIL while it encodes, but building and freeing the
``Encoding`` of a long text does not: for ~500,000 tokens freeing it alone holds the GIL for
60-150 ms, during which the adapter's event loop (``/health``, every other trajectory) stands
still, and the memory it used stays in the adapter's heap. :class:`TokenizerProcesses` encodes
such texts in child processes instead (the same ``tokenizer.json``, so the same ids) and sends
back only the token count and, when the text fits the budget, the ids as packed bytes.

The children import only :mod:`tokenizers` (no torch, no transformers) and are started with
``spawn``: forking a process that runs threads (uvicorn, the tokenizer pool) is unsafe.
"""

from __future__ import annotations

import multiprocessing
import threading
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

_tokenizer: Any = None  # the child's tokenizers.Tokenizer


def _init(tokenizer_json: str) -> None:
    from tokenizers import Tokenizer

    global _tokenizer
    _tokenizer = Tokenizer.from_str(tokenizer_json)
    _tokenizer.no_truncation()
    _tokenizer.no_padding()


def _encode(text: str, limit: int) -> tuple[int, bytes | None]:
    """``(n_tokens, ids as uint32 bytes)``; no ids when ``n_tokens >= limit``."""
    encoding = _tokenizer.encode_batch([text], add_special_tokens=False)[0]
    n = len(encoding)
    if n >= limit:
        return n, None
    return n, array("I", encoding.ids).tobytes()


def _ready() -> bool:
    return _tokenizer is not None


class TokenizerWorkerError(RuntimeError):
    """A tokenizer process died (killed for memory, say); the pool is restarted."""


class TokenizerProcesses:
    """A pool of ``processes`` tokenizer processes, started with the first call (or
    :meth:`warm_up`); :meth:`encode` blocks the calling thread."""

    def __init__(self, tokenizer_json: str, processes: int) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self._json = tokenizer_json
        self._processes = processes
        self._lock = threading.Lock()  # guards replacing a broken pool (callers are threads)
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self._processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init,
            initargs=(self._json,),
        )

    def warm_up(self) -> None:
        """Start every process now (start-up time is paid before the first request)."""
        futures = [self._pool.submit(_ready) for _ in range(self._processes)]
        if not all(f.result(timeout=300) for f in futures):
            raise RuntimeError("a tokenizer process did not load the tokenizer")

    def encode(self, text: str, limit: int) -> tuple[int, list[int] | None]:
        """Token count of ``text`` and its ids (None when the count is ``>= limit``)."""
        pool = self._pool
        try:
            n, packed = pool.submit(_encode, text, limit).result()
        except BrokenProcessPool as exc:
            with self._lock:
                if self._pool is pool:
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._start()
            raise TokenizerWorkerError(f"a tokenizer process died: {exc}") from None
        if packed is None:
            return n, None
        ids = array("I")
        ids.frombytes(packed)
        return n, ids.tolist()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
