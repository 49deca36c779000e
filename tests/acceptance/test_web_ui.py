"""The admin pages without a browser: sessions, CSRF, escaping and secrets (issue 6).

The browser scenarios are in ``tests/browser``; these run on both databases.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from forgeflow.web.security import signing_key
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.support.world import World

GET_PAGES = [
    "/ui/",
    "/ui/tasks",
    "/ui/tasks/gitea-task-000",
    "/ui/sessions",
    "/ui/repos",
    "/ui/repos/default:acme/widget",
    "/ui/deliveries",
    "/ui/audit",
    "/ui/audit/export.jsonl",
    "/ui/live",
    "/ui/pipelines",
    "/ui/pipelines/runs",
    "/ui/pipelines/templates/tpl",
    "/ui/pipelines/runs/run-000",
]
POST_ROUTES = [
    "/ui/control/pause",
    "/ui/control/resume",
    "/ui/repos/default:acme/widget/disable",
    "/ui/repos/default:acme/widget/enable",
    "/ui/tasks/gitea-task-000/cancel",
    "/ui/tasks/gitea-task-000/abort",
    "/ui/tasks/gitea-task-000/release",
    "/ui/logout",
    "/ui/pipelines/templates/tpl/enable",
    "/ui/pipelines/templates/tpl/disable",
    "/ui/pipelines/templates/tpl/runs",
    "/ui/pipelines/runs/run-000/cancel",
    "/ui/pipelines/runs/run-000/steps/gate/approve",
    "/ui/pipelines/runs/run-000/steps/gate/reject",
]
XSS = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
TEMPLATE = {
    "key": "tpl",
    "name": XSS,
    "description": XSS,
    "enabled": True,
    "inputs": [{"name": "note", "type": "string", "description": XSS, "default": XSS}],
    "nodes": [
        {"id": "trigger", "kind": "trigger"},
        {
            "id": "route",
            "kind": "router",
            "bodyKey": "pipeline.condition",
            "extras": {"switchKey": "inputs.note", "default": XSS},
        },
        {"id": "gate", "kind": "listen", "bodyKey": "human.gate", "inputs": {"message": XSS}},
    ],
    "edges": [
        {"from": "trigger", "to": "route"},
        {"from": "route", "to": "gate", "routeKey": XSS},
    ],
    "triggers": [{"type": "manual"}, {"type": "webhook"}],
}


def _mention(world: World, text: str, author: str = "alice") -> str:
    comment = world.gitea.post_comment("acme", "widget", world.issue, author=author, body=text)
    d = world.gitea.delivery_of_comment(comment["id"])
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no CSRF field"
    return found.group(1)


@contextmanager
def _sign_in(world: World, operator: str = "alice") -> Iterator[httpx.Client]:
    with httpx.Client(base_url=world.ff.url, timeout=30) as client:
        form = client.get("/ui/login")
        r = client.post(
            "/ui/login",
            data={"csrf": _csrf(form.text), "token": ADMIN_TOKEN, "operator": operator},
        )
        assert r.status_code == 303, r.text
        yield client


def _pipeline(world: World) -> tuple[str, str]:
    """A template with free text everywhere and a webhook trigger; (run id, its token)."""
    with world.ff.admin() as admin:
        created = admin.post("/api/pipelines/templates", json=TEMPLATE)
        assert created.status_code == 201, created.text
        hook = next(t for t in created.json()["template"]["triggers"] if t["type"] == "webhook")
        started = admin.post(
            "/api/pipelines/templates/tpl/runs", json={"requestId": "run-1", "inputs": {}}
        )
        assert started.status_code == 201, started.text
    run_id: str = started.json()["run"]["runId"]
    token: str = hook["webhookPath"].rsplit("/", 1)[1]
    return run_id, token


def _forged_cookie(key: bytes, payload: dict[str, object]) -> str:
    """A session cookie built by hand, the way the server signs one."""
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=")
    mac = base64.urlsafe_b64encode(hmac.new(key, body, hashlib.sha256).digest()).rstrip(b"=")
    return f"{body.decode()}.{mac.decode()}"


def test_every_page_and_form_needs_a_session(world: World) -> None:
    now = int(time.time())
    good = {"op": "x", "csrf": "c" * 43, "typ": "s"}
    cookies: list[dict[str, str]] = [
        {},
        {"ff_session": "garbage"},
        {"ff_session": _forged_cookie(signing_key("another token"), {**good, "iat": now})},
        {"ff_session": _forged_cookie(signing_key(ADMIN_TOKEN), {**good, "iat": now - 86400})},
        {"ff_session": _forged_cookie(signing_key(ADMIN_TOKEN), {**good, "typ": "f", "iat": now})},
    ]
    for jar in cookies:
        with httpx.Client(base_url=world.ff.url, cookies=jar) as client:
            for path in GET_PAGES:
                r = client.get(path)
                assert r.status_code == 303, (path, jar, r.status_code)
                assert r.headers["location"].startswith("/ui/login?next=")
            for path in POST_ROUTES:
                r = client.post(path, data={"csrf": "c" * 43, "requestId": "r-1"})
                assert r.status_code == 403, (path, jar, r.status_code)
    with world.ff.admin() as admin:
        overview = admin.get("/api/gitea-workflow/overview").json()
        assert overview["globalPaused"] is False
        assert (
            admin.get("/api/gitea-workflow/audit", params={"action": "control.pause"}).json()[
                "items"
            ]
            == []
        )
    # The sign-in form is a form too: without its own token it is refused.
    r = httpx.post(world.ff.url + "/ui/login", data={"token": ADMIN_TOKEN, "operator": "a"})
    assert r.status_code == 403


def test_sign_in_sets_a_strict_http_only_signed_cookie(world: World) -> None:
    with httpx.Client(base_url=world.ff.url) as client:
        form = client.get("/ui/login")
        assert form.status_code == 200
        wrong = client.post(
            "/ui/login",
            data={"csrf": _csrf(form.text), "token": "not-the-token-xyz", "operator": "bob"},
        )
        assert wrong.status_code == 401 and "not-the-token-xyz" not in wrong.text
        assert "ff_session" not in client.cookies
        bad_name = client.post(
            "/ui/login",
            data={"csrf": _csrf(form.text), "token": ADMIN_TOKEN, "operator": "<b>x</b>"},
        )
        assert bad_name.status_code == 400 and "<b>x" not in bad_name.text
        ok = client.post(
            "/ui/login",
            data={
                "csrf": _csrf(form.text),
                "token": ADMIN_TOKEN,
                "operator": "bob",
                "next": "/ui/repos",
            },
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/repos"
        cookie = next(c for c in ok.headers.get_list("set-cookie") if c.startswith("ff_session="))
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/ui"} <= attributes
        assert "secure" not in attributes  # plain http here
        assert ADMIN_TOKEN not in cookie
        assert client.get("/ui").headers["location"].endswith("/ui/")
        page = client.get("/ui/repos")
        assert page.status_code == 200 and "admin:bob" in page.text
        # The page's title is its name, and its roots' table stands once, in its body.
        assert "<title>Repositories · forgeflow</title>" in page.text
        assert page.text.count('id="repo-roots"') == 1
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        out = client.post("/ui/logout", data={"csrf": _csrf(page.text)})
        assert out.status_code == 303
        assert client.get("/ui/repos").status_code == 303
    # Behind a TLS proxy the cookie is Secure.
    with httpx.Client(base_url=world.ff.url) as client:
        form = client.get("/ui/login")
        r = client.post(
            "/ui/login",
            data={"csrf": _csrf(form.text), "token": ADMIN_TOKEN, "operator": "tls"},
            headers={"X-Forwarded-Proto": "https"},
        )
        cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("ff_session="))
        assert "secure" in {p.strip().lower() for p in cookie.split(";")}
    with _sign_in(world) as client:
        # An open redirect through ``next`` goes nowhere.
        r = client.get("/ui/login", params={"next": "https://evil.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/"
        # Bad query parameters get a page, not a crash.
        for path in [
            "/ui/tasks?offset=-1",
            "/ui/audit?before=0",
            "/ui/audit?before=99999999999999999999",
            "/ui/tasks?repo=%00",
            "/ui/tasks/a%00b",
        ]:
            r = client.get(path)
            assert r.status_code == 400 and "Bad request" in r.text, path
        token = _csrf(client.get("/ui/").text)
        r = client.post("/ui/control/pause", data={"csrf": token, "requestId": "n\x00ul"})
        assert r.status_code == 400


def test_a_post_without_the_csrf_token_is_refused(world: World) -> None:
    with _sign_in(world, operator="carol") as client:
        token = _csrf(client.get("/ui/").text)
        for data, headers in [
            ({"requestId": "p-1"}, {}),
            ({"requestId": "p-1", "csrf": "x" * 43}, {}),
            ({"requestId": "p-1", "csrf": token}, {"Sec-Fetch-Site": "cross-site"}),
        ]:
            r = client.post("/ui/control/pause", data=data, headers=headers)
            assert r.status_code == 403, (data, headers)
        with world.ff.admin() as admin:
            assert admin.get("/api/gitea-workflow/overview").json()["globalPaused"] is False
        # The real form works, and a double submit of it acts once.
        for _ in range(2):
            r = client.post(
                "/ui/control/pause",
                data={"requestId": "p-1", "csrf": token, "reason": "deploy", "next": "/ui/"},
            )
            assert r.status_code == 303 and r.headers["location"] == "/ui/"
        page = client.get("/ui/").text
        assert "Repeated request: nothing was done again." in page
        assert "deploy" in page
        with world.ff.admin() as admin:
            assert admin.get("/api/gitea-workflow/overview").json()["globalPaused"] is True
            events = admin.get("/api/gitea-workflow/audit", params={"action": "control.pause"})
            assert [e["actor"] for e in events.json()["items"]] == ["admin:carol"]
        export = client.get("/ui/audit/export.jsonl", params={"action": "control.pause"})
        assert export.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in export.text.splitlines()]
        assert [(e["action"], e["actor"]) for e in lines] == [("control.pause", "admin:carol")]


def test_stored_text_is_escaped_everywhere(world: World) -> None:
    # Gitea allows only [A-Za-z0-9_.-] in logins; the emulator takes anything, so the
    # author is free text here, like the instruction.
    author = 'eve"><img src=x onerror=alert(3)>'
    world.gitea.add_user(author)
    world.gitea.set_permission("acme", "widget", author, "write")
    task_id = _mention(world, f"@ccweb-bot {XSS}\n\nplease", author=author)
    run_id, _ = _pipeline(world)
    with world.ff.admin() as admin:
        r = admin.post(
            "/api/gitea-workflow/control/pause", json={"requestId": "x-1", "reason": XSS}
        )
        assert r.status_code == 200
        # The repository's page shows its environment: the operator's free text.
        env = {"variables": {"NOTE": XSS}, "setupScript": XSS}
        r = admin.put(
            "/api/gitea-workflow/repos/default:acme/widget/environment",
            json={"requestId": "x-2", "environment": env},
        )
        assert r.status_code == 200, r.text
    with _sign_in(world) as client:
        pages = [
            "/ui/",
            "/ui/tasks",
            f"/ui/tasks/{task_id}",
            "/ui/sessions",
            "/ui/repos",
            "/ui/repos/default:acme/widget",
            "/ui/deliveries",
            "/ui/audit",
            "/ui/audit?" + httpx.QueryParams({"task": XSS, "action": XSS}).__str__(),
            "/ui/tasks?" + httpx.QueryParams({"resource": XSS}).__str__(),
            "/ui/login?" + httpx.QueryParams({"next": XSS}).__str__(),
            "/ui/pipelines",
            "/ui/pipelines/templates/tpl",
            "/ui/pipelines/runs",
            f"/ui/pipelines/runs/{run_id}",
        ]
        shown = authors = 0
        for path in pages:
            html = client.get(path, follow_redirects=True).text
            assert "<script>alert" not in html, path
            assert "<img src=x" not in html, path
            shown += html.count("&lt;script&gt;alert(1)&lt;/script&gt;")
            authors += html.count("eve&#34;&gt;&lt;img src=x onerror=alert(3)&gt;")
        # instruction (tasks, task), pause reason, search fields, template name and texts,
        # the environment's variable and setup script
        assert shown >= 10
        assert authors >= 2  # task list and task page


def test_no_page_reveals_a_secret(world: World) -> None:
    task_id = _mention(world, "@ccweb-bot look")
    run_id, hook_token = _pipeline(world)
    setup_secret = "setup-secret-9d2f71"
    with world.ff.admin() as admin:
        r = admin.put(
            "/api/gitea-workflow/repos/default:acme/widget/environment/secrets",
            json={"requestId": "s-1", "secrets": {"DEPLOY_TOKEN": setup_secret}},
        )
        assert r.status_code == 200, r.text
    secrets = [ADMIN_TOKEN, WEBHOOK_SECRET, world.bot_token, hook_token, setup_secret]
    with _sign_in(world) as client:
        bodies = [client.get("/ui/login").text]
        for path in [*GET_PAGES, f"/ui/tasks/{task_id}", "/ui/static/app.css"]:
            r = client.get(path.replace("gitea-task-000", task_id).replace("run-000", run_id))
            assert r.status_code == 200, path
            bodies.append(r.text + "\n" + "\n".join(f"{k}: {v}" for k, v in r.headers.items()))
        token = _csrf(bodies[1])
        r = client.post(
            f"/ui/tasks/{task_id}/cancel",
            data={"csrf": token, "requestId": "c-1", "next": f"/ui/tasks/{task_id}"},
        )
        bodies.append(str(r.headers))
        bodies.append(client.get(f"/ui/tasks/{task_id}").text)
        repo_page = client.get("/ui/repos/default:acme/widget").text
        assert "DEPLOY_TOKEN" in repo_page and 'id="environment-none"' in repo_page
        assert client.get("/ui/repos/default:acme/nothing-here").status_code == 404
    for body in bodies:
        for secret in secrets:
            assert secret not in body


def test_the_bare_address_leads_to_the_pages_and_unknown_pages_are_html(world: World) -> None:
    with httpx.Client(base_url=world.ff.url, timeout=30) as client:
        root = client.get("/")
        assert root.status_code == 303 and root.headers["location"] == "/ui/"
        # Signed in or not, an address no page answers is the pages' own not-found page.
        missing = client.get("/ui/no-such-page/at/all")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("text/html")
        assert "Not found" in missing.text and "Sign in" in missing.text
        assert missing.headers["x-frame-options"] == "DENY"
    with _sign_in(world) as client:
        missing = client.get("/ui/tasks/x/y/z")
        assert missing.status_code == 404 and missing.headers["content-type"].startswith(
            "text/html"
        )
        assert "Back to the overview" in missing.text
    # The API keeps its JSON; without a token it asks for one before anything else.
    url = world.ff.url + "/api/gitea-workflow/no-such"
    api = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert api.status_code == 404 and api.json()["error"] == "not_found"
    assert httpx.get(url).status_code == 401
