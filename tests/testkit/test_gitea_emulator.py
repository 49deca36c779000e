"""The Gitea emulator, exercised through real HTTP and the real git client."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator

SECRET = "s3cret"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A stdlib HTTP server on port 0 that records every POST it gets."""

    url: str
    received: list[Received] = field(default_factory=list)
    status: int = 200

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.received


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            recv = box[0]
            recv.received.append(Received(self.path, dict(self.headers.items()), body))
            self.send_response(recv.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield box[0]
    server.shutdown()
    server.server_close()


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GiteaEmulator]:
    with GiteaEmulator(tmp_path / "git") as emulator:
        yield emulator


@pytest.fixture
def tokens(emu: GiteaEmulator) -> dict[str, str]:
    """acme/widget (private), owned by acme; bot is a repo admin, alice writes, bob nothing."""
    found = {name: emu.add_user(name) for name in ("acme", "ccweb-bot", "alice", "bob")}
    emu.add_repo("acme", "widget", files={"README.md": "# widget\n", "src/app.py": "x = 1\n"})
    emu.set_permission("acme", "widget", "ccweb-bot", "admin")
    emu.set_permission("acme", "widget", "alice", "write")
    return found


def api(emu: GiteaEmulator, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"token {token}"} if token else {}
    return httpx.Client(base_url=f"{emu.url}/api/v1", headers=headers, trust_env=False)


def verify(received: Received) -> None:
    digest = hmac.new(SECRET.encode(), received.body, hashlib.sha256).hexdigest()
    assert received.headers["X-Gitea-Signature"] == digest
    assert received.headers["X-Gogs-Signature"] == digest
    assert received.headers["X-Hub-Signature-256"] == f"sha256={digest}"
    sha1 = hmac.new(SECRET.encode(), received.body, hashlib.sha1).hexdigest()
    assert received.headers["X-Hub-Signature"] == f"sha1={sha1}"
    assert received.headers["Content-Type"] == "application/json"
    delivery = received.headers["X-Gitea-Delivery"]
    assert received.headers["X-GitHub-Delivery"] == received.headers["X-Gogs-Delivery"] == delivery


def test_token_user_reads_user_with_every_auth_form(
    emu: GiteaEmulator, tokens: dict[str, str]
) -> None:
    token = tokens["alice"]
    with api(emu) as client:
        assert client.get("/user").status_code == 401
        assert client.get("/user", headers={"Authorization": "token nope"}).status_code == 401
        for kwargs in (
            {"headers": {"Authorization": f"token {token}"}},
            {"headers": {"Authorization": f"Bearer {token}"}},
            {"params": {"token": token}},
            {"params": {"access_token": token}},
            {"auth": ("whoever", token)},
            {"auth": (token, "x-oauth-basic")},
        ):
            me = client.get("/user", **kwargs)
            assert me.status_code == 200, kwargs
            assert me.json()["login"] == "alice"
            assert me.json()["email"] == "alice@example.com"
        assert client.get("/user", auth=("alice", "wrong")).status_code == 401
        assert client.get("/version").json()["version"]
        # a private repository is not revealed to strangers
        assert client.get("/repos/acme/widget").status_code == 404
    with api(emu, tokens["bob"]) as client:
        assert client.get("/repos/acme/widget").status_code == 404
    with api(emu, tokens["alice"]) as client:
        repo = client.get("/repos/acme/widget").json()
        assert repo["full_name"] == "acme/widget" and repo["private"] is True
        assert repo["permissions"] == {"admin": False, "push": True, "pull": True}
        assert repo["clone_url"] == f"{emu.url}/acme/widget.git"


def test_permission_endpoint(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    path = "/repos/acme/widget/collaborators/{}/permission"
    with api(emu, tokens["ccweb-bot"]) as bot:
        owner = bot.get(path.format("acme")).json()
        assert (owner["permission"], owner["role_name"]) == ("owner", "owner")
        assert owner["user"]["login"] == "acme"
        assert bot.get(path.format("alice")).json()["permission"] == "write"
        assert bot.get(path.format("bob")).json()["permission"] == "none"
        assert bot.get(path.format("ghost")).status_code == 404
    emu.add_user("root", is_admin=True)
    with api(emu, tokens["ccweb-bot"]) as bot:
        assert bot.get(path.format("root")).json()["permission"] == "owner"
    with api(emu, tokens["alice"]) as alice:
        assert alice.get(path.format("alice")).json()["permission"] == "write"
        assert alice.get(path.format("bob")).status_code == 403  # only admins ask for others
    with api(emu) as anonymous:
        assert anonymous.get(path.format("alice")).status_code == 404
    emu.add_repo("acme", "open", private=False)
    with api(emu, tokens["acme"]) as acme:
        bob = acme.get("/repos/acme/open/collaborators/bob/permission").json()
        assert bob["permission"] == "read"  # anyone can read a public repository


def test_comment_create_list_and_since(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    index = emu.add_issue("acme", "widget", title="Flaky test", author="alice")
    first = emu.post_comment("acme", "widget", index, author="alice", body="@ccweb-bot fix it")
    emu.advance_clock(120)
    with api(emu, tokens["ccweb-bot"]) as bot:
        created = bot.post(
            f"/repos/acme/widget/issues/{index}/comments", json={"body": "on it <!-- m -->"}
        )
        assert created.status_code == 201
        second = created.json()
        assert second["user"]["login"] == "ccweb-bot"
        assert second["issue_url"] == f"{emu.url}/acme/widget/issues/{index}"
        assert second["html_url"].endswith(f"#issuecomment-{second['id']}")
        assert second["pull_request_url"] == ""
        listed = bot.get(f"/repos/acme/widget/issues/{index}/comments")
        assert [c["id"] for c in listed.json()] == [first["id"], second["id"]]
        assert listed.headers["X-Total-Count"] == "2"
        since = bot.get(
            f"/repos/acme/widget/issues/{index}/comments", params={"since": second["created_at"]}
        ).json()
        assert [c["id"] for c in since] == [second["id"]]
        before = bot.get(
            f"/repos/acme/widget/issues/{index}/comments", params={"before": first["created_at"]}
        ).json()
        assert [c["id"] for c in before] == [first["id"]]
        bad = bot.get(f"/repos/acme/widget/issues/{index}/comments", params={"since": "yesterday"})
        assert bad.status_code == 422
        assert bot.post(f"/repos/acme/widget/issues/{index}/comments", json={}).status_code == 422
        one = bot.get(f"/repos/acme/widget/issues/comments/{second['id']}").json()
        assert one["body"] == "on it <!-- m -->"
    assert [c["id"] for c in emu.comments("acme", "widget", index)] == [first["id"], second["id"]]
    with api(emu, tokens["bob"]) as bob:
        assert (
            bob.post(f"/repos/acme/widget/issues/{index}/comments", json={"body": "x"}).status_code
            == 404
        )


def test_issues_and_pulls_share_the_index_counter(
    emu: GiteaEmulator, tokens: dict[str, str]
) -> None:
    emu.push_branch("acme", "widget", "feature", {"src/app.py": "x = 2\n"})
    assert emu.add_issue("acme", "widget", title="one", author="alice") == 1
    assert emu.add_pull("acme", "widget", title="two", head="feature", author="alice") == 2
    assert emu.add_issue("acme", "widget", title="three", author="alice") == 3
    with api(emu, tokens["alice"]) as alice:
        pull = alice.get("/repos/acme/widget/pulls/2").json()
        assert pull["head"]["ref"] == "feature" and pull["base"]["ref"] == "main"
        assert pull["mergeable"] is True and pull["merged"] is False
        assert alice.get("/repos/acme/widget/pulls/1").status_code == 404
        assert alice.get("/repos/acme/widget/issues/2").json()["pull_request"]["merged"] is False


def test_comment_webhooks_for_issue_and_pull(
    emu: GiteaEmulator, tokens: dict[str, str], receiver: Receiver
) -> None:
    emu.add_hook("acme", "widget", url=receiver.url, secret=SECRET, events=["issue_comment"])
    emu.add_hook(
        "acme",
        "widget",
        url=receiver.url,
        secret=SECRET,
        events=["issue_comment", "pull_request_comment"],
    )
    issue = emu.add_issue("acme", "widget", title="bug", author="alice")
    emu.push_branch("acme", "widget", "fix", {"src/app.py": "x = 3\n"})
    pull = emu.add_pull("acme", "widget", title="fix", head="fix", author="alice")
    assert receiver.received == []  # neither hook takes issues/pull_request events

    comment = emu.post_comment("acme", "widget", issue, author="alice", body="@ccweb-bot hi")
    on_issue = receiver.wait_for(2)
    assert len(on_issue) == 2
    for received in on_issue:
        verify(received)
        assert received.headers["X-Gitea-Event"] == "issue_comment"
        assert received.headers["X-Gitea-Event-Type"] == "issue_comment"
        payload = json.loads(received.body)
        assert payload["action"] == "created" and payload["is_pull"] is False
        assert payload["comment"] == comment
        assert payload["issue"]["number"] == issue and payload["issue"]["pull_request"] is None
        assert payload["repository"]["full_name"] == "acme/widget"
        assert payload["sender"]["login"] == "alice"
        assert received.body.startswith(b'{\n  "action": "created",')  # MarshalIndent

    emu.post_comment("acme", "widget", pull, author="alice", body="@ccweb-bot review")
    on_pull = receiver.wait_for(3)
    assert len(on_pull) == 3  # only the hook that chose pull_request_comment
    verify(on_pull[2])
    assert on_pull[2].headers["X-Gitea-Event"] == "issue_comment"
    assert on_pull[2].headers["X-Gitea-Event-Type"] == "pull_request_comment"
    assert on_pull[2].headers["X-GitHub-Event"] == "issue_comment"
    payload = json.loads(on_pull[2].body)
    assert payload["is_pull"] is True
    assert payload["issue"]["pull_request"]["html_url"] == f"{emu.url}/acme/widget/pulls/{pull}"
    assert payload["comment"]["pull_request_url"] == f"{emu.url}/acme/widget/pulls/{pull}"
    assert [d.status_code for d in emu.deliveries] == [200, 200, 200]


def test_api_comment_fires_hook_in_background_and_redeliver(
    emu: GiteaEmulator, tokens: dict[str, str], receiver: Receiver
) -> None:
    emu.add_hook("acme", "widget", url=receiver.url, secret=SECRET, events=["issues"])
    index = emu.add_issue("acme", "widget", title="bug", author="alice")
    opened = receiver.wait_for(1)[0]
    assert opened.headers["X-Gitea-Event"] == "issues"
    assert json.loads(opened.body)["action"] == "opened"
    with api(emu, tokens["ccweb-bot"]) as bot:
        bot.post(f"/repos/acme/widget/issues/{index}/comments", json={"body": "ack & <ok>"})
    emu.flush_deliveries()
    delivery = emu.deliveries[-1]
    assert delivery.event_type == "issue_comment" and delivery.ok
    assert delivery.payload["sender"]["login"] == "ccweb-bot"
    assert b"ack \\u0026 \\u003cok\\u003e" in delivery.body  # Go's HTML-safe escaping
    again = emu.redeliver(delivery)
    assert again.delivery_id != delivery.delivery_id
    assert again.body == delivery.body
    assert again.headers["X-Gitea-Signature"] == delivery.headers["X-Gitea-Signature"]
    received = receiver.wait_for(3)
    assert received[2].body == received[1].body
    assert received[2].headers["X-Gitea-Delivery"] == again.delivery_id
    same = emu.redeliver(delivery, new_id=False)
    assert same.delivery_id == delivery.delivery_id


def test_pull_request_hooks(emu: GiteaEmulator, tokens: dict[str, str], receiver: Receiver) -> None:
    emu.add_hook("acme", "widget", url=receiver.url, secret=SECRET, events=["pull_request"])
    emu.push_branch("acme", "widget", "topic", {"a.txt": "1\n"})
    index = emu.add_pull("acme", "widget", title="topic", head="topic", author="alice")
    emu.push_branch("acme", "widget", "topic", {"a.txt": "2\n"}, pusher="alice")
    emu.merge_pull("acme", "widget", index, merger="ccweb-bot")
    events = [(r.headers["X-Gitea-Event-Type"], json.loads(r.body)) for r in receiver.wait_for(3)]
    assert [(t, p["action"]) for t, p in events] == [
        ("pull_request", "opened"),
        ("pull_request_sync", "synchronized"),
        ("pull_request", "closed"),
    ]
    closed = events[2][1]["pull_request"]
    assert closed["merged"] is True and closed["merge_commit_sha"]
    assert (
        events[1][1]["pull_request"]["head"]["sha"] != events[0][1]["pull_request"]["head"]["sha"]
    )


def test_hooks_api(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    config = {"url": "http://127.0.0.1:9/x", "content_type": "json", "secret": "abc"}
    with api(emu, tokens["ccweb-bot"]) as bot:
        made = bot.post(
            "/repos/acme/widget/hooks",
            json={"type": "gitea", "config": config, "events": ["issues"], "active": True},
        )
        assert made.status_code == 201
        hook = made.json()
        assert "secret" not in hook["config"] and hook["active"] is True
        assert "issue_comment" in hook["events"]
        assert (
            bot.post("/repos/acme/widget/hooks", json={"type": "x", "config": config}).status_code
            == 422
        )
        edited = bot.patch(f"/repos/acme/widget/hooks/{hook['id']}", json={"active": False})
        assert edited.json()["active"] is False and edited.json()["events"] == ["push"]
        assert [h["id"] for h in bot.get("/repos/acme/widget/hooks").json()] == [hook["id"]]
        assert bot.delete(f"/repos/acme/widget/hooks/{hook['id']}").status_code == 204
    with api(emu, tokens["alice"]) as alice:
        assert alice.get("/repos/acme/widget/hooks").status_code == 403


def test_build_delivery_flavours(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    index = emu.add_issue("acme", "widget", title="t", author="alice")
    comment = emu.post_comment("acme", "widget", index, author="alice", body="hi")
    payload = emu.comment_payload("acme", "widget", index, comment, sender="alice")
    headers, body = emu.build_delivery(
        "acme", "widget", "issue_comment", payload, secret=SECRET, flavour="forgejo"
    )
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Forgejo-Signature"] == headers["X-Gitea-Signature"] == digest
    assert headers["X-Forgejo-Event"] == "issue_comment"
    assert headers["X-Forgejo-Delivery"] == headers["X-Gitea-Delivery"]
    assert json.loads(body) == payload
    plain, _ = emu.build_delivery("acme", "widget", "issue_comment", payload, secret=SECRET)
    assert not any(k.startswith("X-Forgejo") for k in plain)


def test_fail_next(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    emu.fail_next("GET", r"^/api/v1/user$", status=503, count=2)
    emu.fail_next("GET", r"/version$", status=0, delay=0.3)
    with api(emu, tokens["alice"]) as client:
        assert [client.get("/user").status_code for _ in range(3)] == [503, 503, 200]
        started = time.monotonic()
        assert client.get("/version").status_code == 200
        assert time.monotonic() - started >= 0.3
    assert emu.requests[:3] == [("GET", "/api/v1/user", 503)] * 2 + [("GET", "/api/v1/user", 200)]


def _git(
    *args: str, cwd: Path | None = None, askpass: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GIT_", "SSH_ASKPASS"))
    }
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "Alice",
            "GIT_AUTHOR_EMAIL": "alice@example.com",
            "GIT_COMMITTER_NAME": "Alice",
            "GIT_COMMITTER_EMAIL": "alice@example.com",
        }
    )
    if askpass is not None:
        env["GIT_ASKPASS"] = str(askpass)
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_git_clone_and_push_over_http(
    emu: GiteaEmulator, tokens: dict[str, str], tmp_path: Path, receiver: Receiver
) -> None:
    url = f"{emu.url}/acme/widget.git"
    denied = _git("clone", url, str(tmp_path / "denied"))
    assert denied.returncode != 0
    assert ("GET", "/acme/widget.git/info/refs", 401) in emu.requests

    askpass = tmp_path / "askpass.sh"
    askpass.write_text(
        f'#!/bin/sh\ncase "$1" in Username*) echo alice ;; *) echo {tokens["alice"]} ;; esac\n'
    )
    askpass.chmod(0o700)
    work = tmp_path / "work"
    cloned = _git("clone", url, str(work), askpass=askpass)
    assert cloned.returncode == 0, cloned.stderr
    assert (work / "src" / "app.py").read_text() == "x = 1\n"

    emu.add_hook("acme", "widget", url=receiver.url, secret=SECRET, events=["push", "create"])
    _git("checkout", "-b", "agent/fix", cwd=work)
    (work / "src" / "app.py").write_text("x = 42\n")
    _git("commit", "-am", "agent fix", cwd=work)
    pushed = _git("push", "origin", "agent/fix", cwd=work, askpass=askpass)
    assert pushed.returncode == 0, pushed.stderr
    emu.flush_deliveries()
    kinds = [d.event_type for d in emu.deliveries]
    assert kinds == ["create", "push"]
    push = emu.deliveries[1].payload
    assert push["ref"] == "refs/heads/agent/fix" and push["pusher"]["login"] == "alice"
    assert push["commits"][0]["message"] == "agent fix\n"

    bob_askpass = tmp_path / "bob.sh"
    bob_askpass.write_text(f"#!/bin/sh\necho {tokens['bob']}\n")
    bob_askpass.chmod(0o700)
    assert _git("clone", url, str(tmp_path / "bob"), askpass=bob_askpass).returncode != 0


def test_edit_and_delete_comment(
    emu: GiteaEmulator, tokens: dict[str, str], receiver: Receiver
) -> None:
    emu.add_repo("acme", "open", private=False)
    emu.add_hook("acme", "open", url=receiver.url, secret=SECRET, events=["issue_comment"])
    index = emu.add_issue("acme", "open", title="t", author="bob")
    comment = emu.post_comment("acme", "open", index, author="bob", body="first")
    with api(emu, tokens["alice"]) as alice:  # neither poster nor writer of acme/open
        path = f"/repos/acme/open/issues/comments/{comment['id']}"
        assert alice.patch(path, json={"body": "nope"}).status_code == 403
    emu.edit_comment("acme", "open", comment["id"], body="second")
    emu.delete_comment("acme", "open", comment["id"])
    payloads = [json.loads(r.body) for r in receiver.wait_for(3)]
    assert [p["action"] for p in payloads] == ["created", "edited", "deleted"]
    assert payloads[1]["changes"] == {"body": {"from": "first"}}
    assert payloads[1]["comment"]["body"] == "second"
    assert "changes" not in payloads[2]
    assert emu.comments("acme", "open", index) == []


def test_delivery_of_comment_is_that_comments_whatever_came_after(
    emu: GiteaEmulator, tokens: dict[str, str], receiver: Receiver
) -> None:
    emu.add_hook("acme", "widget", url=receiver.url, secret=SECRET, events=["issue_comment"])
    index = emu.add_issue("acme", "widget", title="bug", author="alice")
    mine = emu.post_comment("acme", "widget", index, author="alice", body="@ccweb-bot go")
    with api(emu, tokens["ccweb-bot"]) as bot:  # delivered later, by the hook worker
        bot.post(f"/repos/acme/widget/issues/{index}/comments", json={"body": "receipt"})
    emu.flush_deliveries()
    emu.edit_comment("acme", "widget", mine["id"], body="@ccweb-bot go on")
    assert emu.deliveries[-1].comment_id == mine["id"]
    created = emu.delivery_of_comment(mine["id"])
    assert created is emu.deliveries[0] and created.payload["comment"]["body"] == "@ccweb-bot go"
    edited = emu.delivery_of_comment(mine["id"], action="edited")
    assert edited.payload["comment"]["body"] == "@ccweb-bot go on"
    assert emu.deliveries[1].payload["sender"]["login"] == "ccweb-bot"
    with pytest.raises(LookupError, match="deleted"):
        emu.delivery_of_comment(mine["id"], action="deleted")
