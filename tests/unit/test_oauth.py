"""Sign in with Gitea, the client's rules: PKCE (S256), state, who is an operator, and
the user's tokens sealed at rest."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest

from forgeflow.domain import oauth
from forgeflow.domain.oauth import OAuthRefused, Pending, Tokens
from forgeflow.web.sealing import seal, unseal


def test_the_challenge_is_rfc_7636s_s256() -> None:
    # RFC 7636 Appendix B.
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert oauth.challenge_of(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_each_sign_in_gets_its_own_state_and_a_valid_verifier() -> None:
    first, second = oauth.start("/ui/tasks"), oauth.start("/ui/tasks")
    assert first.state != second.state and first.verifier != second.verifier
    for p in (first, second):
        assert re.fullmatch(r"[A-Za-z0-9\-._~]{43,128}", p.verifier)
        assert len(p.state) >= 32


def test_the_authorize_url_asks_for_a_code_with_s256() -> None:
    pending = oauth.start("/ui/")
    url = oauth.authorize_url("https://git.example/", "cid", "https://ff.example/", pending)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == (
        "https",
        "git.example",
        "/login/oauth/authorize",
    )
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert q == {
        "client_id": "cid",
        "redirect_uri": "https://ff.example/ui/oauth/callback",
        "response_type": "code",
        "scope": oauth.SCOPE,
        "state": pending.state,
        "code_challenge": oauth.challenge_of(pending.verifier),
        "code_challenge_method": "S256",
    }
    assert pending.verifier not in url  # only its hash travels


def test_a_callback_with_another_state_is_refused() -> None:
    pending = Pending("s" * 43, "v" * 64, "/ui/")
    with pytest.raises(OAuthRefused, match="state"):
        oauth.check_callback(pending, "t" * 43, "code", None)
    with pytest.raises(OAuthRefused, match="state"):
        oauth.check_callback(pending, None, "code", None)
    with pytest.raises(OAuthRefused, match="state"):
        oauth.check_callback(pending, "s" * 42 + "é", "code", None)  # non-ASCII: no crash


def test_a_callback_without_a_started_sign_in_is_refused() -> None:
    with pytest.raises(OAuthRefused, match="not started"):
        oauth.check_callback(None, "s" * 43, "code", None)


def test_a_denied_or_empty_callback_is_refused() -> None:
    pending = Pending("s" * 43, "v" * 64, "/ui/")
    with pytest.raises(OAuthRefused, match="access_denied"):
        oauth.check_callback(pending, pending.state, None, "access_denied")
    with pytest.raises(OAuthRefused, match="no authorization code"):
        oauth.check_callback(pending, pending.state, "", None)
    assert oauth.check_callback(pending, pending.state, "the-code", None) == "the-code"


def test_operators_among_gitea_users() -> None:
    listed = frozenset({"carol"})
    assert oauth.is_operator("Carol", False, listed, False)
    assert not oauth.is_operator("dave", True, listed, False)
    assert oauth.is_operator("dave", True, listed, True)
    assert not oauth.is_operator("erin", False, listed, True)


def test_sealed_tokens_open_only_with_the_same_admin_token() -> None:
    tokens = Tokens("access-token-value", "refresh-token-value", 1234.5)
    sealed = seal("admin-token-" + "x" * 20, tokens)
    assert "access-token-value" not in sealed and "refresh-token-value" not in sealed
    assert unseal("admin-token-" + "x" * 20, sealed) == tokens
    assert unseal("another-token-" + "y" * 20, sealed) is None
    assert "access-token-value" not in repr(tokens)
