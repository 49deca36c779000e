"""Sign in with Gitea against the emulator's OAuth2 provider, over real HTTP: the flow's
refusals (a wrong state, a code injected from another sign-in whose verifier is not
ours), what a reader and a writer see and may do, and ``gitea connect --oauth``.
(The browser test, tests/browser/test_gitea_sign_in_ui.py, follows a live transcript.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest

from forgeflow.config import Role
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import WEBHOOK_SECRET, Running, run_forgeflow
from tests.support.gitea_users import (
    World,
    connect_oauth,
    grant,
    make_world,
    signed_in_client,
    start_sign_in,
)


@dataclass
class Site:
    world: World
    ff: Running
    widget_task: str
    secret_task: str


def mention(gitea: GiteaEmulator, repo: str, issue: int) -> str:
    comment = gitea.post_comment("acme", repo, issue, author="alice", body="@ccweb-bot look")
    d = gitea.delivery_of_comment(comment["id"])
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


@pytest.fixture
def site(tmp_path: Path, db_url: str) -> Iterator[Site]:
    """On SQLite and on PostgreSQL (the sealed tokens' table, the filtered reads)."""
    gitea = GiteaEmulator(tmp_path / "gitea-repos")
    gitea.start()
    try:
        world = make_world(gitea, tmp_path / "ff")
        # Ingress only: the tasks stay queued, which is all these pages need.
        with run_forgeflow(
            tmp_path / "ff",
            db_url,
            role=Role.INGRESS,
            listen_port=world.port,
            gitea_url=gitea.url,
            gitea_token=world.bot_token,
            public_url=world.public_url,
        ) as ff:
            for repo in ("widget", "secret"):
                gitea.add_hook("acme", repo, url=ff.webhook_url, secret=WEBHOOK_SECRET)
            widget = mention(gitea, "widget", world.widget_issue)
            secret = mention(gitea, "secret", world.secret_issue)
            yield Site(world, ff, widget, secret)
    finally:
        gitea.stop()


def _token_requests(gitea: GiteaEmulator) -> int:
    return sum(1 for m, p, _ in gitea.requests if (m, p) == ("POST", "/login/oauth/access_token"))


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    return urlunsplit(parts._replace(query=urlencode({**query, **changes})))


def test_a_callback_with_a_wrong_state_is_refused_before_gitea_is_asked(site: Site) -> None:
    ff = httpx.Client(base_url=site.ff.url, timeout=30)
    callback = grant(site.world.gitea, start_sign_in(ff), "rita")
    before = _token_requests(site.world.gitea)
    forged = ff.get(_with_query(callback, state="not-the-state-of-this-sign-in"))
    assert forged.status_code == 400
    assert "does not belong to this sign-in" in forged.text
    assert _token_requests(site.world.gitea) == before  # the code was never spent
    # The flow is over: the real callback, after a refused one, starts nothing either.
    assert ff.get(callback).status_code == 400
    assert ff.get("/ui/tasks").status_code == 303  # still signed out
    with site.ff.admin() as admin:
        events = admin.get(
            "/api/gitea-workflow/audit", params={"action": "ui.signin.reject"}
        ).json()["items"]
    assert {e["errorCode"] for e in events} == {"oauth_bad_state", "oauth_no_flow"}


def test_a_code_from_another_sign_in_fails_pkce(site: Site) -> None:
    """An attacker's code slipped into the victim's callback (with the victim's state):
    the victim's verifier does not match the attacker's challenge, Gitea refuses."""
    attacker = httpx.Client(base_url=site.ff.url, timeout=30)
    attacker_code = parse_qs(
        urlsplit(grant(site.world.gitea, start_sign_in(attacker), "rita")).query
    )["code"][0]
    victim = httpx.Client(base_url=site.ff.url, timeout=30)
    own = grant(site.world.gitea, start_sign_in(victim), "wendy")
    injected = victim.get(_with_query(own, code=attacker_code))
    assert injected.status_code == 400
    assert "Gitea refused the sign-in" in injected.text
    assert victim.get("/ui/tasks").status_code == 303


def test_a_reader_sees_their_repository_and_nothing_else(site: Site) -> None:
    reader = signed_in_client(site.world, site.ff.url, "rita")
    listing = reader.get("/ui/tasks")
    assert listing.status_code == 200
    assert site.widget_task in listing.text and site.secret_task not in listing.text
    assert "acme/secret" not in listing.text  # not even in the repository picker
    assert reader.get("/ui/tasks", params={"repo": "acme/secret"}).text.count("/ui/tasks/") == 0
    sessions = reader.get("/ui/sessions").text
    assert "acme/secret" not in sessions and "acme/widget" in sessions
    own = f"/ui/sessions/default:acme/widget:issue:{site.world.widget_issue}"
    assert reader.get(own).status_code == 200
    page = reader.get(f"/ui/tasks/{site.widget_task}")
    assert page.status_code == 200 and "gitea:rita" in page.text
    assert "/cancel" not in page.text  # a reader has no controls
    for path in (
        f"/ui/tasks/{site.secret_task}",
        f"/ui/live?task={site.secret_task}",
        f"/ui/sessions/default:acme/secret:issue:{site.world.secret_issue}",
        "/ui/tasks/no-such-task",
    ):
        assert reader.get(path).status_code == 404, path
    # The operators' pages are not found either; the overview's counts are of everyone.
    operators_only = ("/ui/repos", "/ui/audit", "/ui/deliveries", "/ui/pipelines")
    for path in (*operators_only, "/ui/repos/default:acme/widget"):
        assert reader.get(path).status_code == 404, path
    assert reader.get("/ui/").headers["location"] == "/ui/tasks"
    # The API is the admin token's: a Gitea user's cookie (path /ui) opens nothing there.
    api = reader.get(f"/api/gitea-workflow/tasks/{site.widget_task}")
    assert api.status_code == 401
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    refused = reader.post(
        f"/ui/tasks/{site.widget_task}/cancel",
        data={"csrf": csrf.group(1), "requestId": "r-1", "next": "/ui/tasks"},
    )
    assert refused.status_code == 403
    hidden = reader.post(
        f"/ui/tasks/{site.secret_task}/cancel",
        data={"csrf": csrf.group(1), "requestId": "r-2", "next": "/ui/tasks"},
    )
    assert hidden.status_code == 404
    with site.ff.admin() as admin:
        states = [
            admin.get(f"/api/gitea-workflow/tasks/{t}").json()["task"]["state"]
            for t in (site.widget_task, site.secret_task)
        ]
    assert states == ["queued", "queued"]


def test_the_live_marker_of_a_reader_ignores_other_repositories(site: Site) -> None:
    reader = signed_in_client(site.world, site.ff.url, "rita")
    before = reader.get("/ui/live").json()["stamp"]
    mention(site.world.gitea, "secret", site.world.secret_issue)
    assert reader.get("/ui/live").json()["stamp"] == before
    mention(site.world.gitea, "widget", site.world.widget_issue)
    assert reader.get("/ui/live").json()["stamp"] != before


def test_a_writer_cancels_a_task_of_their_repository(site: Site) -> None:
    writer = signed_in_client(site.world, site.ff.url, "wendy")
    page = writer.get(f"/ui/tasks/{site.widget_task}")
    assert f"/ui/tasks/{site.widget_task}/cancel" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    done = writer.post(
        f"/ui/tasks/{site.widget_task}/cancel",
        data={"csrf": csrf.group(1), "requestId": "w-1", "next": f"/ui/tasks/{site.widget_task}"},
    )
    assert done.status_code == 303
    with site.ff.admin() as admin:
        detail = admin.get(f"/api/gitea-workflow/tasks/{site.widget_task}").json()
        events = admin.get("/api/gitea-workflow/audit", params={"taskId": site.widget_task}).json()
    assert detail["task"]["state"] == "cancelled"
    assert any(e["actor"] == "gitea:wendy" for e in events["items"])
    # Pause is an operator's: not found for a Gitea user, and nothing paused.
    paused = writer.post("/ui/control/pause", data={"csrf": csrf.group(1), "requestId": "w-2"})
    assert paused.status_code == 404


def test_a_removed_reader_loses_the_repository_once_the_cache_is_over(site: Site) -> None:
    site.ff.settings.oauth_access_cache_seconds = 0.0
    reader = signed_in_client(site.world, site.ff.url, "rita")
    assert reader.get(f"/ui/tasks/{site.widget_task}").status_code == 200
    site.world.gitea.set_permission("acme", "widget", "rita", "none")
    assert reader.get(f"/ui/tasks/{site.widget_task}").status_code == 404


def test_connect_oauth_is_idempotent_and_repairs_a_changed_redirect(
    site: Site, tmp_path: Path
) -> None:
    gitea, data = site.world.gitea, tmp_path / "ff"
    [app] = gitea.oauth_apps("ccweb-bot")
    again = connect_oauth(site.world, data)
    assert again.returncode == 0 and "is up to date" in again.stdout
    assert gitea.oauth_apps("ccweb-bot")[0]["client_secret"] == app["client_secret"]
    stored = json.loads((data / "gitea_oauth.json").read_text())
    assert stored == {"client_id": app["client_id"], "client_secret": app["client_secret"]}
    assert (data / "gitea_oauth.json").stat().st_mode & 0o777 == 0o600
    assert app["client_secret"] not in again.stdout + again.stderr
    # Someone edited the application in Gitea: the next connect puts the callback back.
    with httpx.Client(
        base_url=gitea.url, headers={"Authorization": f"token {site.world.bot_token}"}
    ) as c:
        c.patch(
            f"/api/v1/user/applications/oauth2/{app['id']}",
            json={
                "name": "forgeflow",
                "confidential_client": True,
                "redirect_uris": ["https://x/cb"],
            },
        ).raise_for_status()
    repaired = connect_oauth(site.world, data)
    assert repaired.returncode == 0 and "update OAuth2 application" in repaired.stdout
    [now] = gitea.oauth_apps("ccweb-bot")
    assert now["redirect_uris"] == [site.world.public_url + "/ui/oauth/callback"]
    stored = json.loads((data / "gitea_oauth.json").read_text())
    assert stored["client_secret"] == now["client_secret"] != app["client_secret"]


def test_an_expiring_token_is_refreshed_and_a_refused_refresh_signs_out(site: Site) -> None:
    gitea = site.world.gitea
    site.ff.settings.oauth_access_cache_seconds = 0.0  # every page asks Gitea
    gitea.oauth_access_seconds(30)  # inside forgeflow's refresh margin: refresh each time
    reader = signed_in_client(site.world, site.ff.url, "rita")
    refreshes = len(gitea.oauth_tokens())
    assert reader.get(f"/ui/tasks/{site.widget_task}").status_code == 200
    assert len(gitea.oauth_tokens()) == refreshes + 2  # a new access and refresh token
    assert reader.get(f"/ui/tasks/{site.widget_task}").status_code == 200
    # The application is deleted in Gitea: its grants go, the refresh is refused, the
    # session ends and the reader is sent to sign in again.
    [app] = gitea.oauth_apps("ccweb-bot")
    with httpx.Client(
        base_url=gitea.url, headers={"Authorization": f"token {site.world.bot_token}"}
    ) as c:
        c.delete(f"/api/v1/user/applications/oauth2/{app['id']}").raise_for_status()
    gone = reader.get(f"/ui/tasks/{site.widget_task}")
    assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/login")
    assert reader.get("/ui/tasks").status_code == 303  # the session itself ended


def test_a_listed_login_is_an_operator(site: Site) -> None:
    site.ff.settings.oauth_operators = "Wendy, someone-else"
    operator = signed_in_client(site.world, site.ff.url, "wendy")
    assert operator.get("/ui/repos").status_code == 200
    listing = operator.get("/ui/tasks").text
    assert site.widget_task in listing and site.secret_task in listing
    reader = signed_in_client(site.world, site.ff.url, "rita")
    assert reader.get("/ui/repos").status_code == 404


def test_a_writer_reusing_an_operators_request_id_learns_nothing_of_other_repositories(
    site: Site,
) -> None:
    """requestIds are one namespace for the API and the pages: an operator's earlier
    control (by an id a script chose, like ``nightly-1``) must not be named to a Gitea
    user who sends the same id, or its answer would name a task and a repository they
    cannot read."""
    with site.ff.admin() as admin:
        for path, request_id in (
            (f"/api/gitea-workflow/tasks/{site.secret_task}/cancel", "nightly-1"),
            ("/api/gitea-workflow/repos/default:acme/secret/disable", "nightly-2"),
        ):
            body = {"requestId": request_id, "reason": "ops", "operator": "ops"}
            assert admin.post(path, json=body).status_code == 200, path
    writer = signed_in_client(site.world, site.ff.url, "wendy")
    page = writer.get(f"/ui/tasks/{site.widget_task}")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    for request_id in ("nightly-1", "nightly-2"):
        done = writer.post(
            f"/ui/tasks/{site.widget_task}/cancel",
            data={"csrf": csrf.group(1), "requestId": request_id, "next": "/ui/tasks"},
        )
        assert done.status_code == 303
        shown = writer.get(done.headers["location"]).text
        assert "request_id_conflict" in shown  # refused, as before
        assert site.secret_task not in shown and "acme/secret" not in shown, request_id
    with site.ff.admin() as admin:
        widget = admin.get(f"/api/gitea-workflow/tasks/{site.widget_task}").json()
        # The admin token is still told what the id was used for.
        again = admin.post(
            f"/api/gitea-workflow/tasks/{site.widget_task}/cancel",
            json={"requestId": "nightly-1", "reason": "ops", "operator": "ops"},
        )
    assert widget["task"]["state"] == "queued"
    assert again.status_code == 409 and site.secret_task in again.json()["message"]
