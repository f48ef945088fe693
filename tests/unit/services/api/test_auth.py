"""Bearer tokens and scopes: read / submit / admin (admin implies the others)."""

from __future__ import annotations

import pytest

from services.api.auth import ANONYMOUS, Authenticator, AuthError
from services.api.config import ApiToken, Scope

TOKENS = [
    ApiToken(name="viewer", token="viewer-token", scopes=[Scope.READ]),
    ApiToken(name="ci", token="ci-token-123", scopes=[Scope.READ, Scope.SUBMIT]),
    ApiToken(name="ops", token="ops-token-123", scopes=[Scope.ADMIN]),
]


@pytest.mark.parametrize(
    ("token", "scope", "allowed"),
    [
        ("viewer-token", Scope.READ, True),
        ("viewer-token", Scope.SUBMIT, False),
        ("ci-token-123", Scope.SUBMIT, True),
        ("ci-token-123", Scope.ADMIN, False),
        ("ops-token-123", Scope.READ, True),
        ("ops-token-123", Scope.SUBMIT, True),
    ],
)
def test_scopes(token: str, scope: Scope, allowed: bool) -> None:
    auth = Authenticator(TOKENS)
    if allowed:
        assert auth.require(f"Bearer {token}", scope).name in {"viewer", "ci", "ops"}
    else:
        with pytest.raises(AuthError) as err:
            auth.require(f"Bearer {token}", scope)
        assert err.value.status == 403 and scope.value in err.value.message


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic ci-token-123", "Bearer nope"])
def test_missing_or_wrong_token_is_401(header: str | None) -> None:
    with pytest.raises(AuthError) as err:
        Authenticator(TOKENS).require(header, Scope.READ)
    assert err.value.status == 401


def test_the_token_names_the_principal() -> None:
    who = Authenticator(TOKENS).principal("bearer  ci-token-123")
    assert who.name == "ci" and who.scopes == {Scope.READ, Scope.SUBMIT}


def test_no_tokens_is_open_development_mode() -> None:
    who = Authenticator([]).require(None, Scope.ADMIN)
    assert who.name == ANONYMOUS
