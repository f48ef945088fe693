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
   closed, compared with the longest agent step that was in flight when it closed;
6. **capacity** -- ``--concurrency`` trajectories (default 1,000; 64 with ``--quick``) at once,
   each 2 turns of ``max_tokens`` 2 then a close, through one adapter. An error is any non-200
   answer or a client timeout (:data:`CAPACITY_TIMEOUT_S` per request); the bench raises its own
   open-file limit (``resource.setrlimit``) for the sockets, which the adapter and Redis inherit.
   Reported: errors, p50/p99 request latency, the adapter's RSS (current and peak);
7. **large prompt** -- the largest prompt the byte bound lets through to the tokenizer (context
   window x bytes per token) sent :data:`LARGE_PROMPT_REPEATS` times while ``/health`` is polled:
   health latency during it (max, p50), the adapter's RSS before and after, the tokenizer
   process's RSS.

Targets (issue 2, issue 8): added latency <= 10 % of the direct call; recording >= 50,000
tokens/s; <= 12 bytes per token; gate closed <= longest in-flight step + 50 ms; 0 errors with
1,000 concurrent trajectories; /health < 100 ms during a maximal prompt. ``--check`` exits 1 if
one is missed. ``--phases`` runs a subset (``recording,latency,refresh,capacity,large_prompt``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
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
from services.store import load_trajectory  # noqa: E402
from services.tiny_model.build import ensure_tiny_model  # noqa: E402
from tests.support.adapter_process import AdapterProcess, launch_adapter  # noqa: E402
from tests.support.engines import launch_reference_server  # noqa: E402
from tests.support.redis import start_redis, stop_redis  # noqa: E402

ADMIN_TOKEN = "bench-token"
PHASES = ("recording", "latency", "refresh", "capacity", "large_prompt")
CAPACITY_TIMEOUT_S = 600.0  # a capacity request not answered within this is an error
CAPACITY_MAX_TOKENS = 2
LARGE_PROMPT_REPEATS = 3
HEALTH_POLL_S = 0.02
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


def start_adapter(
    engines: list[str], model_dir: Path, redis_url: str, log_dir: Path
) -> AdapterProcess:
    """``python -m adapter`` with the bench's admin token (shared with ``bench_publish``)."""
    extra = ["--admin-token", ADMIN_TOKEN]
    return launch_adapter(engines, model_dir, redis_url, log_dir, extra_args=extra)


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


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of a process in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for pid {pid}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(c) for c in text)
    return children


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file soft limit to ``wanted`` (capped by the hard limit);
    children started afterwards (adapter, Redis) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def run_capacity(url: str, n_traj: int) -> dict[str, Any]:
    """``n_traj`` concurrent trajectories: 2 chat turns each, then a close."""
    latencies: list[float] = []
    errors: dict[str, int] = {}

    def error(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    async def request(client: httpx.AsyncClient, method: str, path: str, body: Any) -> Any:
        start = time.perf_counter()
        try:
            r = await client.request(method, f"{url}{path}", json=body)
        except httpx.TimeoutException:
            error("client timeout")
            return None
        except httpx.HTTPError as exc:
            error(f"transport: {type(exc).__name__}")
            return None
        if r.status_code != 200:
            error(f"{r.status_code}: {r.text[:120]}")
            return None
        latencies.append(time.perf_counter() - start)
        return r.json()

    async def trajectory(i: int, client: httpx.AsyncClient) -> None:
        tid = f"cap-{i}"
        messages = first_messages(i)
        for turn in range(2):
            body = {"messages": messages, "max_tokens": CAPACITY_MAX_TOKENS, "temperature": 1.0}
            answer = await request(client, "POST", f"/t/{tid}/v1/chat/completions", body)
            if answer is None:
                return
            messages = [
                *messages,
                answer["choices"][0]["message"],
                {"role": "user", "content": observation(i, turn)},
            ]
        await request(client, "POST", f"/trajectories/{tid}/close", None)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=n_traj + 4)
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=CAPACITY_TIMEOUT_S, limits=limits) as client:
        await asyncio.gather(*(trajectory(i, client) for i in range(n_traj)))
    return {
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "requests_ok": len(latencies),
        "wall_s": time.perf_counter() - started,
        "p50_s": percentile(latencies, 0.50) if latencies else None,
        "p99_s": percentile(latencies, 0.99) if latencies else None,
    }


async def run_large_prompt(url: str, size: int, repeats: int, pid: int) -> dict[str, Any]:
    """Maximal prompts (``size`` bytes of text) one after another while /health is polled."""
    unit = words(0, 200) + "\n"
    content = (unit * (size // len(unit) + 1))[:size]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    health: list[float] = []
    idle: list[float] = []
    statuses: list[int] = []
    rss_peak = rss_kib(pid)
    async with httpx.AsyncClient(timeout=CAPACITY_TIMEOUT_S) as client:
        for _ in range(100):  # the baseline on this machine, nothing else in flight
            start = time.perf_counter()
            await client.get(f"{url}/health")
            idle.append(time.perf_counter() - start)
            await asyncio.sleep(HEALTH_POLL_S)
        for repeat in range(repeats):
            big = asyncio.create_task(
                client.post(f"{url}/t/large-{repeat}/v1/chat/completions", json=body)
            )
            while not big.done():
                start = time.perf_counter()
                r = await client.get(f"{url}/health")
                if not big.done():  # only answers given while the big request was in flight
                    health.append(time.perf_counter() - start)
                if r.status_code != 200:
                    raise RuntimeError(f"/health answered {r.status_code}")
                rss_peak = max(rss_peak, rss_kib(pid))
                await asyncio.sleep(HEALTH_POLL_S)
            statuses.append((await big).status_code)
        # The 10 MB prompt: refused at the HTTP layer, before it is read.
        huge = {"messages": [{"role": "user", "content": content * (10_000_000 // size + 1)}]}
        start = time.perf_counter()
        refused = await client.post(f"{url}/t/large-huge/v1/chat/completions", json=huge)
        huge_s = time.perf_counter() - start
    return {
        "huge_10mb_status": refused.status_code,
        "huge_10mb_s": huge_s,
        "health_idle_max_s": max(idle),
        "health_idle_p50_s": percentile(idle, 0.5),
        "health_during_n": len(health),
        "health_during_max_s": max(health) if health else None,
        "health_during_p50_s": percentile(health, 0.5) if health else None,
        "big_statuses": statuses,
        "rss_during_peak_kib": rss_peak,
    }


def bench_latency(
    engine_url: str,
    model_dir: Path,
    url: str,
    redis_url: str,
    n_traj: int,
    n_turns: int,
    n_tokens: int,
    figures: dict[str, Any],
) -> None:
    direct = asyncio.run(run_direct(engine_url, model_dir, n_traj, n_turns, n_tokens))
    direct_median = statistics.median(direct.latencies)
    print(f"  direct /generate: median {direct_median * 1000:.0f} ms per request")
    through = asyncio.run(run_adapter(url, "lat-", n_traj, n_turns, n_tokens))
    through_median = statistics.median(through.latencies)
    added = added_latency(through, redis_url, "lat-", n_traj)
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
    used = redis_bytes(redis_url, "swerl:")
    tokens = record_tokens(redis_url, "swerl:", ids)
    figures["redis_bytes_per_token"] = used / tokens
    print(f"  Redis: {used:,} bytes for {tokens:,} recorded tokens = "
          f"{used / tokens:.2f} bytes/token")  # fmt: skip


def bench_refresh(
    url: str, model_dir: Path, n_traj: int, n_turns: int, n_tokens: int, figures: dict[str, Any]
) -> None:
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


def bench_capacity(url: str, pid: int, concurrency: int, figures: dict[str, Any]) -> None:
    rss_before = rss_kib(pid)
    cpu_before = cpu_s(pid)
    result = asyncio.run(run_capacity(url, concurrency))
    result.update(
        adapter_cpu_s=cpu_s(pid) - cpu_before,
        load_average=os.getloadavg(),
        trajectories=concurrency,
        client_timeout_s=CAPACITY_TIMEOUT_S,
        adapter_rss_before_kib=rss_before,
        adapter_rss_after_kib=rss_kib(pid),
        adapter_rss_peak_kib=rss_kib(pid, "VmHWM"),
    )
    figures["capacity"] = result
    p50 = result["p50_s"] or 0.0
    p99 = result["p99_s"] or 0.0
    print(f"  capacity: {concurrency} concurrent trajectories x 2 turns + close: "
          f"{result['errors']} errors {result['error_kinds'] or ''} "
          f"(non-200 or no answer within {CAPACITY_TIMEOUT_S:.0f} s), "
          f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, {result['wall_s']:.1f} s; "
          f"adapter RSS {rss_before / 1024:.0f} -> {result['adapter_rss_after_kib'] / 1024:.0f} "
          f"MiB (peak {result['adapter_rss_peak_kib'] / 1024:.0f} MiB); adapter CPU "
          f"{result['adapter_cpu_s']:.1f} s; load {result['load_average'][0]:.1f}")  # fmt: skip


def bench_large_prompt(url: str, pid: int, model_dir: Path, figures: dict[str, Any]) -> None:
    from adapter.rendering import Renderer

    renderer = Renderer(model_dir)
    size = int(renderer.context_length * renderer.bytes_per_token) - 200
    rss_before = rss_kib(pid)
    result = asyncio.run(run_large_prompt(url, size, LARGE_PROMPT_REPEATS, pid))
    tokenizer_rss = sum(rss_kib(c) for c in child_pids(pid))
    result.update(
        prompt_bytes=size,
        context_tokens=renderer.context_length,
        bytes_per_token=renderer.bytes_per_token,
        repeats=LARGE_PROMPT_REPEATS,
        adapter_rss_before_kib=rss_before,
        adapter_rss_after_kib=rss_kib(pid),
        tokenizer_processes_rss_kib=tokenizer_rss,
    )
    figures["large_prompt"] = result
    worst = result["health_during_max_s"]
    p50 = result["health_during_p50_s"]
    print(f"  large prompt: {LARGE_PROMPT_REPEATS} x {size:,} bytes "
          f"({renderer.context_length} tokens x {renderer.bytes_per_token:g} bytes/token), "
          f"answers {result['big_statuses']}; /health during it: "
          f"{result['health_during_n']} answers, max "
          f"{worst * 1000 if worst is not None else float('nan'):.1f} ms, p50 "
          f"{p50 * 1000 if p50 is not None else float('nan'):.1f} ms (idle: max "
          f"{result['health_idle_max_s'] * 1000:.1f} ms, p50 "
          f"{result['health_idle_p50_s'] * 1000:.1f} ms); adapter RSS "
          f"{rss_before / 1024:.0f} -> {result['adapter_rss_after_kib'] / 1024:.0f} MiB "
          f"(peak during {result['rss_during_peak_kib'] / 1024:.0f} MiB), tokenizer "
          f"processes {tokenizer_rss / 1024:.0f} MiB; a 10 MB prompt: "
          f"{result['huge_10mb_status']} in {result['huge_10mb_s'] * 1000:.0f} ms")  # fmt: skip


# ---------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (8 x 3 turns, 32 tok)")
    parser.add_argument(
        "--trajectories", type=int, default=None, help="trajectories per phase (32; --quick 8)"
    )
    parser.add_argument(
        "--turns", type=int, default=None, help="turns per trajectory (10; --quick 3)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens generated per turn (128; --quick 32)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="capacity phase: concurrent trajectories"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    n_traj = args.trajectories or (8 if args.quick else 32)
    n_turns = args.turns or (3 if args.quick else 10)
    n_tokens = args.max_tokens or (32 if args.quick else 128)
    concurrency = args.concurrency or (64 if args.quick else 1000)
    if min(n_traj, n_turns, n_tokens, concurrency) < 1:
        parser.error("--trajectories, --turns, --max-tokens and --concurrency must be >= 1")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown or not phases:
        parser.error(f"--phases: unknown {unknown}; choose from {PHASES}")

    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model_dir = ensure_tiny_model(cache / "tiny-model")
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"swerl-bench-adapter-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {
        "trajectories": n_traj,
        "turns": n_turns,
        "max_tokens": n_tokens,
        "phases": phases,
    }
    print(f"adapter bench: {n_traj} trajectories x {n_turns} turns x {n_tokens} tokens; "
          f"phases {','.join(phases)}")  # fmt: skip
    checks: dict[str, bool] = {}

    if "recording" in phases:
        rec = bench_recorder(model_dir, n_traj, n_turns, n_tokens)
        figures["recording_tokens_per_s"] = rec["tokens_per_s"]
        figures["recording_entry_bytes_per_token"] = rec["entry_bytes_per_token"]
        print(f"  recording path: {rec['tokens_per_s']:,.0f} tokens/s on one core "
              f"({rec['tokens']} tokens in {rec['cpu_s']:.2f} CPU s)")  # fmt: skip
        checks["recording >= 50,000 tokens/s"] = figures["recording_tokens_per_s"] >= 50_000

    if "capacity" in phases:
        # Sockets: the bench's clients, the adapter's server side and its Redis pool, Redis.
        figures["fd_limit"] = raise_fd_limit(4 * concurrency + 1024)
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
        adapter_proc = start_adapter([engine.url], model_dir, store.url, work)
        url = adapter_proc.url
        if "latency" in phases:
            bench_latency(engine.url, model_dir, url, store.url, n_traj, n_turns, n_tokens, figures)
            checks["added latency <= 10% of direct"] = figures["added_fraction"] <= 0.10
            checks["<= 12 bytes per token"] = figures["redis_bytes_per_token"] <= 12.0
        if "refresh" in phases:
            bench_refresh(url, model_dir, n_traj, n_turns, n_tokens, figures)
            checks["gate closed <= longest in-flight + 50 ms"] = (
                figures["gate_closed_s"] <= figures["longest_inflight_step_s"] + 0.050
            )
        if "capacity" in phases:
            bench_capacity(url, adapter_proc.pid, concurrency, figures)
            checks[f"0 errors with {concurrency} concurrent trajectories"] = (
                figures["capacity"]["errors"] == 0
            )
        if "large_prompt" in phases:
            bench_large_prompt(url, adapter_proc.pid, model_dir, figures)
            during = figures["large_prompt"]["health_during_max_s"]
            checks["/health < 100 ms during a maximal prompt"] = (
                during is not None and during < 0.100
            )
    finally:
        if adapter_proc is not None:
            adapter_proc.stop()
        engine.stop()
        stop_redis(store)

    figures["targets"] = checks
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if args.check and not all(checks.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
