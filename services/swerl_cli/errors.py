"""The ``swerl`` exit statuses, and the error that carries one (printed as a message, never a
traceback)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_REJECTED = 1  # the API refused the request (invalid job, conflict, already finished)
EXIT_USAGE = 2  # bad arguments or job file
EXIT_UNREACHABLE = 3  # the API did not answer, or answered with a server error
EXIT_AUTH = 4  # no token, a wrong one, or one without the needed scope
EXIT_NOT_FOUND = 5  # no such job
EXIT_JOB_FAILED = 6  # --wait / --watch: the job failed or was cancelled, or trajectories aborted
EXIT_REDIS_DOWN = 7  # the API answers, but its Redis does not (a 503 "unavailable")

EXIT_CODES_HELP = """\
exit status:
  0  success (with --wait/--watch: the job succeeded)
  1  the API refused the request (invalid job, idempotency conflict, job already finished)
  2  bad arguments or job file
  3  the API is unreachable (not running, wrong --api) or answered with a server error
  4  missing or wrong token, or the token lacks the scope (read / submit / admin)
  5  no such job
  6  with --wait/--watch: the job ended failed or cancelled, or some of its trajectories
     aborted (infrastructure failures; --allow-failed-trajectories: exit 0 for those)
  7  the API answers but its Redis is down (start Redis; GET API/readyz says why)"""


class CliError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
