"""Restart and memory benchmarks of bench/suite.py: (e) and (f).

(e) Restart to first claim: a database holding 10,000 queued tasks (1,000 sessions in
    100 repositories), `forgeflow serve` started on it; from the exec of the process
    to the first `task.claim` audit row and to the first turn start, side by side with
    the same process started on an empty database (exec → /readyz).
(f) Resident memory: the same 10,000 tasks, all but the newest task of each repository
    finished, so the process starts, works 100 tasks and settles; VmRSS and VmHWM of the
    serve process from /proc, side by side with the same process on an empty database.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

import _suite_seed as seeding
from _dispatch_support import FORGEFLOW, TERMINAL, Serve, World, wait_for

RESTART_GOAL_S = 1.0
MEMORY_GOAL_MB = 200.0


def launch(serve: Serve, *args: str) -> dict[str, float]:
    """Exec `forgeflow serve [args]` and poll until /healthz and /readyz answer; returns the exec
    time (epoch s) and the seconds from it to each answer."""
    serve.workdir.mkdir(parents=True, exist_ok=True)
    with (serve.workdir / "serve.log").open("ab") as err:
        t_exec = time.time()
        serve.proc = subprocess.Popen(
            [FORGEFLOW, "serve", *args], env=serve.env(), stdout=subprocess.DEVNULL, stderr=err
        )
    out = {"exec": t_exec}
    with httpx.Client(timeout=2) as http:
        for path in ("/healthz", "/readyz"):

            def answers(path: str = path) -> bool:
                if serve.proc is not None and serve.proc.poll() is not None:
                    raise RuntimeError(f"forgeflow exited: {serve.log()}")
                try:
                    return http.get(serve.url + path).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(answers, 60, f"{path} of {serve.workdir.name}", step=0.005)
            out[path.strip("/") + "_s"] = time.time() - t_exec
    return out


def first_claim(serve: Serve, timeout: float = 60) -> float:
    """Epoch seconds of the first `task.claim` audit row (written by the serve process)."""

    def found() -> float | None:
        row = (
            serve.db()
            .execute("SELECT min(timestamp) FROM audit_events WHERE action = 'task.claim'")
            .fetchone()
        )
        if not row or row[0] is None:
            return None
        return datetime.fromisoformat(row[0]).replace(tzinfo=UTC).timestamp()

    return wait_for(found, timeout, "first claim", step=0.02)


def first_turn_start(serve: Serve, timeout: float = 60) -> float:
    def found() -> float | None:
        starts = [e["t"] for e in serve.trace() if e["event"] == "start"]
        return min(starts) if starts else None

    return wait_for(found, timeout, "first turn start", step=0.05)


def memory(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM / VmSize of `pid` in MB (from /proc/<pid>/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "VmSize", "RssAnon", "RssFile"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def _new_serve(world: World, workdir: Path, turn: float) -> Serve:
    return Serve(workdir, world.emu.url, world.bot_token, turn)


def restart_runs(world: World, seeded: seeding.Seeded, root: Path, runs: int) -> dict[str, Any]:
    """Each run: a fresh copy of the seeded database (or an empty one), one cold start."""
    empty: list[dict[str, float]] = []
    full: list[dict[str, float]] = []
    for i in range(runs):
        serve = _new_serve(world, root / f"restart-empty-{i}", 0.2)
        try:
            empty.append(launch(serve))
        finally:
            serve.stop()
        serve = _new_serve(world, root / f"restart-full-{i}", 0.2)
        seeding.copy_db(seeded, serve.workdir / "data")
        try:
            times = launch(serve)
            times["first_claim_s"] = first_claim(serve) - times["exec"]
            times["first_turn_start_s"] = first_turn_start(serve) - times["exec"]
            full.append(times)
        finally:
            serve.stop()
    med = _medians
    return {
        "tasks": seeded.tasks,
        "sessions": seeded.sessions,
        "repos": len(seeded.repos),
        "runs": runs,
        "empty": {"runs": empty, **med(empty)},
        "seeded": {"runs": full, **med(full)},
        "goal_s": RESTART_GOAL_S,
        "met": med(full)["first_claim_s"] <= RESTART_GOAL_S,
    }


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in runs[0] if k.endswith("_s")]
    out = {}
    for k in keys:
        values = sorted(r[k] for r in runs)
        out[k] = round(values[len(values) // 2], 3)
    return out


def memory_run(
    world: World, seeded: seeding.Seeded | None, root: Path, name: str, settle: float
) -> dict[str, Any]:
    """Start serve (seeded: all but one task per repository finished), let it work what is
    queued, settle, read its memory; RSS is also sampled every 0.5 s for the plot."""
    serve = _new_serve(world, root / name, 0.2)
    queued = 0
    if seeded is not None:
        db = seeding.copy_db(seeded, serve.workdir / "data")
        queued = seeding.finish_all_but_newest(db)
    samples: list[tuple[float, float]] = []
    try:
        times = launch(serve)
        assert serve.proc is not None
        pid = serve.proc.pid

        def sample() -> None:
            samples.append((round(time.time() - times["exec"], 2), memory(pid)["VmRSS"]))

        if queued:

            def drained() -> bool:
                sample()
                rows = (
                    serve.db()
                    .execute("SELECT state FROM tasks WHERE state NOT IN ('succeeded')")
                    .fetchall()
                )
                return all(r[0] in TERMINAL for r in rows)

            wait_for(drained, 300, "queued tasks done", step=0.5)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            sample()
            time.sleep(0.5)
        mem = memory(pid)
        states = dict(
            serve.db().execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall()
        )
        sessions = serve.db().execute("SELECT count(*) FROM sessions").fetchone()[0]
    finally:
        serve.stop()
    return {
        "tasks_by_state": states,
        "sessions": sessions,
        "worked": queued,
        "settle_s": settle,
        "readyz_s": round(times["readyz_s"], 3),
        "memory_mb": mem,
        "rss_samples": samples,
    }


def memory_runs(world: World, seeded: seeding.Seeded, root: Path, settle: float) -> dict[str, Any]:
    empty = memory_run(world, None, root, "memory-empty", settle)
    full = memory_run(world, seeded, root, "memory-seeded", settle)
    rss = full["memory_mb"]["VmRSS"]
    return {
        "empty": empty,
        "seeded": full,
        "goal_mb": MEMORY_GOAL_MB,
        "met": rss <= MEMORY_GOAL_MB and full["memory_mb"]["VmHWM"] <= MEMORY_GOAL_MB,
    }
