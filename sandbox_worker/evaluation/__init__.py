"""Reward evaluation with SWE-bench semantics: apply a patch in a fresh sandbox, run the
instance's tests, grade the log as ``swebench.harness.grading`` does."""

from sandbox_worker.evaluation.evaluate import EvalConfig, EvalReport, evaluate_patch

__all__ = ["EvalConfig", "EvalReport", "evaluate_patch"]
