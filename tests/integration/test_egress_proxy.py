"""The egress proxy on its Unix socket, spoken to as a jail's forwarder does, in front of
a real HTTP server on loopback (agent/proxy.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from forgeflow.agent.proxy import MAX_HEAD, Blocks, EgressProxy, parse_head
from forgeflow.domain.egress import EgressPolicy, parse_pins

NAME = "mirror.test"


async def _origin() -> tuple[asyncio.Server, int, list[bytes]]:
    """An HTTP server that answers every request with the request head it received."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1]), heads


async def _ask(sock: Path, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(data)
    await writer.drain()
    out = await reader.read()
    writer.close()
    return out


def _proxy(tmp_path: Path, port: int, blocked: list[tuple[str, int, str]]) -> EgressProxy:
    policy = EgressPolicy((NAME, "*"), (port,), parse_pins(f"{NAME}=127.0.0.1", "t"))
    return EgressProxy(policy, tmp_path / "egress.sock", lambda *a: blocked.append(a))


async def _plain_http_reaches_the_pinned_host_with_its_own_host_header(
    tmp_path: Path,
) -> None:
    server, port, heads = await _origin()
    blocked: list[tuple[str, int, str]] = []
    proxy = _proxy(tmp_path, port, blocked)
    await proxy.start()
    try:
        request = (
            f"GET http://{NAME}:{port}/simple/?q=1 HTTP/1.1\r\nHost: other.example\r\n"
            "Proxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n"
        )
        out = await _ask(proxy.unix_socket, request.encode())
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"ok")
        (head,) = heads
        assert head.startswith(b"GET /simple/?q=1 HTTP/1.1\r\n")
        assert f"Host: {NAME}:{port}\r\n".encode() in head
        assert b"other.example" not in head and b"Proxy-Authorization" not in head
        assert b"Connection: close" in head and blocked == []
        # CONNECT: a tunnel to the same host, bytes through unchanged.
        tunnel = f"CONNECT {NAME}:{port} HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"
        out = await _ask(proxy.unix_socket, tunnel.encode())
        assert out.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
        assert heads[1] == b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
    finally:
        await proxy.aclose()
        server.close()


async def _refusals_are_named_and_reported(tmp_path: Path) -> None:
    server, port, heads = await _origin()
    blocked: list[tuple[str, int, str]] = []
    proxy = _proxy(tmp_path, port, blocked)
    await proxy.start()
    try:
        for target in (f"127.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"{NAME}:22"):
            out = await _ask(proxy.unix_socket, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            assert out.startswith(b"HTTP/1.1 403 Forbidden"), out
        assert [b[:2] for b in blocked] == [
            ("127.1", port),
            ("localhost", port),
            ("::1", port),
            (NAME, 22),
        ]
        assert "non-public address (127.0.0.1)" in blocked[0][2]
        assert blocked[3][2] == "port 22 is not allowed"
        # Malformed or oversized heads are 400s, not records.
        out = await _ask(proxy.unix_socket, b"GET https://x/ HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400") and b"CONNECT for TLS" in out
        out = await _ask(proxy.unix_socket, b"GET http://x/ HTTP/1.1\r\nA: " + b"a" * MAX_HEAD)
        assert out.startswith(b"HTTP/1.1 400") and b"16 KiB" in out
        assert len(blocked) == 4 and heads == []
    finally:
        await proxy.aclose()
        server.close()


async def _a_jail_gets_a_bounded_number_of_connections(tmp_path: Path) -> None:
    policy = EgressPolicy((NAME,), (80,))
    proxy = EgressProxy(policy, tmp_path / "egress.sock", lambda *a: None, max_tunnels=2)
    await proxy.start()
    try:
        # Accepted in order: the first two hold both slots (their heads never end).
        held = [await asyncio.open_unix_connection(str(proxy.unix_socket)) for _ in range(2)]
        for _, writer in held:
            writer.write(b"CONNECT mirror.test:80 HTTP/1.1\r\n")
            await writer.drain()
        out = await _ask(proxy.unix_socket, b"CONNECT mirror.test:80 HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 503"), out
        for _, writer in held:
            writer.close()
    finally:
        await proxy.aclose()


def test_a_request_line_that_is_not_http_is_refused() -> None:
    for head in (
        b"GARBAGE\r\n\r\n",
        b"GET http://x/ SPDY/3\r\n\r\n",
        b"CONNECT x HTTP/1.1\r\n\r\n",
    ):
        with pytest.raises(Exception, match=r"request line|HTTP/1\.x|host:port"):
            parse_head(head)


def test_a_turns_blocks_are_bounded_and_cleaned() -> None:
    blocks = Blocks()
    for i in range(Blocks.LIMIT + 10):
        blocks.add(f"h{i}.example", 443, "not listed")
    blocks.add("h0.example", 443, "not listed")
    blocks.add("`@admin`\n.example", 80, "x")
    meta = blocks.metadata()
    assert len(meta["requests"]) == Blocks.LIMIT  # type: ignore[arg-type]
    assert meta["total"] == Blocks.LIMIT + 12
    assert "h0.example" in str(meta) and "`" not in str(meta) and "@" not in str(meta)


def test_plain_http_reaches_the_pinned_host_with_its_own_host_header(tmp_path: Path) -> None:
    asyncio.run(_plain_http_reaches_the_pinned_host_with_its_own_host_header(tmp_path))


def test_refusals_are_named_and_reported(tmp_path: Path) -> None:
    asyncio.run(_refusals_are_named_and_reported(tmp_path))


def test_a_jail_gets_a_bounded_number_of_connections(tmp_path: Path) -> None:
    asyncio.run(_a_jail_gets_a_bounded_number_of_connections(tmp_path))
