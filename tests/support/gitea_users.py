"""A world for Sign in with Gitea: two repositories of ``acme`` (``widget`` and the
private ``secret``), a reader and a writer of ``widget`` who cannot see ``secret``, and
forgeflow's OAuth2 application made by the real ``forgeflow gitea connect --oauth``.

The public URL must be known before forgeflow starts (the application's redirect URI),
so forgeflow listens on a port picked first."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.process import FORGEFLOW, clean_env, free_port

BOT = "ccweb-bot"
PASSWORDS = {"rita": "pw-rita-reader", "wendy": "pw-wendy-writer", "alice": "pw-alice"}


@dataclass(frozen=True)
class World:
    gitea: GiteaEmulator
    bot_token: str
    port: int
    widget_issue: int
    secret_issue: int

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def make_world(gitea: GiteaEmulator, data_dir: Path) -> World:
    bot = gitea.add_user(BOT)
    for login, password in PASSWORDS.items():
        gitea.add_user(login)
        gitea.set_password(login, password)
    for repo in ("widget", "secret"):
        gitea.add_repo("acme", repo, private=True)
        gitea.set_permission("acme", repo, BOT, "admin")
        gitea.set_permission("acme", repo, "alice", "write")
    gitea.set_permission("acme", "widget", "rita", "read")
    gitea.set_permission("acme", "widget", "wendy", "write")
    widget = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    secret = gitea.add_issue("acme", "secret", title="Private plans", author="alice")
    world = World(gitea, bot, free_port(), widget, secret)
    out = connect_oauth(world, data_dir)
    assert out.returncode == 0, out.stderr
    return world


def connect_oauth(world: World, data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``forgeflow gitea connect --oauth``, as the operator runs it."""
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(data_dir),
        FORGEFLOW_GITEA_URL=world.gitea.url,
        FORGEFLOW_GITEA_TOKEN=world.bot_token,
        FORGEFLOW_PUBLIC_URL=world.public_url,
    )
    return subprocess.run(
        [FORGEFLOW, "gitea", "connect", "--oauth"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def grant(gitea: GiteaEmulator, authorize_url: str, login: str) -> str:
    """In Gitea's web pages: sign in as ``login`` and authorize the application; the
    callback URL Gitea sends the browser to."""
    web = httpx.Client(base_url=gitea.url, timeout=30)
    first = web.get(authorize_url)
    assert first.status_code == 303, first.text
    back = dict(httpx.QueryParams(urlsplit(first.headers["location"]).query))["redirect_to"]
    signed = web.post(
        "/user/login",
        data={"user_name": login, "password": PASSWORDS[login], "redirect_to": back},
    )
    assert signed.status_code == 303, signed.text
    page = web.get(signed.headers["location"])
    assert page.status_code == 200, page.text
    form = dict(re.findall(r"name='([^']+)' value='([^']*)'", page.text))
    granted = web.post("/login/oauth/grant", data={**form, "granted": "true"})
    assert granted.status_code == 303, granted.text
    location: str = granted.headers["location"]
    return location


def start_sign_in(ff: httpx.Client, next_url: str = "/ui/tasks") -> str:
    """forgeflow's sign-in with Gitea, started: the authorize URL it sends the browser to."""
    started = ff.get("/ui/oauth/start", params={"next": next_url})
    assert started.status_code == 303, started.text
    location: str = started.headers["location"]
    return location


def signed_in_client(world: World, ff_url: str, login: str) -> httpx.Client:
    """An HTTP client signed in to forgeflow as the Gitea user ``login``."""
    ff = httpx.Client(base_url=ff_url, timeout=30)
    callback = grant(world.gitea, start_sign_in(ff), login)
    done = ff.get(callback)
    assert done.status_code == 200 and f">{login}<" in done.text, done.text
    return ff
