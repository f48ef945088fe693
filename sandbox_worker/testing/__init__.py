"""Test machinery of the sandbox worker, shipped as a supported module (nothing here runs a
real trajectory; each double says what it stands for).

* :mod:`.simulated` -- :class:`SimulatedRunner`, a :class:`~sandbox_worker.runner.TrajectoryRunner`
  that only sleeps (``--backend simulated``: scheduling tests and benchmarks), steered by the
  *directive language* of instance ids (``task7.sleep250.abort1``, see
  :class:`SimulatedDirectives`).
* :mod:`.probe` -- :class:`SimulatedProbe`, the Redis record of simulated runs (starts, ends,
  highest concurrency per node) that tests and benchmarks read, independent of the queue's own
  bookkeeping.
* :mod:`.local_sandbox` -- :class:`LocalDirBackend`, a
  :class:`~sandbox_worker.backends.SandboxBackend` without isolation (host directories, the
  host's bash) for the evaluation's and the runner's unit tests; the part of the backend
  contract it honours is run against it in tests/integration/sandbox_worker/backends.
"""
