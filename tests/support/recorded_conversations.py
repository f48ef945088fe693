"""Trajectories recorded for real: the adapter's Recorder + a reference engine over HTTP.

Each conversation runs like the adapter runs it: the chat template renders the messages, the
Recorder plans the token ids, the engine's native ``/generate`` samples with logprobs, and the
Recorder commits the turn; the record then goes through the store's binary entry format.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from adapter.engines.sglang import SGLangClient
from adapter.messages import template_messages
from adapter.openai_schema import ChatMessage
from adapter.recorder import Recorder, TurnResult
from adapter.rendering import Renderer
from services.protocol import Outcome, OutcomeStatus, TrajectoryMeta, TrajectoryRecord
from services.protocol.sglang import SamplingParams


async def _converse(
    engine_url: str,
    renderer: Renderer,
    tid: str,
    turns: int,
    version: int,
    seed: int,
    temperature: float,
) -> TrajectoryRecord:
    recorder = Recorder(renderer)
    record = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id=tid, group_id="g0"))
    raw = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": f"Fix the bug number {seed}."},
    ]
    state = None
    async with SGLangClient(engine_url) as client:
        for n in range(turns):
            messages = [ChatMessage.model_validate(m) for m in raw]
            plan = recorder.plan(state, messages, template_messages(messages, False), None,
                                 len(record.segments))  # fmt: skip
            sampling = SamplingParams(
                max_new_tokens=6, temperature=temperature, sampling_seed=seed + n
            )
            out = await client.generate(plan.input_ids, sampling)
            result = TurnResult(
                out.output_ids, out.output_logprobs, version, out.finish_reason.type
            )
            assistant = {"role": "assistant", "content": out.text}
            committed = recorder.commit(state, plan, result, ChatMessage.model_validate(assistant))
            state = committed.state
            for entry in committed.entries:
                record = TrajectoryRecord.from_entries(record.meta, [*record.to_entries(), entry])
            raw += [assistant, {"role": "user", "content": f"Now run the tests ({n})."}]
    outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=float(seed % 2))
    return TrajectoryRecord.from_entries(record.meta, record.to_entries(), outcome)


def record_conversations(
    engine_url: str,
    model_dir: Path,
    n: int,
    turns: int = 2,
    version: int = 0,
    tag: str = "t",
    temperature: float = 1.0,
) -> list[TrajectoryRecord]:
    """``n`` recorded multi-turn trajectories (one prompt group, rewards alternate 0 / 1)."""
    renderer = Renderer(model_dir)

    async def run() -> list[TrajectoryRecord]:
        return [
            await _converse(engine_url, renderer, f"{tag}-{i}", turns, version, i, temperature)
            for i in range(n)
        ]

    return asyncio.run(run())


def update_engine_weights(engine_url: str, model_path: Path, version: int) -> None:
    async def run() -> None:
        async with SGLangClient(engine_url) as client:
            await client.update_weights_from_disk(str(model_path), weight_version=str(version))

    asyncio.run(run())
