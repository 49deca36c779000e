"""The emulator as an OAuth2 provider, over real HTTP, shaped as Gitea 1.22 has it: the
applications API, the sign-in and grant pages, the token endpoint's checks (secret,
one-use code, PKCE verifier, redirect URI, refresh) and userinfo."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator

CALLBACK = "https://ff.example/ui/oauth/callback"
VERIFIER = "v" * 50


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture
def gitea(tmp_path: Path) -> Iterator[GiteaEmulator]:
    emu = GiteaEmulator(tmp_path / "repos")
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


def _app(gitea: GiteaEmulator) -> dict[str, object]:
    bot = gitea.add_user("ccweb-bot")
    made = httpx.post(
        f"{gitea.url}/api/v1/user/applications/oauth2",
        headers={"Authorization": f"token {bot}"},
        json={"name": "forgeflow", "confidential_client": True, "redirect_uris": [CALLBACK]},
    )
    assert made.status_code == 201, made.text
    app: dict[str, object] = made.json()
    return app


def _code(gitea: GiteaEmulator, app: dict[str, object], state: str = "st4te") -> str:
    """Sign in as alice on the web pages and grant the application: the code."""
    gitea.add_user("alice")
    gitea.set_password("alice", "pw-alice")
    web = httpx.Client(base_url=gitea.url)
    query = {
        "client_id": app["client_id"],
        "redirect_uri": CALLBACK,
        "response_type": "code",
        "state": state,
        "code_challenge": _challenge(VERIFIER),
        "code_challenge_method": "S256",
        "scope": "read:repository",
    }
    first = web.get("/login/oauth/authorize", params=query)
    assert first.status_code == 303 and first.headers["location"].startswith("/user/login?")
    signed = web.post(
        "/user/login",
        data={
            "user_name": "alice",
            "password": "pw-alice",
            "redirect_to": "/login/oauth/authorize?" + str(first.request.url.query, "ascii"),
        },
    )
    assert signed.status_code == 303
    page = web.get(signed.headers["location"])
    assert page.status_code == 200 and "Authorize forgeflow" in page.text
    form = dict(re.findall(r"name='([^']+)' value='([^']*)'", page.text))
    granted = web.post("/login/oauth/grant", data={**form, "granted": "true"})
    assert granted.status_code == 303
    target = urlsplit(granted.headers["location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == CALLBACK
    q = parse_qs(target.query)
    assert q["state"] == [state]
    return q["code"][0]


def _token(gitea: GiteaEmulator, **form: str) -> httpx.Response:
    return httpx.post(f"{gitea.url}/login/oauth/access_token", data=form)


def test_the_code_flow_with_pkce_gives_a_token_that_works(gitea: GiteaEmulator) -> None:
    app = _app(gitea)
    assert str(app["client_secret"]).startswith("gto_")
    code = _code(gitea, app)
    base = {
        "grant_type": "authorization_code",
        "client_id": str(app["client_id"]),
        "client_secret": str(app["client_secret"]),
        "redirect_uri": CALLBACK,
        "code": code,
    }
    wrong = _token(gitea, **base, code_verifier="w" * 50)
    assert wrong.status_code == 400
    assert wrong.json() == {
        "error": "unauthorized_client",
        "error_description": "failed PKCE code challenge",
    }
    bad_secret = _token(gitea, **{**base, "client_secret": "nope"}, code_verifier=VERIFIER)
    assert bad_secret.json()["error_description"] == "invalid client secret"
    answer = _token(gitea, **base, code_verifier=VERIFIER)
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    assert tokens["token_type"] == "bearer" and tokens["expires_in"] == 3600
    again = _token(gitea, **base, code_verifier=VERIFIER)  # a code is good once
    assert again.json()["error"] == "unauthorized_client"
    bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
    info = httpx.get(f"{gitea.url}/login/oauth/userinfo", headers=bearer).json()
    assert info["preferred_username"] == "alice" and info["sub"].isdigit()
    me = httpx.get(f"{gitea.url}/api/v1/user", headers=bearer).json()
    assert me["login"] == "alice"
    refreshed = _token(
        gitea,
        grant_type="refresh_token",
        client_id=str(app["client_id"]),
        client_secret=str(app["client_secret"]),
        refresh_token=tokens["refresh_token"],
    )
    assert refreshed.status_code == 200 and refreshed.json()["access_token"]
    reused = _token(
        gitea,
        grant_type="refresh_token",
        client_id=str(app["client_id"]),
        client_secret=str(app["client_secret"]),
        refresh_token=tokens["refresh_token"],
    )
    assert reused.json() == {
        "error": "unauthorized_client",
        "error_description": "token was already used",
    }


def test_userinfo_wants_an_oauth_token(gitea: GiteaEmulator) -> None:
    pat = gitea.add_user("bob")
    answer = httpx.get(
        f"{gitea.url}/login/oauth/userinfo", headers={"Authorization": f"Bearer {pat}"}
    )
    assert answer.status_code == 401 and answer.text == "no valid authorization"


def test_the_applications_api(gitea: GiteaEmulator) -> None:
    app = _app(gitea)
    bot = {"Authorization": f"token {gitea.add_user('ccweb-bot')}"}
    listed = httpx.get(f"{gitea.url}/api/v1/user/applications/oauth2", headers=bot).json()
    assert [(a["client_id"], a["client_secret"]) for a in listed] == [(app["client_id"], "")]
    other = {"Authorization": f"token {gitea.add_user('mallory')}"}
    assert (
        httpx.get(
            f"{gitea.url}/api/v1/user/applications/oauth2/{app['id']}", headers=other
        ).status_code
        == 404
    )
    patched = httpx.patch(
        f"{gitea.url}/api/v1/user/applications/oauth2/{app['id']}",
        headers=bot,
        json={"name": "forgeflow", "confidential_client": True, "redirect_uris": ["https://x/cb"]},
    ).json()
    assert patched["redirect_uris"] == ["https://x/cb"]
    assert patched["client_secret"] and patched["client_secret"] != app["client_secret"]
    missing = httpx.post(
        f"{gitea.url}/api/v1/user/applications/oauth2", headers=bot, json={"name": "x"}
    )
    assert missing.status_code == 422


def test_an_unregistered_redirect_uri_is_an_error_page(gitea: GiteaEmulator) -> None:
    app = _app(gitea)
    page = httpx.get(
        f"{gitea.url}/login/oauth/authorize",
        params={
            "client_id": app["client_id"],
            "redirect_uri": "https://evil/cb",
            "response_type": "code",
        },
    )
    assert page.status_code == 400 and "Unregistered Redirect URI" in page.text
