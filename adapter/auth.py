"""Who may call what on the adapter: worker, admin and per-trajectory credentials.

Three bearer credentials (``Authorization: Bearer <token>``), each checked in constant time:

* **worker token** (``adapter.worker_token``, shared with the sandbox workers' config): open,
  close and read trajectory records (``/trajectories...``); with the default policy also the
  untracked ``/v1/chat/completions``. Setting it is what puts the adapter in *training mode*.
* **trajectory token**: issued by ``POST /trajectories`` (returned once in the answer, stored as
  its SHA-256 with the record) and required on every ``/t/<id>/`` call of that trajectory. The
  worker hands it to the host side of the sandbox relay, which adds it to the sandbox's
  requests: nothing inside the sandbox ever holds it.
* **admin token** (``adapter.admin_token``): ``/admin`` routes only; distinct from the worker's.

Without a worker token (development, ad-hoc evaluation) nothing but ``/admin`` is checked, as
the start-up warning says; the sandbox relay still confines each sandbox to its own trajectory.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from enum import StrEnum

from starlette.datastructures import Headers

from adapter.errors import APIError

TOKEN_PREFIX = "swt_"  # makes a leaked trajectory token recognisable in logs and scanners


class UntrackedPolicy(StrEnum):
    """Who may call the untracked ``/v1/chat/completions`` (nothing is recorded there)."""

    OPEN = "open"  # anyone who reaches the adapter
    WORKER_TOKEN = "worker_token"  # callers holding the worker token
    OFF = "off"  # nobody: 403


def new_trajectory_token() -> str:
    """A fresh per-trajectory bearer token (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What the store keeps of a trajectory token (hex SHA-256; the token itself is never kept)."""
    return hashlib.sha256(_bytes(token)).hexdigest()


def _bytes(text: str) -> bytes:
    # Header values arrive as latin-1 decoded str; any code point must compare, never raise.
    return text.encode("utf-8", "surrogatepass")


def bearer_token(headers: Headers) -> str | None:
    """The bearer token of a request, or None when there is not exactly one well-formed one."""
    values = headers.getlist("authorization")
    if len(values) != 1:
        return None
    scheme, _, token = values[0].partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time equality of a presented token and a configured one."""
    return given is not None and hmac.compare_digest(_bytes(given), _bytes(expected))


def matches_digest(given: str | None, digest: str | None) -> bool:
    """Constant-time check of a presented trajectory token against the stored digest."""
    if given is None or not digest:
        return False
    return hmac.compare_digest(token_digest(given).encode(), digest.encode())


class AccessControl:
    """The adapter's checks, built from its config (see the module docstring)."""

    def __init__(
        self,
        *,
        worker_token: str | None,
        admin_token: str | None,
        untracked: UntrackedPolicy,
    ) -> None:
        self.worker_token = worker_token
        self.admin_token = admin_token
        self.untracked = untracked

    @property
    def training_mode(self) -> bool:
        """Trajectory routes are credentialed (a worker token is configured)."""
        return self.worker_token is not None

    def require_worker(self, headers: Headers) -> None:
        """Open / close / read of trajectory records: the worker's alone in training mode."""
        if self.worker_token is None:
            return
        if not same_secret(bearer_token(headers), self.worker_token):
            raise APIError(
                401,
                "trajectory records are managed by the sandbox workers: missing or wrong "
                "worker bearer token (adapter.worker_token)",
            )

    def require_admin(self, headers: Headers) -> None:
        if not self.admin_token:
            raise APIError(403, "admin routes are disabled: set adapter.admin_token")
        if not same_secret(bearer_token(headers), self.admin_token):
            raise APIError(401, "missing or wrong admin bearer token")

    def require_untracked(self, headers: Headers) -> None:
        if self.untracked is UntrackedPolicy.OPEN:
            return
        if self.untracked is UntrackedPolicy.OFF:
            raise APIError(
                403,
                "untracked completions are disabled (adapter.untracked_completions: off); "
                "use a trajectory's /t/<id>/v1",
            )
        assert self.worker_token is not None  # the config refuses worker_token policy without it
        if not same_secret(bearer_token(headers), self.worker_token):
            raise APIError(
                401,
                "untracked completions need the worker bearer token "
                "(adapter.untracked_completions: worker_token)",
            )

    def require_trajectory(
        self, trajectory_id: str, headers: Headers, digest: str | None, *, known: bool
    ) -> None:
        """A ``/t/<id>/`` call must carry that trajectory's own token (training mode)."""
        if not self.training_mode:
            return
        if not known or not matches_digest(bearer_token(headers), digest):
            raise APIError(
                401,
                f"missing or wrong trajectory token for {trajectory_id!r} (issued by "
                "POST /trajectories to the trajectory's worker)",
            )
