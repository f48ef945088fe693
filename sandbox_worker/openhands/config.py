"""Settings of the OpenHands conversation that do not come from the task.

The task (:class:`services.protocol.tasks.RolloutTask`) carries the per-trajectory limits and
sampling parameters; everything here is per deployment: how the SDK talks to the adapter, which
terminal backend the agent gets, whether context condensation is on, how long a stop may take.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.config import StrictModel


class CondenserConfig(StrictModel):
    """OpenHands' ``LLMSummarizingCondenser`` (the paper's "context compression").

    Off by default: condensation rewrites history, so every condensation starts a new segment of
    the trajectory record (the adapter counts it), and the summary call itself is a policy
    generation. ``tracked`` decides where that summary call goes: to the trajectory's own URL (it
    is recorded as a segment of its own and can be trained on) or to the adapter's untracked
    ``/v1`` (not recorded).
    """

    enabled: bool = False
    max_size: int = Field(240, ge=8)  # condense when the view holds more events than this
    keep_first: int = Field(2, ge=0)  # events at the start that are never condensed
    max_tokens: int | None = Field(None, ge=256)  # also condense above this many prompt tokens
    tracked: bool = True

    @model_validator(mode="after")
    def _room_to_condense(self) -> CondenserConfig:
        # The SDK requires keep_first < max_size // 2 - 1 (events kept from the tail).
        if self.max_size // 2 - self.keep_first - 1 <= 0:
            raise ValueError(
                f"condenser.keep_first ({self.keep_first}) must be less than "
                f"max_size // 2 - 1 ({self.max_size // 2 - 1}) to leave room for condensation"
            )
        return self


class OpenHandsConfig(StrictModel):
    """How :func:`run_agent` builds the OpenHands agent and its LLM.

    ``model`` must be ``openai/<name>``: LiteLLM then speaks the plain OpenAI chat-completions
    protocol to ``base_url`` (the adapter) and sends ``<name>`` as the model; the adapter serves
    its one policy whatever the name.
    """

    model: str = Field("openai/swerl-policy", pattern=r"^openai/[A-Za-z0-9._:\-/]+$")
    # Sent by the agent as its bearer token. Sandboxed runs keep this placeholder: the relay
    # replaces it with the trajectory's token on the host (run_agent's llm_api_key: local runs).
    api_key: str = Field("swerl", min_length=1)
    # Per LLM call; a long generation may also wait behind a weight refresh.
    llm_timeout_s: float = Field(900.0, gt=0)
    # Retries of an LLM call the SDK classifies as retryable (connection refused, 5xx, timeout).
    num_retries: int = Field(2, ge=0, le=20)
    retry_min_wait_s: int = Field(2, ge=0)
    retry_max_wait_s: int = Field(8, ge=0)
    # "subprocess" works in every image (task images have no tmux); "auto" lets the SDK pick
    # tmux when it is installed.
    terminal: Literal["subprocess", "tmux", "auto"] = "subprocess"
    condenser: CondenserConfig = Field(default_factory=CondenserConfig)
    # After the wall-time limit or a cancel, the conversation is paused (between agent steps);
    # if it has not stopped this long after, its tools are closed to force the step to end.
    stop_grace_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _retry_window(self) -> OpenHandsConfig:
        if self.retry_min_wait_s > self.retry_max_wait_s:
            raise ValueError(
                f"retry_min_wait_s ({self.retry_min_wait_s}) is larger than "
                f"retry_max_wait_s ({self.retry_max_wait_s})"
            )
        return self
