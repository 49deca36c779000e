"""What the boundary attack tests share: a turn that may end any way, a canary folder
that only a command run on the host can touch, a loopback listener that asks for
credentials, the forms a leaked token can take, and a look at everything forgeflow
keeps (comments, database, logs) for them."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.model_server import (
    RecordedRequest,
    last_input_is_tool_output,
)
from forgeflow_testkit.model_steps import (
    Reply,
    ShellCall,
    Step,
    gitea_comment,
    message,
    new_id,
)
from tests.support.agentic import Agentic, app_server_groups
from tests.support.cluster import wait_for
from tests.support.forgeflow import WEBHOOK_SECRET
from tests.support.turns import END, START, tool_output, wrapped
from tests.support.world import BOT

# States a task leaves only when a person acts (an operator, a new mention): an attack
# that ends in one has settled as surely as a terminal state.
SETTLED = frozenset({"blocked_workspace", "waiting_user"})


@dataclass(frozen=True)
class Attempt:
    task_id: str
    detail: dict[str, Any]
    output: str  # what the command printed, or "" when no turn ran it


def _settled(agentic: Agentic, task_id: str) -> dict[str, Any] | None:
    detail = agentic.detail(task_id)
    return detail if detail["terminal"] or detail["task"]["state"] in SETTLED else None


def attempt_turn(
    agentic: Agentic,
    command: str | Callable[[], str],
    text: str = "@ccweb-bot again",
    timeout: float = 60,
    on: tuple[str, str, int] | None = None,
) -> Attempt:
    """Like tests.support.turns.shell_turn, but the task may end in any state (an attack
    may well block the session): what the test asserts is on the host."""
    model = agentic.model
    shell_id, comment_id = new_id("call"), new_id("call")
    asks: list[TurnAsk] = []

    def shell(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return Reply.of(
            ShellCall(wrapped(command() if callable(command) else command), call_id=shell_id)
        )

    def answer(_request: RecordedRequest) -> Step:
        ask = asks[0]
        return gitea_comment(
            ask.owner, ask.repo, ask.number, f"Done.\n\n{ask.marker}", call_id=comment_id
        )

    model.respond(
        last_input_is_tool_output(comment_id), lambda _r: message("Done."), times=1, first=True
    )
    model.respond(last_input_is_tool_output(shell_id), answer, times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, shell, times=1, first=True)
    if on is None:
        task_id = agentic.mention(text)
    else:  # a mention on another repository (owner, name, issue)
        posted = agentic.gitea.post_comment(*on, author="alice", body=text)
        delivery = agentic.gitea.delivery_of_comment(posted["id"])
        assert delivery.status_code == 202, delivery.response
        task_id = json.loads(delivery.response)["taskId"]
    try:
        detail = wait_for(lambda: _settled(agentic, task_id), timeout, f"task {task_id} settles")
    except AssertionError:
        # Still running (an attack may have stalled it): the host assertions decide.
        detail = agentic.detail(task_id)
    output = ""
    if asks:
        try:
            text_out = tool_output(agentic, shell_id)
        except AssertionError:
            text_out = ""
        if START in text_out:
            output = text_out.split(START, 1)[1].rsplit(END, 1)[0]
    # For the report of a failing test: how the task ended and what the command printed.
    publish = [(e["action"], e["metadata"]) for e in detail["audit"] if "publish" in e["action"]]
    print(f"-- {text!r}: {detail['task']['state']} {publish}\n{output[-3000:]}")
    return Attempt(task_id, detail, output)


def wait_idle(agentic: Agentic) -> None:
    """Until no app-server runs (the fixture's idle time is short): the next mention
    starts a new one, which builds its jail again from what is on disk now."""
    data = agentic.ff.settings.data_dir
    wait_for(lambda: app_server_groups(data) == [], timeout=60, what="the app-servers stop")


class Canary:
    """A host folder that does not exist in the jail (its /tmp is private): a planted
    command leaves a file here only when it ran on the host."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True)

    def touch(self, name: str) -> str:
        return f"touch {self.folder / name}"

    def fired(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir())


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (not following links): its kind and content hash."""
    found: dict[str, str] = {}
    for path in sorted([root, *root.rglob("*")]):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = "link:" + str(path.readlink())
        elif path.is_file():
            found[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "dir"
    return found


@dataclass
class Listener:
    """An HTTP server on loopback that answers 401 with a Basic challenge (which is what
    makes git hand over credentials) and records every request's headers."""

    url: str = ""
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def authorizations(self) -> list[str]:
        return [h[k] for _m, _p, h in self.seen for k in h if k.lower() == "authorization"]


@contextmanager
def listener() -> Iterator[Listener]:
    record = Listener()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            record.seen.append((self.command, self.path, dict(self.headers.items())))
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="listener"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_CONNECT = do_PUT = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    record.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()


def token_forms(token: str) -> dict[str, str]:
    """The token as it would leak: raw, in a Basic header for either user name, and
    percent-encoded (a URL's userinfo)."""
    forms = {"raw": token, "url-encoded": urllib.parse.quote(token, safe="")}
    for user in ("forgeflow", BOT, "x-access-token", "oauth2"):
        basic = base64.b64encode(f"{user}:{token}".encode()).decode()
        forms[f"basic {user}"] = basic
        forms[f"basic {user} (unpadded)"] = basic.rstrip("=")
    forms["base64"] = base64.b64encode(token.encode()).decode().rstrip("=")
    return forms


def kept_text(agentic: Agentic) -> dict[str, str]:
    """Everything forgeflow keeps or says that a person may read: every Gitea comment,
    every row of its database, its log files."""
    texts: dict[str, str] = {}
    comments = agentic.gitea.comments("acme", "widget", agentic.issue)
    texts["gitea comments"] = "\n".join(str(c["body"]) for c in comments)
    url = agentic.ff.settings.resolved_database_url
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            texts["database"] = "\n".join(db.iterdump())
    logs = Path(agentic.ff.settings.data_dir) / "logs"
    texts["logs"] = "\n".join(
        p.read_text(errors="replace") for p in sorted(logs.rglob("*")) if p.is_file()
    )
    return texts


def leaks(agentic: Agentic) -> list[str]:
    token = agentic.ff.settings.gitea_token
    assert token is not None
    found = []
    for where, text in kept_text(agentic).items():
        for form, value in token_forms(token.get_secret_value()).items():
            if value in text:
                found.append(f"{form} in {where}")
    return found


def add_other_repo(agentic: Agentic, secret: str) -> int:
    """A second private repository, acme/other, with an issue and a file holding
    ``secret``, hooked to forgeflow; returns the issue's number."""
    gitea = agentic.gitea
    gitea.add_repo("acme", "other", files={"SECRET.md": f"{secret}\n"})
    gitea.set_permission("acme", "other", "alice", "write")
    gitea.set_permission("acme", "other", BOT, "admin")
    issue = gitea.add_issue("acme", "other", title=f"Private {secret}", author="alice")
    gitea.add_hook("acme", "other", url=agentic.ff.webhook_url, secret=WEBHOOK_SECRET)
    return issue
