"""The training loop (``python -m trainer train``): phases, collector, step, metrics, resume.

Modules, one job each: :mod:`.config` (section ``train``), :mod:`.phases` (the phase controller
and the readiness switch), :mod:`.prompts` (the data cursor), :mod:`.pool` (landed rollouts and
batch selection), :mod:`.collector` (requests and results through the rollout manager),
:mod:`.step_metrics` and :mod:`.metrics` (per-step metrics, JSONL and TensorBoard),
:mod:`.driver` (the step and the checkpointed loop state), :mod:`.cli`. See docs/training.md.
"""
