"""The toy task "lookup then answer" as a task kind of the sandbox worker (no container)."""

from sandbox_worker.toy.runner import (
    ChatEndpoint,
    LLMCallError,
    ToyTrajectoryRunner,
    tool_latency_s,
)

__all__ = ["ChatEndpoint", "LLMCallError", "ToyTrajectoryRunner", "tool_latency_s"]
