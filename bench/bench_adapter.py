"""Benchmark of the adapter: added latency, recording throughput, bytes per token, refresh gate.

``python bench/bench_adapter.py [--quick] [--check] [--json FILE]``

In one run, against one reference engine (tiny model, CPU) and a private Redis:

1. **recording path** -- the recorder alone (render, prefix check, tokenise the suffix, pack the
   turn) on synthetic conversations, pinned to one core; CPU time, so other load on the machine
   does not count: recorded tokens (prompt + observations + outputs) per second;
2. **direct** -- N concurrent simulated trajectories (default 32 x 10 turns, 128-token outputs)
   calling the engine's ``/generate`` with token ids, as a minimal token-in-token-out client;
3. **through the adapter** -- the same trajectories as OpenAI chat calls to ``python -m adapter``
   (a subprocess), recorded into Redis. Added latency per request = client-measured latency minus
   the engine call the adapter made for it (from the record), compared with the median direct
   call; the end-to-end median ratio is printed too;
4. **bytes per recorded token** -- ``MEMORY USAGE`` of every key the records use, divided by the
   tokens they hold;
5. **refresh** -- a weight refresh while trajectories are mid-conversation: how long the gate was
   closed, compared with the longest agent step that was in flight when it closed.

Targets (issue 2): added latency <= 10 % of the direct call; recording >= 50,000 tokens/s;
<= 12 bytes per token; gate closed <= longest in-flight step + 50 ms. ``--check`` exits 1 if
one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from adapter.engines.sglang import SamplingParams, SGLangClient  # noqa: E402
from adapter.engines.tiny_model import ensure_tiny_model  # noqa: E402
from services.store import load_trajectory  # noqa: E402
from tests.support.engines import free_port, launch_reference_server  # noqa: E402
from tests.support.redis import start_redis, stop_redis  # noqa: E402

ADMIN_TOKEN = "bench-token"
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the repository and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command"}},
            "required": ["command"],
        },
    },
}
# Filler vocabulary of the synthetic conversations (deterministic, no randomness needed).
WORDS = (
    "def", "class", "return", "import", "value", "module", "python", "line", "file", "test",
    "error", "assert", "self", "none", "true", "false", "path", "repo", "commit", "patch",
    "diff", "function", "call", "result", "output",
)  # fmt: skip


def words(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(n))


def first_messages(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a software engineering agent. " + words(i, 40)},
        {"role": "user", "content": f"Task {i}: " + words(i + 1, 60)},
    ]


def observation(i: int, turn: int) -> str:
    return f"$ step {turn}\n" + words(i * 31 + turn, 50)


@dataclass
class Timings:
    spans: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    # (trajectory, turn) -> (start, end) of the request, perf_counter seconds

    def add(self, i: int, turn: int, start: float, end: float) -> None:
        self.spans[(i, turn)] = (start, end)

    @property
    def latencies(self) -> list[float]:
        return [end - start for start, end in self.spans.values()]


# ---------------------------------------------------------------------------------- phases


def bench_recorder(model_dir: Path, n_traj: int, n_turns: int, n_tokens: int) -> dict[str, float]:
    """The recording path alone, on one core (CPU time)."""
    from adapter.messages import template_messages
    from adapter.openai_schema import ChatMessage
    from adapter.recorder import Recorder, TurnResult
    from adapter.rendering import Renderer

    renderer = Renderer(model_dir)
    recorder = Recorder(renderer)
    eos = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    outputs = []
    for turn in range(n_turns):
        ids = [*renderer.encode(words(turn, n_tokens * 2))[: n_tokens - 1], eos]
        outputs.append((ids, renderer.decode(ids)))
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if affinity:
        os.sched_setaffinity(0, {min(affinity)})
    tokens = 0
    written = 0
    started = time.process_time()
    try:
        for i in range(n_traj):
            raw = first_messages(i)
            state = None
            for turn in range(n_turns):
                msgs = [ChatMessage.model_validate(m) for m in raw]
                plan = recorder.plan(state, msgs, template_messages(msgs), [TOOL])
                ids, text = outputs[turn]
                returned = ChatMessage(role="assistant", content=text)
                result = TurnResult(ids, [-1.0] * len(ids), 0, "stop")
                committed = recorder.commit(state, plan, result, returned)
                state = committed.state
                written += sum(len(e) for e in committed.entries)
                tokens += len(plan.observation_ids) + len(ids) + len(plan.prompt_ids or [])
                raw = [
                    *raw,
                    {"role": "assistant", "content": text},
                    {"role": "tool", "tool_call_id": f"c{turn}", "content": observation(i, turn)},
                ]
    finally:
        if affinity:
            os.sched_setaffinity(0, affinity)
    cpu = time.process_time() - started
    return {
        "tokens": tokens,
        "cpu_s": cpu,
        "tokens_per_s": tokens / cpu,
        "entry_bytes_per_token": written / tokens,
    }


async def run_direct(
    engine_url: str, model_dir: Path, n_traj: int, n_turns: int, n_tokens: int
) -> Timings:
    """Token-in-token-out clients calling /generate directly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    timings = Timings()
    client = SGLangClient(engine_url, timeout=3600)

    async def trajectory(i: int) -> None:
        text = tok.apply_chat_template(
            first_messages(i), tools=[TOOL], add_generation_prompt=True, tokenize=False
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        for turn in range(n_turns):
            sampling = SamplingParams(max_new_tokens=n_tokens, temperature=1.0)
            start = time.perf_counter()
            result = await client.generate(ids, sampling)
            end = time.perf_counter()
            timings.add(i, turn, start, end)
            closing = "" if result.output_ids and result.output_ids[-1] == eos else "<|im_end|>"
            glue = (
                f"{closing}\n<|im_start|>user\n<tool_response>\n{observation(i, turn)}\n"
                "</tool_response><|im_end|>\n<|im_start|>assistant\n"
            )
            ids = ids + result.output_ids + tok(glue, add_special_tokens=False)["input_ids"]

    try:
        await asyncio.gather(*(trajectory(i) for i in range(n_traj)))
    finally:
        await client.close()
    return timings


async def run_adapter(
    url: str,
    prefix: str,
    n_traj: int,
    n_turns: int,
    n_tokens: int,
    refresh: dict[str, Any] | None = None,
) -> Timings:
    """OpenAI chat clients through the adapter, one trajectory each (``/t/{id}/v1``).

    With ``refresh``, a weight refresh is posted once every trajectory has finished a turn and
    some are mid-step; its answer and send time are stored into ``refresh``.
    """
    timings = Timings()
    first_done = asyncio.Event()
    done = [0]
    outstanding = [0]

    async def trajectory(i: int, client: httpx.AsyncClient) -> None:
        messages = first_messages(i)
        for turn in range(n_turns):
            body = {
                "model": "tiny",
                "messages": messages,
                "tools": [TOOL],
                "max_tokens": n_tokens,
                "temperature": 1.0,
            }
            start = time.perf_counter()
            outstanding[0] += 1
            r = await client.post(f"{url}/t/{prefix}{i}/v1/chat/completions", json=body)
            outstanding[0] -= 1
            end = time.perf_counter()
            if r.status_code != 200:
                raise RuntimeError(f"adapter answered {r.status_code}: {r.text[:300]}")
            timings.add(i, turn, start, end)
            message = r.json()["choices"][0]["message"]
            messages = [
                *messages,
                message,
                {"role": "tool", "tool_call_id": f"c{turn}", "content": observation(i, turn)},
            ]
            if turn == 0:
                done[0] += 1
                if done[0] == n_traj:
                    first_done.set()

    async def trigger(client: httpx.AsyncClient) -> None:
        assert refresh is not None
        await first_done.wait()
        while outstanding[0] == 0:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        refresh["sent_at"] = time.perf_counter()
        r = await client.post(
            f"{url}/admin/weights",
            json=refresh["body"],
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        refresh["answered_at"] = time.perf_counter()
        if r.status_code != 200:
            raise RuntimeError(f"refresh failed: {r.status_code} {r.text[:300]}")
        refresh["response"] = r.json()

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=n_traj + 4)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
        jobs = [trajectory(i, client) for i in range(n_traj)]
        if refresh is not None:
            jobs.append(trigger(client))
        await asyncio.gather(*jobs)
    return timings


def start_adapter(engine_url: str, model_dir: Path, redis_url: str, log: Path) -> tuple[Any, str]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "adapter",
                "--engines", engine_url, "--model", str(model_dir), "--redis", redis_url,
                "--port", str(port), "--admin-token", ADMIN_TOKEN, "--log-level", "warning",
            ],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"adapter exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise RuntimeError(f"adapter did not start:\n{log.read_text()}")
        time.sleep(0.2)


def added_latency(timings: Timings, redis_url: str, prefix: str, n_traj: int) -> list[float]:
    """Per request: client latency through the adapter minus the adapter's engine call for it
    (``Turn.latency_s`` of the matching recorded turn)."""
    client = redis.Redis.from_url(redis_url)
    added = []
    for i in range(n_traj):
        record = load_trajectory(client, f"{prefix}{i}")
        turns = [t for s in record.segments for t in s.turns]
        for turn, recorded in enumerate(turns):
            start, end = timings.spans[(i, turn)]
            added.append((end - start) - recorded.latency_s)
    if len(added) != len(timings.spans):
        raise RuntimeError("recorded turns and requests do not line up")
    return added


def redis_bytes(redis_url: str, prefix: str) -> int:
    client = redis.Redis.from_url(redis_url)
    total = 0
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
    return total


def record_tokens(redis_url: str, prefix: str, ids: list[str]) -> int:
    client = redis.Redis.from_url(redis_url)
    return sum(load_trajectory(client, i, prefix).n_tokens for i in ids)


# ---------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (8 x 3 turns, 32 tok)")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    n_traj = args.trajectories or (8 if args.quick else 32)
    n_turns = args.turns or (3 if args.quick else 10)
    n_tokens = args.max_tokens or (32 if args.quick else 128)
    if min(n_traj, n_turns, n_tokens) < 1:
        parser.error("--trajectories, --turns and --max-tokens must be >= 1")

    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model_dir = ensure_tiny_model(cache / "tiny-model")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"swerl-bench-adapter-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"trajectories": n_traj, "turns": n_turns, "max_tokens": n_tokens}
    print(f"adapter bench: {n_traj} trajectories x {n_turns} turns x {n_tokens} tokens")

    rec = bench_recorder(model_dir, n_traj, n_turns, n_tokens)
    figures["recording_tokens_per_s"] = rec["tokens_per_s"]
    figures["recording_entry_bytes_per_token"] = rec["entry_bytes_per_token"]
    print(f"  recording path: {rec['tokens_per_s']:,.0f} tokens/s on one core "
          f"({rec['tokens']} tokens in {rec['cpu_s']:.2f} CPU s)")  # fmt: skip

    store = start_redis(appendonly=False)
    engine = launch_reference_server(
        model_dir,
        weight_version="0",
        extra_args=["--max-batch", str(max(16, n_traj))],
        log_dir=work,
        timeout_s=300,
    )
    adapter_proc = None
    try:
        direct = asyncio.run(run_direct(engine.url, model_dir, n_traj, n_turns, n_tokens))
        direct_median = statistics.median(direct.latencies)
        print(f"  direct /generate: median {direct_median * 1000:.0f} ms per request")

        adapter_proc, url = start_adapter(engine.url, model_dir, store.url, work / "adapter.log")
        through = asyncio.run(run_adapter(url, "lat-", n_traj, n_turns, n_tokens))
        through_median = statistics.median(through.latencies)
        added = added_latency(through, store.url, "lat-", n_traj)
        added_median = statistics.median(added)
        figures.update(
            direct_median_s=direct_median,
            adapter_median_s=through_median,
            end_to_end_ratio=through_median / direct_median,
            added_median_s=added_median,
            added_fraction=added_median / direct_median,
        )
        print(f"  through adapter: median {through_median * 1000:.0f} ms per request "
              f"(end-to-end ratio {through_median / direct_median:.3f})")  # fmt: skip
        print(f"  added latency: median {added_median * 1000:.1f} ms per request = "
              f"{100 * added_median / direct_median:.2f} % of the direct call")  # fmt: skip

        ids = [f"lat-{i}" for i in range(n_traj)]
        used = redis_bytes(store.url, "swerl:")
        tokens = record_tokens(store.url, "swerl:", ids)
        figures["redis_bytes_per_token"] = used / tokens
        print(f"  Redis: {used:,} bytes for {tokens:,} recorded tokens = "
              f"{used / tokens:.2f} bytes/token")  # fmt: skip

        refresh: dict[str, Any] = {"body": {"model_path": str(model_dir), "version": 1}}
        refresh_turns = max(2, min(n_turns, 3))
        during = asyncio.run(run_adapter(url, "refresh-", n_traj, refresh_turns, n_tokens, refresh))
        summary = refresh["response"]
        sent = refresh["sent_at"]
        in_flight = [e - s for s, e in during.spans.values() if s <= sent <= e]
        longest = max(in_flight) if in_flight else 0.0
        figures.update(
            gate_closed_s=summary["gate_closed_s"],
            drain_s=summary["drain_s"],
            load_s=summary["load_s"],
            longest_inflight_step_s=longest,
            inflight_at_close=summary["inflight_at_close"],
        )
        print(f"  refresh: gate closed {summary['gate_closed_s'] * 1000:.0f} ms "
              f"(drain {summary['drain_s'] * 1000:.0f} ms + load {summary['load_s'] * 1000:.0f} ms)"
              f"; longest in-flight step {longest * 1000:.0f} ms "
              f"({summary['inflight_at_close']} steps in flight at close)")  # fmt: skip
    finally:
        if adapter_proc is not None:
            adapter_proc.terminate()
            adapter_proc.wait(timeout=30)
        engine.stop()
        stop_redis(store)

    checks = {
        "added latency <= 10% of direct": figures["added_fraction"] <= 0.10,
        "recording >= 50,000 tokens/s": figures["recording_tokens_per_s"] >= 50_000,
        "<= 12 bytes per token": figures["redis_bytes_per_token"] <= 12.0,
        "gate closed <= longest in-flight + 50 ms": (
            figures["gate_closed_s"] <= figures["longest_inflight_step_s"] + 0.050
        ),
    }
    figures["targets"] = checks
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if args.check and not all(checks.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
