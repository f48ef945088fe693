"""OpenHands: one agent conversation against the adapter, locally or in a sandbox.

Modules (import the SDK-dependent ones only where needed; importing the OpenHands SDK costs
~15 CPU-seconds):

* :mod:`.env` -- environment the SDK needs before it is imported (no network at import time).
* :mod:`.config` -- :class:`OpenHandsConfig` (model alias, retries, terminal, condenser...).
* :mod:`.prompt` -- the SWE task instruction built from a problem statement.
* :mod:`.result` -- :class:`EndReason`, :class:`AgentRunResult` and the classification of a
  finished conversation (pure code, no SDK import).
* :mod:`.sdk` -- builds the SDK ``LLM`` and ``Agent`` from a task's sampling and limits.
* :mod:`.conversation` -- :func:`run_agent`: one conversation on a :class:`LocalTarget` or a
  :class:`RemoteTarget`; send the task, run with a wall-time watchdog, classify.
* :mod:`.server` -- start the OpenHands agent server inside a sandbox and reach it from the host.
"""
