"""Sign-out ends the session on the server (a copied cookie stops working), and an
operator lists and ends sign-in sessions from the API."""

from __future__ import annotations

import re

import httpx

from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.world import World


def _sign_in(client: httpx.Client, operator: str) -> str:
    form = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    r = client.post(
        "/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN, "operator": operator}
    )
    assert r.status_code == 303, r.text
    cookie = client.cookies.get("ff_session")
    assert cookie
    return cookie


def _page_csrf(client: httpx.Client) -> str:
    page = client.get("/ui/")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _with_cookie(world: World, cookie: str) -> int:
    r = httpx.get(world.ff.url + "/ui/", cookies={"ff_session": cookie})
    return r.status_code


def test_sign_out_ends_the_session_and_a_copied_cookie(world: World) -> None:
    with httpx.Client(base_url=world.ff.url, timeout=30) as client:
        copied = _sign_in(client, "alice")
        assert _with_cookie(world, copied) == 200
        r = client.post("/ui/logout", data={"csrf": _page_csrf(client)})
        assert r.status_code == 303
    assert _with_cookie(world, copied) == 303  # off to the sign-in page: it ended


def test_an_operator_lists_and_ends_sessions(world: World) -> None:
    with httpx.Client(base_url=world.ff.url, timeout=30) as client:
        cookie = _sign_in(client, "bob")
    with world.ff.admin() as admin:
        listed = admin.get("/api/gitea-workflow/ui-sessions").json()["items"]
        mine = [s for s in listed if s["operator"] == "bob"]
        assert len(mine) == 1 and mine[0]["live"] and mine[0]["address"] == "127.0.0.1"
        sid = mine[0]["sessionId"]
        assert cookie not in str(listed)  # the list names sessions, never their cookies
        ended = admin.post(f"/api/gitea-workflow/ui-sessions/{sid}/end")
        assert ended.json() == {"sessionId": sid, "ended": True}
        again = admin.post(f"/api/gitea-workflow/ui-sessions/{sid}/end")
        assert (again.status_code, again.json()["error"]) == (404, "ui_session_not_found")
        assert _with_cookie(world, cookie) == 303
        gone = admin.get("/api/gitea-workflow/ui-sessions", params={"all": "true"}).json()
        row = next(s for s in gone["items"] if s["sessionId"] == sid)
        assert not row["live"] and row["endedBy"] == "admin:api"
        trail = admin.get("/api/gitea-workflow/audit", params={"action": "ui.session.end"})
        assert [e["metadata"]["sessionId"] for e in trail.json()["items"]] == [sid]
