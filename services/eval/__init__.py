"""The SWE-bench evaluation script (``python -m services.eval``, ``swerl eval``): a composer.

It combines the shared base (datasets, predictions) with the sandbox plane's grading
(``sandbox_worker.evaluation``: a fresh sandbox per patch, ``grading="swebench"``, the harness's
log layout and run report). docs/eval.md describes usage, outputs and exit codes.
"""
