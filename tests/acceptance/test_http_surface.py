"""The HTTP surface against outsiders, on a real ``forgeflow serve --role ingress``.

Each attack is sent as an outsider would (raw sockets where a client library would
refuse to send it), and each test asserts the answer, that the server's resident size
after the attack is within :data:`RSS_MARGIN` of before, and that a signed webhook was
still answered meanwhile (within a generous 2 s bound: this is a liveness check, not a
speed test; the measured figure is printed).
"""

from __future__ import annotations

import contextlib
import json
import select as sockets
import socket
import string
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select

from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.support.process import FORGEFLOW, clean_env, free_port, start_serve, wait_healthy

RSS_MARGIN = 48 * 1024 * 1024  # resident size after an attack, at most this above before
ANSWER_BOUND = 2.0  # seconds a signed webhook may take while the server is under attack
HEADER_TIMEOUT = 3  # the server's FORGEFLOW_HTTP_HEADER_TIMEOUT_SECONDS in these tests
ALLOWED_FAILURES = 5
WEBHOOK = "/api/gitea/webhook"
# The routes an outsider reaches, with their body limit under the defaults.
ROUTES = {
    WEBHOOK: 8 * 1024 * 1024,
    "/webhooks/some-token": 1024 * 1024,
    "/api/gitea-workflow/control/pause": 1024 * 1024,
    "/ui/login": 64 * 1024,
}


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    db_url: str
    emu: GiteaEmulator
    delivery: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def open_fds(self) -> int:
        return len(list(Path(f"/proc/{self.proc.pid}/fd").iterdir()))

    def signed_webhook(self) -> tuple[int, float]:
        """A real mention, signed as Gitea signs it: (status, seconds to the answer)."""
        self.delivery += 1
        number = self.emu.add_issue("acme", "widget", title=f"t{self.delivery}", author="alice")
        comment = self.emu.post_comment("acme", "widget", number, author="alice", body="x")
        payload = self.emu.comment_payload("acme", "widget", number, comment, sender="alice")
        payload["comment"]["body"] = "@ccweb-bot please look"
        headers, body = self.emu.build_delivery(
            "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
        )
        started = time.monotonic()
        r = httpx.post(self.url + WEBHOOK, content=body, headers=headers, timeout=30)
        return r.status_code, time.monotonic() - started

    def audit_rows(self, action: str) -> int:
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                count = select(func.count()).select_from(audit_events)
                return int(conn.execute(count.where(audit_events.c.action == action)).scalar_one())
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("http")
    db_url = f"sqlite:///{tmp / 'forgeflow.db'}"
    port = free_port()
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp / "data"),
        FORGEFLOW_DATABASE_URL=db_url,
        FORGEFLOW_PORT=str(port),
        FORGEFLOW_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
        FORGEFLOW_TRIGGER_PERMISSION="none",
        FORGEFLOW_SANDBOX="none",
        FORGEFLOW_HTTP_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT),
        FORGEFLOW_AUTH_FAILURES_ALLOWED=str(ALLOWED_FAILURES),
    )
    with GiteaEmulator(tmp / "gitea") as emu:
        emu.add_repo("acme", "widget")
        emu.add_user("alice")
        emu.set_permission("acme", "widget", "alice", "write")
        proc = start_serve(env, "--role", "ingress", stderr_path=tmp / "serve.log")
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            yield Server(port, proc, db_url, emu)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    log = (tmp / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def _raw(port: int, head: bytes, body: bytes = b"", *, source: str = "127.0.0.1") -> bytes:
    """Send bytes as they are, a piece at a time, stopping once the server answers (it
    may refuse before the body), and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=15, source_address=(source, 0)) as s:
        chunks: list[bytes] = []
        try:
            s.sendall(head)
            for at in range(0, len(body), 65536):
                if sockets.select([s], [], [], 0)[0]:
                    break  # answered already
                s.sendall(body[at : at + 65536])
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        except (BrokenPipeError, ConnectionResetError):
            while True:  # what arrived before the reset is still the answer
                try:
                    chunk = s.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks)


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def _json(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def _post_head(path: str, length: int | None, extra: bytes = b"") -> bytes:
    sized = b"Content-Length: %d\r\n" % length if length is not None else b""
    chunked = b"" if length is not None else b"Transfer-Encoding: chunked\r\n"
    return (
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + sized
        + chunked
        + extra
        + b"\r\n"
    )


def test_oversize_bodies_are_refused_per_route_without_being_read(server: Server) -> None:
    before = server.rss()
    for path, limit in ROUTES.items():
        declared = _raw(server.port, _post_head(path, 50 * 1024 * 1024), b"{" * 4096)
        expected = 401 if path.startswith("/api/gitea-workflow/") else 413
        assert _status(declared) == expected, (path, declared[:300])
        # Chunked, no length: counted as it streams and refused once past the limit.
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
        auth = b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
        streamed = _raw(
            server.port, _post_head(path, None, auth), chunk * (limit // (64 * 1024) + 4)
        )
        assert _status(streamed) == 413, (path, streamed[:300])
        assert _json(streamed)["error"] == "payload_too_large"
    # A body just under the webhook's limit is read (and refused for its signature).
    fits = _raw(server.port, _post_head(WEBHOOK, 1024 * 1024), b" " * (1024 * 1024))
    assert (_status(fits), _json(fits)["error"]) == (401, "invalid_signature")
    status, seconds = server.signed_webhook()
    print(f"signed webhook after the oversize bodies: {status} in {seconds:.3f} s")
    assert status == 202 and seconds < ANSWER_BOUND
    after = server.rss()
    print(f"resident size before/after the oversize bodies: {before >> 20}/{after >> 20} MiB")
    assert after - before < RSS_MARGIN, (before, after)


def test_non_ascii_signatures_and_csrf_values_are_4xx(server: Server) -> None:
    for name in (b"X-Gitea-Signature", b"X-Forgejo-Signature", b"X-Hub-Signature-256"):
        value = b"sha256=\xc3\xa9" + b"\xff" * 30 if name.startswith(b"X-Hub") else b"\xc3\xa9" * 32
        answer = _raw(server.port, _post_head(WEBHOOK, 2, name + b": " + value + b"\r\n"), b"{}")
        assert (_status(answer), _json(answer)["error"]) == (401, "invalid_signature"), name
    answer = _raw(
        server.port,
        _post_head("/webhooks/abc", 2, b"X-Hub-Signature-256: sha256=\xe2\x82\xac\r\n"),
        b"{}",
    )
    assert _status(answer) == 404  # no such trigger, and no crash on the way
    form = b"csrf=%C3%A9%E2%82%AC&token=%F0%9F%A6%80"
    head = _post_head("/ui/login", len(form), b"Cookie: ff_login=\xc3\xa9.\xff\r\n")
    answer = _raw(
        server.port, head.replace(b"application/json", b"application/x-www-form-urlencoded"), form
    )
    assert _status(answer) == 403, answer[:300]


def test_an_oversize_header_is_431_and_a_token_is_checked_before_the_body(
    server: Server,
) -> None:
    huge = b"X-Filler: " + b"a" * (64 * 1024) + b"\r\n"
    answer = _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
    assert _status(answer) == 431, answer[:200]
    # No token: 401 at once, though the body was announced and never sent.
    started = time.monotonic()
    path = "/api/gitea-workflow/control/pause"
    answer = _raw(server.port, _post_head(path, 512 * 1024))
    assert (_status(answer), _json(answer)["error"]) == (401, "unauthorized")
    assert time.monotonic() - started < 10  # the body deadline (30 s) was not waited for


def test_deep_json_is_refused_before_it_is_parsed(server: Server) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    auth = b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
    path = "/api/gitea-workflow/control/pause"
    answer = _raw(server.port, _post_head(path, len(deep), auth), deep)
    assert (_status(answer), _json(answer)["error"]) == (400, "invalid_payload")
    assert b"nested deeper" in answer
    # Depth inside a string is text, not nesting.
    flat = json.dumps({"requestId": "deep-ok", "reason": "[" * 1500}).encode()
    answer = _raw(server.port, _post_head(path, len(flat), auth), flat)
    assert _status(answer) == 200, answer[:300]
    httpx.post(
        server.url + "/api/gitea-workflow/control/resume",
        json={"requestId": "deep-ok-resume"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )


def test_many_slow_connections_do_not_stop_the_webhook(server: Server) -> None:
    before_rss, before_fds = server.rss(), server.open_fds()
    slow = []
    for i in range(200):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(b"POST /api/gitea/webhook HTTP/1.1\r\nHost: x\r\nX-Slow-%d: " % i)
        slow.append(s)
    try:
        time.sleep(0.5)
        seconds = []
        for _ in range(3):
            status, took = server.signed_webhook()
            assert status == 202
            seconds.append(took)
        print(f"signed webhook with 200 slow connections open: {max(seconds):.3f} s at most")
        assert max(seconds) < ANSWER_BOUND
        # The server ends every connection whose request head did not arrive in time.
        deadline = time.monotonic() + HEADER_TIMEOUT + 10
        for s in slow:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1024) == b"", "a slow connection was answered instead of closed"
    finally:
        for s in slow:
            s.close()
    # The server closes its side when it reads each client's close: wait for that.
    wait_for(
        lambda: server.open_fds() <= before_fds + 5,
        timeout=60,
        what=f"the server's descriptors back near {before_fds}",
    )
    assert server.rss() - before_rss < RSS_MARGIN


def test_many_large_bodies_at_once_are_bounded_in_total(server: Server) -> None:
    """Each body fits the webhook's limit, but not all of them at once: past the total
    of bodies being received (64 MiB) a request is 503 server_busy, and memory stays
    bounded; the webhook is answered again once they are gone."""
    before = server.rss()
    piece = b" " * (1024 * 1024)
    held = []
    for _ in range(12):  # 12 x 7 MiB announced, 6 MiB sent, none finished
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(_post_head(WEBHOOK, 7 * 1024 * 1024))
        held.append(s)
    answers = []
    try:
        for _ in range(6):
            for s in held:
                with contextlib.suppress(OSError):  # refused and closed: answer read below
                    s.sendall(piece)
        time.sleep(1)
        for s in held:
            s.settimeout(0.5)
            try:
                answers.append(s.recv(4096))
            except TimeoutError:
                answers.append(b"")  # still being received
        peak = server.rss()
    finally:
        for s in held:
            s.close()
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    print(
        f"12 bodies of 6 MiB at once: {len(busy)} refused busy; RSS {before >> 20} -> "
        f"{peak >> 20} MiB"
    )
    assert busy and all(b"server_busy" in a for a in busy)
    assert peak - before < 64 * 1024 * 1024 + RSS_MARGIN
    time.sleep(0.5)
    status, seconds = server.signed_webhook()
    assert status == 202 and seconds < ANSWER_BOUND


def test_brute_force_is_slowed_per_address_and_audited_bounded(server: Server) -> None:
    rows = server.audit_rows("api.auth.reject")
    answers = []
    with httpx.Client(
        base_url=server.url, transport=httpx.HTTPTransport(local_address="127.0.0.3")
    ) as attacker:
        for i in range(40):
            r = attacker.get(
                "/api/gitea-workflow/overview", headers={"Authorization": f"Bearer guess-{i}"}
            )
            answers.append(r.status_code)
        locked = attacker.get(
            "/api/gitea-workflow/overview", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
    assert answers[:ALLOWED_FAILURES] == [401] * ALLOWED_FAILURES
    assert set(answers[ALLOWED_FAILURES:]) == {429}
    # Locked out: even the right token is not checked from that address for now.
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    # Another address is not affected, and neither is the webhook.
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4")) as other:
        ok = other.get(
            server.url + "/api/gitea-workflow/overview",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    assert ok.status_code == 200
    assert server.signed_webhook()[0] == 202
    # 40 refusals, two reasons: two audit rows, not forty (the rest are counted).
    assert server.audit_rows("api.auth.reject") - rows == 2


def test_a_signature_storm_writes_one_audit_row(server: Server) -> None:
    rows = server.audit_rows("webhook.reject")
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.5")) as c:
        for i in range(100):
            r = c.post(
                server.url + WEBHOOK,
                content=b"{}",
                headers={"X-Gitea-Signature": "00" * 32, "X-Gitea-Delivery": "d" * 5000 + str(i)},
            )
            assert r.status_code == 401
    assert server.audit_rows("webhook.reject") - rows == 1
    engine = create_engine(server.db_url)
    try:
        with engine.connect() as conn:
            last = conn.execute(
                select(audit_events.c.delivery_id, audit_events.c.metadata)
                .where(audit_events.c.action == "webhook.reject")
                .order_by(audit_events.c.seq.desc())
            ).first()
    finally:
        engine.dispose()
    assert last is not None and len(last.delivery_id) <= 120  # a long value is cut
    assert last.metadata["source"] == "127.0.0.5"


ODD = st.one_of(
    st.binary(min_size=1, max_size=40).map(
        lambda b: bytes(c for c in b if c not in b"\r\n\x00") or b"\xff"
    ),
    st.text(alphabet=string.printable + "éü€\u200b🦀", min_size=1, max_size=40).map(
        lambda t: t.replace("\r", "").replace("\n", "").encode("utf-8") or b"x"
    ),
)
HEADERS = st.sampled_from(
    [
        b"X-Gitea-Signature",
        b"X-Forgejo-Signature",
        b"X-Hub-Signature-256",
        b"X-Gitea-Delivery",
        b"X-Gitea-Event",
        b"X-Forgeflow-Timestamp",
        b"Idempotency-Key",
        b"Authorization",
        b"Cookie",
        b"Content-Type",
        b"Sec-Fetch-Site",
    ]
)
PATHS = st.sampled_from(
    [WEBHOOK, "/webhooks/abc", "/api/gitea-workflow/overview", "/ui/login", "/ui/logout"]
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=PATHS, headers=st.lists(st.tuples(HEADERS, ODD), max_size=5), body=ODD)
def test_no_500_from_any_header_or_body(
    server: Server, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    extra = b"".join(name + b": " + value.strip() + b"\r\n" for name, value in headers)
    # A form post with a CSRF field of odd bytes, a cookie of odd bytes: all input.
    if path.startswith("/ui/"):
        body = b"csrf=" + body + b"&token=" + body
    head = _post_head(path, len(body), extra.replace(b"Content-Type", b"X-Content-Type"))
    if path.startswith("/ui/"):
        head = head.replace(b"application/json", b"application/x-www-form-urlencoded")
    answer = _raw(server.port, head, body, source="127.0.0.6")
    if not answer:
        return  # h11 closed a connection it could not parse: no answer, no crash
    status = _status(answer)
    assert status < 500, (path, headers, body, answer[:500])


def test_a_short_admin_token_is_refused_at_start_with_one_line(tmp_path: Path) -> None:
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}",
        FORGEFLOW_ADMIN_TOKEN="hunter2",
        FORGEFLOW_SANDBOX="none",
    )
    done = subprocess.run(
        [str(Path(FORGEFLOW)), "serve", "--role", "ingress", "--port", str(free_port())],
        env=env,
        capture_output=True,
        timeout=60,
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "FORGEFLOW_ADMIN_TOKEN" in lines[0] and "20 characters" in lines[0]
    assert "hunter2" not in done.stderr.decode()
