"""A burst of 10,000 webhook deliveries against one real ``forgeflow serve --role ingress``.

The mix, shuffled with a seeded RNG and sent concurrently over a bounded pool of
keep-alive connections to 127.0.0.1:

- 55 % distinct valid mentions (Gitea ``issue_comment`` payloads from the emulator,
  signed as Gitea signs them) over 5 repositories and 40 issues;
- 30 % duplicates of those: two thirds the same delivery sent again (a network-level
  repeat), one third Gitea's "Replay" (the same payload under a new delivery id);
- 10 % bad signatures: signed with another secret, no signature headers at all, or a
  body changed after signing (that one reuses the delivery id of a valid delivery);
- 5 % malformed bodies with a valid signature: not JSON, not UTF-8, truncated, a JSON
  array, required fields missing or of the wrong type.

Everything is counted exactly: no 5xx; 401s == bad signatures; 400s == malformed; one
202 and one task per distinct comment, every duplicate answered 200 with that task's id;
the deliveries table holds one ``accepted`` row per comment and one ``duplicate`` row
per replay; ``webhook.reject`` audit rows bounded (one per source and interval, with a
count: every bad signature came from 127.0.0.1); the server's own
``forgeflow_webhook_deliveries_total`` counters agree.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, select

from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.schema import tasks, webhook_deliveries
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.support.process import clean_env, free_port, start_serve, wait_healthy

TOTAL = 10_000
CONNECTIONS = 32
SEED = 20261130
BOT, AUTHOR, OWNER = "ccweb-bot", "alice", "acme"
REPOS = ("anvil", "bellows", "crucible", "forge", "tongs")
ISSUES_PER_REPO = 8
SIGNATURES = ("X-Gitea-Signature", "X-Gogs-Signature", "X-Hub-Signature-256", "X-Hub-Signature")


@dataclass(frozen=True)
class Request:
    kind: str  # valid | same_id | replay | bad_signature | malformed
    headers: dict[str, str]
    body: bytes
    comment: int | None = None  # the comment a valid request or duplicate is about


@dataclass(frozen=True)
class Answer:
    request: Request
    status: int
    body: dict[str, Any] | None


def _payloads(emu: GiteaEmulator) -> list[tuple[str, dict[str, Any]]]:
    """One real issue_comment payload per issue, as the emulator (Gitea) sends it."""
    emu.add_user(AUTHOR)
    out = []
    for repo in REPOS:
        emu.add_repo(OWNER, repo)
        emu.set_permission(OWNER, repo, AUTHOR, "write")
        for i in range(ISSUES_PER_REPO):
            number = emu.add_issue(OWNER, repo, title=f"burst {i}", author=AUTHOR)
            comment = emu.post_comment(OWNER, repo, number, author=AUTHOR, body="template")
            out.append((repo, emu.comment_payload(OWNER, repo, number, comment, sender=AUTHOR)))
    return out


def _signed(emu: GiteaEmulator, repo: str, payload: dict[str, Any]) -> tuple[dict[str, str], bytes]:
    """Headers and body exactly as Gitea delivers them, under a new delivery id."""
    return emu.build_delivery(
        OWNER, repo, "issue_comment", payload, secret=WEBHOOK_SECRET, delivery_id=str(uuid.uuid4())
    )


def _resign(headers: dict[str, str], body: bytes, secret: str) -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return headers | {
        "X-Gitea-Signature": sig,
        "X-Gogs-Signature": sig,
        "X-Hub-Signature-256": f"sha256={sig}",
    }


def build_requests(emu: GiteaEmulator, rng: random.Random) -> list[Request]:
    distinct = TOTAL * 55 // 100
    duplicates = TOTAL * 30 // 100
    bad = TOTAL * 10 // 100
    malformed = TOTAL - distinct - duplicates - bad
    templates = _payloads(emu)
    valid: list[Request] = []
    for i in range(distinct):
        repo, template = templates[i % len(templates)]
        payload = copy.deepcopy(template)
        payload["comment"]["id"] = 1_000_000 + i
        payload["comment"]["body"] = f"@{BOT} burst job {i}: please look"
        headers, body = _signed(emu, repo, payload)
        valid.append(Request("valid", headers, body, comment=1_000_000 + i))
    requests = list(valid)
    for i in range(duplicates):
        original = rng.choice(valid)
        if i % 3 == 2:  # Gitea's Replay: same content, a new delivery id
            repo = json.loads(original.body)["repository"]["name"]
            headers, body = _signed(emu, repo, json.loads(original.body))
            assert body == original.body
            requests.append(Request("replay", headers, body, original.comment))
        else:
            requests.append(Request("same_id", original.headers, original.body, original.comment))
    for i in range(bad):
        original = rng.choice(valid)
        headers = dict(original.headers)
        body = original.body
        if i % 3 == 0:
            headers = _resign(headers, body, "not-the-secret")
        elif i % 3 == 1:
            headers = {k: v for k, v in headers.items() if k not in SIGNATURES}
        else:  # changed after signing, under the valid delivery's own id
            body = body.replace(b"burst job", b"burst j0b", 1)
        headers["X-Gitea-Delivery"] = (
            headers["X-Gitea-Delivery"] if i % 3 == 2 else str(uuid.uuid4())
        )
        requests.append(Request("bad_signature", headers, body))
    repo, template = templates[0]
    broken: list[bytes] = [
        b"this is not json",
        b"\xff\xfe\x00 not utf-8",
        b'{"action": "created", "comment": {',
        b"[1, 2, 3]",
        b"",
    ]
    for path in ("comment.id", "repository", "issue.number", "comment.user.login", "action"):
        payload = copy.deepcopy(template)
        head, _, leaf = path.rpartition(".")
        node = payload
        for part in filter(None, head.split(".")):
            node = node[part]
        del node[leaf]
        broken.append(json.dumps(payload).encode())
    for path, value in (("issue.number", "7"), ("comment.id", -5), ("comment.body", None)):
        payload = copy.deepcopy(template)
        section, leaf = path.split(".")
        payload[section][leaf] = value
        broken.append(json.dumps(payload).encode())
    for i in range(malformed):
        body = broken[i % len(broken)]
        headers, _ = _signed(emu, repo, {"placeholder": True})
        requests.append(Request("malformed", _resign(headers, body, WEBHOOK_SECRET), body))
    rng.shuffle(requests)
    return requests


def _raw(port: int, r: Request) -> bytes:
    head = ["POST /api/gitea/webhook HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in r.headers.items() if k.lower() != "content-length"]
    head.append(f"Content-Length: {len(r.body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + r.body


async def _send_all(port: int, requests: list[Request]) -> tuple[list[Answer], float]:
    """Send every request over CONNECTIONS keep-alive connections to 127.0.0.1.

    A minimal HTTP/1.1 client on asyncio streams: httpx costs ~2.5 ms of CPU a request,
    which on two cores is taken from the server under test."""
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    answers: list[Answer] = []

    async def exchange(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, r: Request
    ) -> tuple[int, bytes, bool]:
        writer.write(_raw(port, r))
        await writer.drain()
        status = int((await reader.readuntil(b"\r\n")).split(b" ", 2)[1])
        length, close = 0, False
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "connection" and "close" in value.lower():
                close = True
        return status, await reader.readexactly(length), close

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not queue.empty():
                r = queue.get_nowait()
                async with asyncio.timeout(60):
                    status, raw, close = await exchange(reader, writer, r)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                answers.append(Answer(r, status, body))
                if close:
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
        finally:
            writer.close()

    started = time.monotonic()
    async with asyncio.timeout(240):
        await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    return answers, time.monotonic() - started


@pytest.fixture
def ingress(tmp_path: Path) -> Iterator[tuple[int, str]]:
    db_url = f"sqlite:///{tmp_path / 'forgeflow.db'}"
    port = free_port()
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_DATABASE_URL=db_url,
        FORGEFLOW_PORT=str(port),
        FORGEFLOW_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
        FORGEFLOW_TRIGGER_PERMISSION="none",
    )
    proc = start_serve(env, "--role", "ingress", stderr_path=tmp_path / "serve.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield port, db_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
            proc.wait(timeout=10)


def test_ten_thousand_deliveries_counted_exactly(
    ingress: tuple[int, str], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    port, db_url = ingress
    with GiteaEmulator(tmp_path / "gitea") as emu:
        requests = build_requests(emu, random.Random(SEED))
    sent = Counter(r.kind for r in requests)
    answers, seconds = asyncio.run(_send_all(port, requests))
    assert len(answers) == TOTAL

    by_status = Counter(a.status for a in answers)
    by_kind = Counter((a.request.kind, a.status) for a in answers)
    figures = (
        f"burst: {TOTAL} deliveries in {seconds:.1f} s ({TOTAL / seconds:.0f}/s, "
        f"{CONNECTIONS} connections) to one forgeflow serve --role ingress on SQLite; "
        f"sent {dict(sent)}; answers {dict(sorted(by_status.items()))}"
    )
    record_property("figures", figures)
    print(figures)

    assert not [a for a in answers if a.status >= 500], figures
    assert by_status[401] == sent["bad_signature"] == by_kind[("bad_signature", 401)], figures
    assert by_status[400] == sent["malformed"] == by_kind[("malformed", 400)], figures
    assert all(
        a.body and a.body.get("error") == "invalid_payload" for a in answers if a.status == 400
    )
    distinct = {r.comment for r in requests if r.kind == "valid"}
    assert by_status[202] == len(distinct), figures
    assert by_status[200] == sent["same_id"] + sent["replay"], figures
    assert set(by_status) == {200, 202, 400, 401}, figures

    # One task per comment: every answer about a comment names the same task.
    task_of: dict[int, set[str]] = {}
    for a in answers:
        if a.status in (200, 202):
            assert a.body is not None and a.request.comment is not None
            assert a.status == 202 or a.body["status"] == "duplicate", a.body
            task_of.setdefault(a.request.comment, set()).add(a.body["taskId"])
    assert set(task_of) == distinct
    assert all(len(ids) == 1 for ids in task_of.values())

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        metrics = client.get("/metrics").text
    served = {
        line.split('status="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("forgeflow_webhook_deliveries_total{")
    }
    assert served == {
        "accepted": len(distinct),
        "duplicate": sent["same_id"] + sent["replay"],
        "unauthorized": sent["bad_signature"],
        "invalid": sent["malformed"],
    }, served

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(tasks.c.task_id, tasks.c.comment_id, tasks.c.state)).all()
            stored = dict(
                conn.execute(
                    select(webhook_deliveries.c.status, func.count()).group_by(
                        webhook_deliveries.c.status
                    )
                ).all()
            )
            rejects = conn.execute(
                select(func.count())
                .select_from(audit_events)
                .where(audit_events.c.action == "webhook.reject")
                .where(audit_events.c.error_code == "invalid_signature")
            ).scalar_one()
    finally:
        engine.dispose()
    assert len(rows) == len(distinct)
    assert {r.comment_id for r in rows} == distinct
    assert {r.task_id for r in rows} == {next(iter(ids)) for ids in task_of.values()}
    assert {r.state for r in rows} == {"queued"}  # role ingress: nothing ran them
    # A signed delivery that is refused (malformed: 400) is kept as rejected, without its
    # body, so the deliveries page shows it.
    expected = {"accepted": len(distinct), "duplicate": sent["replay"]}
    assert stored == {**expected, "rejected": sent["malformed"]}, stored
    # One row per reason, source and 60 s interval (plus one count row per interval over).
    assert 1 <= rejects <= 2 * (2 + int(seconds // 60)), (rejects, sent["bad_signature"])
