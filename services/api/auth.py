"""Who may call the job API: bearer tokens from the config, each with scopes.

``Authorization: Bearer <token>``; scopes ``read`` (list, read jobs, results, logs),
``submit`` (submit, cancel one's own jobs) and ``admin`` (all of it, any job). A job records
the name of the token that submitted it. With no tokens configured the API runs in development
mode: every caller is ``anonymous`` with every scope (the start-up log warns).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from services.api.config import ApiToken, Scope

ANONYMOUS = "anonymous"


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[Scope]

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes


class Authenticator:
    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        self.tokens = list(tokens)

    @property
    def open(self) -> bool:
        return not self.tokens

    def principal(self, authorization: str | None) -> Principal:
        """The caller of a request with this ``Authorization`` header; AuthError(401) if none."""
        if self.open:
            return Principal(ANONYMOUS, frozenset(Scope))
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
        given = token.strip().encode("utf-8", "surrogatepass")
        found = None
        for entry in self.tokens:  # compare with every token: time does not tell which matched
            if hmac.compare_digest(given, entry.token.get_secret_value().encode()):
                found = entry
        if found is None:
            raise AuthError(401, "invalid bearer token")
        return Principal(found.name, frozenset(found.scopes))

    def require(self, authorization: str | None, scope: Scope) -> Principal:
        who = self.principal(authorization)
        if not who.allows(scope):
            raise AuthError(403, f"token {who.name!r} lacks the {scope.value!r} scope")
        return who
