"""The floor of bench/ingest.py: forgeflow's acceptance with no framework around it.

The question it answers: how close to the bare baseline (baseline_app.py, one 2-column
INSERT per request) can *any* implementation of ARCHITECTURE §5.1 in Python get on this
machine? Per request it does only what the spec makes an acceptance do, each step in the
cheapest form Python has, and nothing forgeflow adds for operators:

- HMAC-SHA256 of the raw body against ``X-Gitea-Signature`` (``hmac.compare_digest``);
- ``json.loads`` of the body and the fields the acceptance needs;
- the bot's own comments and the mention check (forgeflow's own ``find_mention``, pure);
- forgeflow's identifiers (``delivery_key``, ``task_id_for``);
- in one ``BEGIN IMMEDIATE`` … ``COMMIT`` on a database migrated by forgeflow (same
  tables, keys and indexes), the statements forgeflow's writer runs for an accepted
  delivery (captured with SQLAlchemy's ``before_cursor_execute``, see docs/BENCHMARKS.md),
  written as plain SQL on the ``sqlite3`` module: the delivery row, the repository read
  (and its registration the first time), the replay check, the session read and
  insert-or-ignore, the task inserted ``received`` and moved to ``queued`` by a
  compare-and-swap on ``state_version``, its audit row and its three domain events.

Not done (forgeflow does them, so the floor is below forgeflow whatever forgeflow does):
no commenter permission check (as if always cached), no metrics, no log line, no
middleware, no OpenAPI validation, no group commit, no checkpoint thread.

With ``--minimal`` it writes even less: only what the spec cannot do without (see
``accept_minimal``), a floor under any design.

Usage: floor_app.py --port PORT --db PATH --secret SECRET --bot LOGIN [--minimal]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from baseline_app import app_for, open_db, run
from forgeflow.domain.ids import delivery_key, task_id_for
from forgeflow.domain.mentions import find_mention
from forgeflow.store import Store

RUNTIME = '{"app":"codexapp","mode":"yolo"}'
MCP = '{"hostRef":"gitea-main","server":"gitea","transport":"stdio"}'

# forgeflow's statements for an accepted delivery, as its writer sends them to SQLite.
INSERT_DELIVERY = (
    "INSERT INTO webhook_deliveries (delivery_key, delivery_id, event_type, received_at,"
    " signature_valid, normalized, task_id, status, reason, repo_key, comment_id,"
    " payload_hash, response_code, expires_at)"
    " VALUES (?, ?, ?, ?, 1, 1, ?, 'accepted', NULL, ?, ?, ?, 202, ?)"
    " ON CONFLICT DO NOTHING RETURNING 1"
)
SELECT_REPO = "SELECT * FROM repositories WHERE repo_key = ?"
INSERT_REPO = (
    "INSERT INTO repositories (repo_key, instance_id, owner, name, clone_url, workspace_path,"
    " default_branch, status, registered_at, updated_at, version)"
    " VALUES (?, 'default', ?, ?, ?, ?, ?, 'enabled', ?, ?, 1) ON CONFLICT DO NOTHING"
)
SELECT_REPLAY = (
    "SELECT delivery_key, task_id FROM webhook_deliveries WHERE repo_key = ?"
    " AND comment_id = ? AND delivery_key != ? AND status IN ('accepted', 'rejected')"
)
SELECT_SESSION = "SELECT * FROM sessions WHERE session_key = ?"
INSERT_SESSION = (
    "INSERT INTO sessions (session_key, resource_key, repo_key, kind, number, runtime, mcp,"
    " status, created_at, updated_at, version, mode)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?, ?, 1, NULL) ON CONFLICT DO NOTHING RETURNING 1"
)
INSERT_TASK = (
    "INSERT INTO tasks (task_id, delivery_key, repo_key, resource_key, session_key,"
    " comment_id, author, instruction, state, attempt, reply_attempt, refs, created_at,"
    " updated_at, state_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'received', 0, 0, NULL, ?, ?, 1)"
)
QUEUE_TASK = (
    "UPDATE tasks SET state = 'queued', error_code = NULL, updated_at = ?, state_version = 2"
    " WHERE task_id = ? AND state_version = 1 AND state = 'received' RETURNING *"
)
INSERT_AUDIT = (
    "INSERT INTO audit_events (event_id, task_id, session_key, repo_key, actor, action,"
    " from_state, to_state, state_version, delivery_id, turn_id, comment_id, error_code,"
    " timestamp, metadata) VALUES (?, ?, ?, ?, ?, 'webhook.accept', 'received', 'queued', 2,"
    " ?, NULL, ?, NULL, ?, ?)"
)
INSERT_EVENTS = (
    "INSERT INTO domain_events (event_type, dedupe_key, repo_key, payload, created_at)"
    " VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)"
)
INSERT_EVENT_IGNORE = (
    "INSERT INTO domain_events (event_type, dedupe_key, repo_key, payload, created_at)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1"
)


def connect(path: Path) -> sqlite3.Connection:
    conn = open_db(path)
    conn.execute("PRAGMA foreign_keys=ON")  # as forgeflow's store
    return conn


SELECT_REPO_EXISTS = "SELECT 1 FROM repositories WHERE repo_key = ?"
INSERT_TASK_QUEUED = INSERT_TASK.replace(
    "'received', 0, 0, NULL, ?, ?, 1)", "'queued', 0, 0, NULL, ?, ?, 2)"
)


@contextmanager
def _committed(conn: sqlite3.Connection) -> Iterator[None]:
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _audit(conn: sqlite3.Connection, d: dict[str, Any], now: str, metadata: str) -> None:
    actor = f"gitea:user:{d['author']}"
    row = (f"audit-{uuid.uuid4()}", d["task_id"], d["resource_key"], d["repo_key"], actor)
    conn.execute(INSERT_AUDIT, (*row, d["delivery_id"], d["comment_id"], now, metadata))


def _open(conn: sqlite3.Connection, d: dict[str, Any], now: str, expires: str, probe: str) -> bool:
    """``BEGIN IMMEDIATE``, the delivery row and the repository's registration; False
    (rolled back) for a redelivery."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        key, repo = d["key"], d["repo_key"]
        row = (key, d["delivery_id"], "issue_comment", now, d["task_id"], repo, d["comment_id"])
        if conn.execute(INSERT_DELIVERY, (*row, d["hash"], expires)).fetchone() is None:
            conn.execute("ROLLBACK")
            return False
        if conn.execute(probe, (repo,)).fetchone() is None:
            repository = (repo, d["owner"], d["name"], d["clone_url"], d["workspace"])
            conn.execute(INSERT_REPO, (*repository, d["branch"], now, now))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return True


def accept_minimal(conn: sqlite3.Connection, d: dict[str, Any]) -> str:
    """The least the spec's acceptance can write: the delivery row, the repository's
    registration (checked), the session reference (insert-or-ignore), the task born
    ``queued`` and its one audit row; no domain events, no replay check, no read-backs."""
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(" ")
    key, repo, res, task = d["key"], d["repo_key"], d["resource_key"], d["task_id"]
    if not _open(conn, d, now, now, SELECT_REPO_EXISTS):
        return "duplicate"
    with _committed(conn):
        conn.execute(
            INSERT_SESSION, (res, res, repo, d["kind"], d["number"], RUNTIME, MCP, now, now)
        ).fetchone()
        conn.execute(
            INSERT_TASK_QUEUED,
            (task, key, repo, res, res, d["comment_id"], d["author"], d["instruction"], now, now),
        )
        _audit(conn, d, now, "{}")
    return "queued"


def accept(conn: sqlite3.Connection, d: dict[str, Any]) -> str:
    """The acceptance transaction as forgeflow's writer runs it; returns the task's state."""
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(" ")
    expires = (datetime.now(UTC) + timedelta(days=30)).replace(tzinfo=None).isoformat(" ")
    key, repo, res, task = d["key"], d["repo_key"], d["resource_key"], d["task_id"]
    if not _open(conn, d, now, expires, SELECT_REPO):
        return "duplicate"
    with _committed(conn):
        conn.execute(SELECT_REPLAY, (repo, d["comment_id"], key)).fetchall()
        conn.execute(SELECT_SESSION, (res,)).fetchone()
        conn.execute(
            INSERT_SESSION, (res, res, repo, d["kind"], d["number"], RUNTIME, MCP, now, now)
        ).fetchone()
        conn.execute(SELECT_SESSION, (res,)).fetchone()
        conn.execute(
            INSERT_TASK,
            (task, key, repo, res, res, d["comment_id"], d["author"], d["instruction"], now, now),
        )
        conn.execute(QUEUE_TASK, (now, task)).fetchone()
        metadata = json.dumps({"eventType": "issue_comment", "permission": "write"})
        _audit(conn, d, now, metadata)
        change = json.dumps(
            {"author": d["author"], "errorCode": None, "fromState": "received"}
            | {"repoKey": repo, "resourceKey": res, "taskId": task, "toState": "queued"},
            sort_keys=True,
        )
        conn.execute(
            INSERT_EVENTS,
            (
                "TaskStatusChanged",
                f"TaskStatusChanged:{task}:2",
                repo,
                change,
                now,
                "TaskCreated",
                f"TaskCreated:{task}:2",
                repo,
                change,
                now,
            ),
        )
        comment = json.dumps(
            {"author": d["author"], "body": d["body"], "commentId": d["comment_id"]}
            | {"deliveryId": d["delivery_id"], "isPull": d["kind"] == "pull"}
            | {"mentionsBot": True, "number": d["number"], "owner": d["owner"]}
            | {"repo": d["name"], "repoKey": repo, "resourceKey": res, "url": d["url"]},
            sort_keys=True,
        )
        conn.execute(
            INSERT_EVENT_IGNORE,
            (
                "CommentCreated",
                f"CommentCreated:{repo}:comment:{d['comment_id']}",
                repo,
                comment,
                now,
            ),
        ).fetchone()
    return "queued"


def create_app(db_path: Path, secret: str, bot: str, root: str, *, minimal: bool) -> Starlette:
    conn = connect(db_path)
    write = accept_minimal if minimal else accept
    key_bytes = secret.encode()

    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        expected = hmac.new(key_bytes, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("x-gitea-signature", "")):
            return JSONResponse({"error": "invalid_signature"}, status_code=401)
        payload = json.loads(body)
        comment, issue, repository = payload["comment"], payload["issue"], payload["repository"]
        author = comment["user"]["login"]
        if payload["action"] != "created" or author.lower() == bot.lower():
            return JSONResponse({"status": "ignored"}, status_code=200)
        mention = find_mention(comment["body"], bot)
        if mention is None:
            return JSONResponse({"status": "ignored"}, status_code=200)
        owner, name = repository["owner"]["login"], repository["name"]
        kind = "pull" if issue.get("pull_request") else "issue"
        delivery_id = request.headers["x-gitea-delivery"]
        key = delivery_key(delivery_id)
        repo_key = f"default:{owner}/{name}"
        d = {
            "key": key,
            "delivery_id": delivery_id,
            "task_id": task_id_for(key),
            "repo_key": repo_key,
            "resource_key": f"{repo_key}:{kind}:{issue['number']}",
            "kind": kind,
            "number": issue["number"],
            "owner": owner,
            "name": name,
            "clone_url": repository["clone_url"],
            "branch": repository["default_branch"],
            "workspace": f"{root}/default/{owner}/{name}",
            "comment_id": comment["id"],
            "author": author,
            "body": comment["body"],
            "url": comment["html_url"],
            "instruction": mention.instruction,
            "hash": "sha256:" + hashlib.sha256(body).hexdigest(),
        }
        state = write(conn, d)
        if state == "duplicate":
            return JSONResponse({"status": "duplicate"}, status_code=200)
        return JSONResponse(
            {"deliveryId": delivery_id, "taskId": d["task_id"], "state": state}, status_code=202
        )

    return app_for(webhook)


def main() -> None:
    p = argparse.ArgumentParser(description="forgeflow ingest benchmark floor")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--bot", required=True)
    p.add_argument("--minimal", action="store_true", help="write the spec's least (accept_minimal)")
    args = p.parse_args()
    store = Store(f"sqlite:///{args.db}")  # forgeflow's own migrations: same schema
    store.migrate()
    store.close()
    root = str(args.db.parent / "workspaces")
    app = create_app(args.db, args.secret, args.bot, root, minimal=args.minimal)
    run(app, args.port)


if __name__ == "__main__":
    main()
