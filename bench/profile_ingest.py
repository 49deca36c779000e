"""Where forgeflow's ingest time goes: the companion of bench/ingest.py, run by hand.

    .venv/bin/pip install py-spy            # optional: the sampling part needs it
    .venv/bin/python bench/profile_ingest.py

Part 1, in process, one delivery at a time: the cost of each step of WebhookIngress.handle
(the two read transactions, the acceptance write transaction, the rest) and the SQL
statements each one runs. The store's sync entry points are wrapped by this script's
own instance attributes; forgeflow's code is unchanged.

Part 2, one INSERT built three ways (SQLAlchemy Core per call, prebuilt, raw DB-API).

Part 3, against a real `forgeflow serve --role ingress` at saturation (bench/loadgen.py):
CPU per OS thread from /proc, and with py-spy (`record --gil --nonblocking`) which
thread holds the GIL doing what, grouped by forgeflow function and by library.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

import ingest
import servers
from forgeflow.config import load_settings
from forgeflow.logs import configure
from forgeflow.services import build_services
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from loadgen import write_requests

BENCH = Path(__file__).resolve().parent
SNAPSHOT_ENV = "BENCH_FORGEFLOW_SRC"


def _split(raw: bytes) -> tuple[dict[str, str], bytes]:
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")[1:]
    return {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines)}, body


def in_process(work: Path, emu: GiteaEmulator, token: str, count: int) -> None:
    settings = load_settings(
        data_dir=work / "inproc",
        webhook_secret=ingest.SECRET,
        admin_token="bench-admin-token-0123456789",
        gitea_url=emu.url,
        gitea_token=token,
    )
    # Log as `forgeflow serve` does (one JSON line per accepted delivery), into /dev/null.
    sink = open(os.devnull, "w")  # noqa: SIM115 - open for the whole run
    real_stderr, sys.stderr = sys.stderr, sink
    try:
        configure("info")
    finally:
        sys.stderr = real_stderr
    services = build_services(settings)
    db = services.store.db
    spent: Counter[str] = Counter()
    statements: Counter[str] = Counter()

    def timed(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapper(unit: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(unit)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    db.write_sync = timed("write transaction", db.write_sync)  # type: ignore[method-assign]
    db.read_sync = timed("read transactions", db.read_sync)  # type: ignore[method-assign]
    for engine, label in ((db.writer, "writer"), (db.reader, "reader")):

        def tally(*_a: Any, _label: str = label) -> None:
            statements[_label] += 1

        event.listen(engine, "before_cursor_execute", tally)
    requests = [_split(r) for r in ingest.build_pool(emu, count + 200)]

    async def drive() -> float:
        for headers, body in requests[:200]:  # warm-up: caches, permission lookup
            await services.ingress.handle(headers, body)
        spent.clear()
        statements.clear()
        t0 = time.perf_counter()
        for headers, body in requests[200:]:
            reply = await services.ingress.handle(headers, body)
            assert reply.status_code == 202, reply
        return time.perf_counter() - t0

    total = asyncio.run(drive())
    services.store.close()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True)
    sink.close()
    print(f"\n## In process, one delivery at a time ({count} deliveries)\n")
    print(f"total per delivery: {total / count * 1e3:.3f} ms ({count / total:.0f}/s serial)")
    rest = total - sum(spent.values())
    for name, secs in [*spent.most_common(), ("everything else", rest)]:
        print(f"  {name:28} {secs / count * 1e3:7.3f} ms  {secs / total * 100:5.1f} %")
    for label, n in statements.items():
        print(f"  SQL statements, {label}: {n / count:.1f} per delivery (BEGIN included)")


def statement_styles(work: Path, count: int = 2000) -> None:
    """One audit_events insert, built three ways, inside one transaction each style."""
    from sqlalchemy import insert

    from forgeflow.domain.ids import new_event_id
    from forgeflow.store import Store
    from forgeflow.store.schema import audit_events
    from forgeflow.store.types import utcnow

    store = Store(f"sqlite:///{work / 'styles.db'}")
    store.migrate()

    def values() -> dict[str, Any]:
        return {
            **dict.fromkeys(("turn_id", "error_code"), None),
            **{"event_id": new_event_id(), "task_id": "t", "session_key": "s"},
            **{"repo_key": "r", "actor": "gitea:user:alice", "action": "webhook.accept"},
            **{"from_state": "received", "to_state": "queued", "state_version": 2},
            **{"delivery_id": "d", "comment_id": 1, "timestamp": utcnow()},
            "metadata": {"eventType": "issue_comment"},
        }

    prebuilt = insert(audit_events)
    columns = list(values())
    sql = f"INSERT INTO audit_events ({', '.join(columns)}) VALUES ({', '.join('?' * 15)})"  # noqa: S608 - fixed column names

    def raw(conn: Any) -> None:
        v = values()
        v["timestamp"], v["metadata"] = v["timestamp"].isoformat(), json.dumps(v["metadata"])
        conn.exec_driver_sql(sql, tuple(v.values()))

    styles: list[tuple[str, Callable[[Any], Any]]] = [
        (
            "insert(t).values(**v) per call (forgeflow today)",
            lambda c: c.execute(insert(audit_events).values(**values())),
        ),
        ("prebuilt insert(t) + parameter dict", lambda c: c.execute(prebuilt, values())),
        ("exec_driver_sql, DB-API parameters", raw),
    ]
    print(f"\n## One 15-column INSERT, {count} times in one transaction\n")
    for _label, fn in styles:  # warm-up: compiled caches, file growth
        store.db.write_sync(lambda c, fn=fn: [fn(c) for _ in range(200)])
    for label, fn in styles:
        t0 = time.perf_counter()
        store.db.write_sync(lambda c, fn=fn: [fn(c) for _ in range(count)])
        print(f"  {label:50} {(time.perf_counter() - t0) / count * 1e6:6.1f} µs")
    store.close()


def _threads(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _aggregate(raw: Path, seconds: float, rate: int) -> None:
    by_thread: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    by_library: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        n = int(n_text)
        frames = stack.split(";")
        thread = re.sub(r"_\d+$", "", frames[0].split(": ", 1)[-1])
        by_thread[thread] += n
        total += n
        own = [f for f in frames[1:] if "forgeflow/" in f]
        key = re.sub(r":\d+\)$", ")", own[-1]) if own else "(outside forgeflow code)"
        by_function[f"{thread}: {key}"] += n
        leaf = frames[-1]
        lib = next(
            (
                name
                for name in ("sqlalchemy", "fastapi", "starlette", "uvicorn", "structlog")
                if f"{name}/" in leaf
            ),
            "forgeflow" if "forgeflow/" in leaf else "other (stdlib, asyncio, json, ...)",
        )
        by_library[lib] += n
    held = total / (seconds * rate)
    print(f"\nGIL held {held:.2f} of the time; samples by thread holding it:")
    for name, n in by_thread.most_common():
        print(f"  {n / total * 100:5.1f} %  {name}")
    print("\nBy library of the innermost frame:")
    for name, n in by_library.most_common():
        print(f"  {n / total * 100:5.1f} %  {name}")
    print("\nBy innermost forgeflow function (top 20):")
    for name, n in by_function.most_common(20):
        print(f"  {n / total * 100:5.1f} %  {name}")


def under_load(work: Path, emu: GiteaEmulator, token: str, seconds: float) -> None:
    pool = work / "profile-requests.bin"
    write_requests(pool, 20_000, ingest.build_pool(emu, 20_000))
    server = servers.start_forgeflow(
        work,
        secret=ingest.SECRET,
        gitea_url=emu.url,
        gitea_token=token,
        role="ingress",
        src=os.environ[SNAPSHOT_ENV],
    )
    out = work / "profile-loadgen.json"
    cmd = [sys.executable, str(BENCH / "loadgen.py"), str(pool), str(server.port), "saturate"]
    cmd += ["--duration", str(seconds + 6), "--warmup", "300", "--out", str(out)]
    cmd += ["--server-pid", str(server.proc.pid)]
    spy = shutil.which("py-spy", path=str(servers.VENV_BIN)) or shutil.which("py-spy")
    raw = work / "py-spy.raw"
    try:
        gen = subprocess.Popen(cmd)
        time.sleep(3)
        before, t0 = _threads(server.proc.pid), time.monotonic()
        if spy:
            spy_cmd = [spy, "record", "--pid", str(server.proc.pid), "--rate", "100"]
            spy_cmd += ["--duration", str(int(seconds)), "--gil", "--nonblocking", "--threads"]
            spy_cmd += ["--format", "raw", "--output", str(raw)]
            subprocess.run(
                spy_cmd,
                check=True,
                capture_output=True,
                timeout=seconds + 60,
            )
        else:
            time.sleep(seconds)
        after, wall = _threads(server.proc.pid), time.monotonic() - t0
        gen.wait(timeout=seconds + 120)
    finally:
        servers.stop(server)
    result = json.loads(out.read_text())
    print(f"\n## forgeflow serve at saturation ({result['connections']} connections)\n")
    print(f"accepted/s {result['accepted_per_s']}, p50 {result['p50_ms']} ms, server CPU ")
    print(f"{result['server_cpu_cores']} cores; per OS thread (busiest first):")
    for tid, cpu in sorted(after.items(), key=lambda kv: before.get(kv[0], 0.0) - kv[1]):
        used = (cpu - before.get(tid, 0.0)) / wall
        if used >= 0.01:
            print(f"  thread {tid}: {used:.2f} cores")
    if spy:
        _aggregate(raw, int(seconds), 100)
    else:
        print("\n(py-spy not installed: `.venv/bin/pip install py-spy` for the GIL profile)")


def main() -> int:
    p = argparse.ArgumentParser(description="where forgeflow's ingest time goes")
    p.add_argument("--count", type=int, default=2000, help="in-process deliveries")
    p.add_argument("--seconds", type=float, default=15.0, help="py-spy recording")
    p.add_argument("--ref", default="HEAD", help="git ref to profile, or 'worktree'")
    args = p.parse_args()
    if SNAPSHOT_ENV not in os.environ:
        # Freeze the code (as bench/ingest.py does) and run again on the copy.
        with tempfile.TemporaryDirectory(prefix="ff-profile-code-") as tmp:
            code = servers.snapshot_source(args.ref, Path(tmp))
            print(f"forgeflow code: {code['label']}")
            env = {**os.environ, "PYTHONPATH": code["src"], SNAPSHOT_ENV: code["src"]}
            child = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env, check=False)
            return child.returncode
    print(f"forgeflow imported from {Path(configure.__code__.co_filename).parent}")
    with tempfile.TemporaryDirectory(prefix="ff-profile-") as tmp:
        work = Path(tmp)
        emu = GiteaEmulator(work / "git").start()
        try:
            token = emu.add_user(ingest.BOT)
            emu.add_user(ingest.AUTHOR)
            emu.add_repo(ingest.OWNER, ingest.REPO)
            emu.set_permission(ingest.OWNER, ingest.REPO, ingest.AUTHOR, "write")
            emu.set_permission(ingest.OWNER, ingest.REPO, ingest.BOT, "admin")
            in_process(work, emu, token, args.count)
            statement_styles(work)
            under_load(work, emu, token, args.seconds)
        finally:
            emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
