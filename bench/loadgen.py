"""HTTP/1.1 load generator for bench/ingest.py: one process, asyncio + uvloop, raw sockets.

It sends pre-built request bytes (one distinct delivery each) over keep-alive connections
to 127.0.0.1 and parses only the status line and Content-Length of each answer, so it
costs far less CPU than the servers it measures. Two modes:

* ``fixed``: open loop. Request i is due at ``start + i / rate`` whether or not earlier
  answers are back; its latency runs from that due time to the last byte of its answer,
  so queueing (client- or server-side) is never hidden (no coordinated omission).
* ``saturate``: closed loop. ``connections`` workers send back to back until the
  duration is over; latency runs from send to the last byte of the answer.

Usage: loadgen.py REQUESTS_FILE PORT MODE [options]; writes one JSON object to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import resource
import struct
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

MAGIC = b"FFBENCH1"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)
REQUEST_TIMEOUT = 10.0
# The answer that counts as accepted: 202 (forgeflow, baseline); Probot answers 200.
ACCEPT_STATUS = 202


def write_requests(path: Path, count: int, requests: Iterator[bytes]) -> int:
    """Stream `count` requests to `path`; returns their total size in bytes."""
    total = 0
    with path.open("wb") as fh:
        fh.write(MAGIC + struct.pack("<I", count))
        for req in itertools.islice(requests, count):
            fh.write(struct.pack("<I", len(req)))
            fh.write(req)
            total += len(req)
    return total


def read_requests(path: Path) -> list[memoryview]:
    """All requests of `path`, as views into one buffer (no per-request copy)."""
    data = memoryview(path.read_bytes())
    if data[:8] != MAGIC:
        raise ValueError(f"{path} is not a request file")
    (count,) = struct.unpack_from("<I", data, 8)
    out: list[memoryview] = []
    pos = 12
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


class Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, float]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is duck-typed

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        head = bytes(self.buf[: end + 2])
        match = _CONTENT_LENGTH.search(head)
        if match is None:
            self.waiter.set_exception(ValueError("answer without Content-Length"))
            return
        total = end + 4 + int(match.group(1))
        if len(self.buf) < total:
            return
        status = int(head[9:12])
        del self.buf[:total]
        if _CLOSE.search(head):
            self.closed = True
        self.waiter.set_result((status, now))

    async def request(self, req: memoryview) -> tuple[int, float]:
        """Send one request; the answer's status and the time its last byte arrived."""
        assert self.transport is not None and self.waiter is None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(req)
        try:
            return await asyncio.wait_for(self.waiter, REQUEST_TIMEOUT)
        finally:
            self.waiter = None


class Client:
    """A pool of connections; broken ones are replaced on the next use."""

    def __init__(self, port: int, size: int) -> None:
        self.port = port
        self.idle: asyncio.LifoQueue[Connection] = asyncio.LifoQueue()
        self.size = size

    async def open(self) -> None:
        for _ in range(self.size):
            self.idle.put_nowait(await self._connect())

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(Connection, "127.0.0.1", self.port)
        return proto

    async def send(self, req: memoryview) -> tuple[int, float]:
        """Status (0 on a transport error or timeout) and completion time."""
        conn = await self.idle.get()
        try:
            if conn.closed:
                conn = await self._connect()
            status, done = await conn.request(req)
        except (OSError, ValueError, TimeoutError):
            if conn.transport is not None:
                conn.transport.abort()
            conn.closed = True
            status, done = 0, time.perf_counter()
        self.idle.put_nowait(conn)
        return status, done

    def close(self) -> None:
        while not self.idle.empty():
            conn = self.idle.get_nowait()
            if conn.transport is not None:
                conn.transport.close()


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runq_wait(pid: int) -> float:
    """Seconds the threads of `pid` have spent runnable but waiting for a CPU."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _machine_busy() -> float:
    """CPU seconds the machine's cores spent in user, system or steal time; interrupt
    time is left out, as it is of the per-process figures (same as servers.py)."""
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentile(sorted_ms: list[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    idx = min(len(sorted_ms) - 1, max(0, round(q / 100 * len(sorted_ms) + 0.5) - 1))
    return round(sorted_ms[idx], 3)


def summarise(latencies_s: list[float]) -> dict[str, float | None]:
    ms = sorted(x * 1000 for x in latencies_s)
    return {
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "p999_ms": percentile(ms, 99.9),
        "max_ms": round(ms[-1], 3) if ms else None,
    }


async def closed_loop(
    client: Client, reqs: Sequence[memoryview], workers: int, duration: float
) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    next_index = 0
    start = time.perf_counter()
    deadline = start + duration
    last_done = start

    async def worker() -> None:
        nonlocal next_index, last_done
        while next_index < len(reqs) and time.perf_counter() < deadline:
            req = reqs[next_index]
            next_index += 1
            sent = time.perf_counter()
            status, done = await client.send(req)
            statuses[status] += 1
            if status == ACCEPT_STATUS:
                latencies.append(done - sent)
            last_done = max(last_done, done)

    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = last_done - start
    return {
        "sent": next_index,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "elapsed_s": round(elapsed, 3),
        "pool_exhausted": next_index >= len(reqs),
        "accepted_per_s": round(statuses[ACCEPT_STATUS] / elapsed, 1) if elapsed > 0 else 0.0,
        **summarise(latencies),
    }


async def open_loop(client: Client, reqs: Sequence[memoryview], rate: float) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    lags: list[float] = []
    start = time.perf_counter() + 0.05

    async def one(req: memoryview, due: float) -> None:
        lags.append(time.perf_counter() - due)
        status, done = await client.send(req)
        statuses[status] += 1
        # From the due time: a late send or a wait for a free connection counts as latency.
        latencies.append(done - due)

    tasks: list[asyncio.Task[None]] = []
    for i, req in enumerate(reqs):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0.0005:
            await asyncio.sleep(delay - 0.0005)
        while time.perf_counter() < due:  # the last half millisecond, spun
            pass
        tasks.append(asyncio.create_task(one(req, due)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    lag_ms = sorted(x * 1000 for x in lags)
    return {
        "sent": len(reqs),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "elapsed_s": round(elapsed, 3),
        "target_rate": rate,
        "accepted_per_s": round(statuses[ACCEPT_STATUS] / elapsed, 1) if elapsed > 0 else 0.0,
        "send_lag_p99_ms": percentile(lag_ms, 99),
        "send_lag_max_ms": round(lag_ms[-1], 3) if lag_ms else None,
        **summarise(latencies),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    reqs = read_requests(args.requests)
    warm, rest = reqs[: args.warmup], reqs[args.warmup :]
    client = Client(args.port, args.connections)
    await client.open()
    try:
        warmup = await closed_loop(client, warm, min(8, args.connections), 60.0)
        cpu0, srv0, t0 = _own_cpu(), _cpu_seconds(args.server_pid), time.perf_counter()
        busy0 = _machine_busy()
        waits0 = _runq_wait(args.server_pid), _runq_wait(os.getpid())
        if args.mode == "fixed":
            count = min(len(rest), round(args.rate * args.duration))
            result = await open_loop(client, rest[:count], args.rate)
        else:
            result = await closed_loop(client, rest, args.connections, args.duration)
        wall = time.perf_counter() - t0
        own = (_own_cpu() - cpu0) / wall
        server = (_cpu_seconds(args.server_pid) - srv0) / wall
        result["loadgen_cpu_cores"] = round(own, 3)
        result["server_cpu_cores"] = round(server, 3)
        # Whatever else ran on the machine meanwhile: noise the figures do not account for.
        result["other_cpu_cores"] = round((_machine_busy() - busy0) / wall - own - server, 3)
        # Time our threads were ready to run but had no CPU: what neighbours cost us.
        result["server_runq_wait"] = round((_runq_wait(args.server_pid) - waits0[0]) / wall, 4)
        result["loadgen_runq_wait"] = round((_runq_wait(os.getpid()) - waits0[1]) / wall, 4)
    finally:
        client.close()
    ok = str(ACCEPT_STATUS)
    accepted = result["statuses"].get(ok, 0) + warmup["statuses"].get(ok, 0)
    return {
        "mode": args.mode,
        "connections": args.connections,
        "warmup": {k: warmup[k] for k in ("sent", "statuses")},
        "accepted_total": accepted,
        "sent_total": result["sent"] + warmup["sent"],
        **result,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("requests", type=Path)
    p.add_argument("port", type=int)
    p.add_argument("mode", choices=["fixed", "saturate"])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--server-pid", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--accept-status", type=int, default=202, help="answer that counts")
    args = p.parse_args()
    global ACCEPT_STATUS
    ACCEPT_STATUS = args.accept_status
    import uvloop  # uvicorn[standard] brings it; the servers under test use it too

    result = uvloop.run(run(args))
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
