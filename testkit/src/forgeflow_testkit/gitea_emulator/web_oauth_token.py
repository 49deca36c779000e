"""Gitea's token endpoint, ``POST /login/oauth/access_token`` (routers/web/auth/
oauth2_provider.go AccessTokenOAuth, handleAuthorizationCode, handleRefreshToken): the
checks in Gitea's order, each refusal a 400 with RFC 6749's ``error`` and Gitea's
``error_description``."""

from __future__ import annotations

import secrets
from typing import Any

from .state import State

Answer = tuple[int, dict[str, Any]]


def _error(code: str, description: str) -> Answer:
    return 400, {"error": code, "error_description": description}


def exchange(state: State, form: dict[str, str]) -> Answer:
    grant_type = form.get("grant_type", "")
    if grant_type == "authorization_code":
        return _authorization_code(state, form)
    if grant_type == "refresh_token":
        return _refresh(state, form)
    return _error(
        "unsupported_grant_type", "Only refresh_token or authorization_code grant type is supported"
    )


def _client(state: State, form: dict[str, str], bad_secret_code: str) -> Answer | None:
    app = state.oauth.app_by_client_id(form.get("client_id", ""))
    if app is None:
        return _error(
            "invalid_client", f"cannot load client with client id: '{form.get('client_id', '')}'"
        )
    secret = form.get("client_secret", "")
    if app.confidential_client and not secrets.compare_digest(secret, app.client_secret):
        return _error(
            bad_secret_code,
            "invalid empty client secret" if not secret else "invalid client secret",
        )
    return None


def _authorization_code(state: State, form: dict[str, str]) -> Answer:
    refused = _client(state, form, "unauthorized_client")
    if refused is not None:
        return refused
    store = state.oauth
    app = store.app_by_client_id(form["client_id"])
    assert app is not None
    uri = form.get("redirect_uri", "")
    if uri and uri not in app.redirect_uris:
        return _error("unauthorized_client", "unexpected redirect URI")
    code = store.codes.get(form.get("code", ""))
    if code is None or code.used:
        return _error("unauthorized_client", "client is not authorized")
    if code.expires <= state.now():
        del store.codes[code.code]
        return _error("invalid_grant", "authorization code expired")
    if not code.validate_challenge(form.get("code_verifier", "")):
        return _error("unauthorized_client", "failed PKCE code challenge")
    if code.redirect_uri and uri != code.redirect_uri:
        return _error(
            "invalid_grant", "redirect_uri differs from the original authorization request"
        )
    grant = store.grants.get(code.grant_id)
    if grant is None or grant.app_id != app.id:
        return _error("invalid_grant", "invalid grant")
    del store.codes[code.code]  # one use
    return 200, store.issue(grant, state.tokens, state.now())


def _refresh(state: State, form: dict[str, str]) -> Answer:
    refused = _client(state, form, "invalid_client")
    if refused is not None:
        return refused
    store = state.oauth
    app = store.app_by_client_id(form["client_id"])
    assert app is not None
    found = store.refresh.get(form.get("refresh_token", ""))
    if found is None:
        return _error("unauthorized_client", "unable to parse refresh token")
    grant = store.grants.get(found[0])
    if grant is None:
        return _error("invalid_grant", "grant does not exist")
    if grant.app_id != app.id:
        return _error("invalid_grant", "refresh token belongs to a different client")
    if grant.counter != found[1]:  # InvalidateRefreshTokens (Gitea's default: on)
        return _error("unauthorized_client", "token was already used")
    return 200, store.issue(grant, state.tokens, state.now())
