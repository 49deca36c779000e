"""Dispatch benchmark: from a mention's 202 to the agent turn, through the scheduler.

Run by hand, never by pytest:

    .venv/bin/python bench/dispatch.py              # all scenarios, ~5 minutes on 2 cores

A Gitea emulator runs in this process (bot `ccweb-bot` with admin on every repository,
`alice` with write) and delivers the webhooks itself; each scenario runs a fresh, real
`forgeflow serve` on SQLite with the scripted runtime
(FORGEFLOW_AGENT_RUNTIME=forgeflow_testkit.runtimes:scripted_runtime), whose turns only
wait and write their start/end times (time.time()) to a trace file. The 202 time is
time.time() in this process when the emulator's post_comment returns, which is after
forgeflow's 202 answer arrived.

1. latency: 202 → turn start, one mention at a time, each waiting for its task to end.
   Cold = the first task on a fresh repository; warm = repository cloned and the
   issue's session worktree present (one untimed task per issue first).
2. scaling: N repositories × 1 task, turns of --turn seconds, all mentions posted at
   once from 16 threads; makespan = last turn end − first 202. Cold round first (fresh
   repositories), then the warm round on the same issues.
3. serial: 10 tasks on 10 issues of one (already cloned) repository, all posted at once;
   no two turns may overlap; overhead = makespan / (10 × turn) − 1.
4. profile (unless --no-profile): warm latency again with git trace2 on every git
   process forgeflow runs and py-spy on the serve process, and a warm scaling round with
   py-spy and CPU accounting. Figures of 1–3 come from runs without these tools.

Writes bench/results/dispatch-<timestamp>.json, prints Markdown tables and rewrites the
generated block of the "Dispatch" section of docs/BENCHMARKS.md (unless --no-docs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import _dispatch_profile as prof
import _dispatch_report as report
from _dispatch_support import Mention, Serve, World, summary_ms

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NewServe = Callable[..., Serve]


def finish(serve: Serve, world: World, m: Mention, settle: float, timeout: float = 60) -> float:
    """Wait for the task to end (succeeded), drain the emulator's hook queue, settle;
    return the task's 202 → turn start latency."""
    state = serve.wait_terminal([m.task_id], timeout)[m.task_id]
    if state != "succeeded":
        raise RuntimeError(f"task {m.task_id} ended {state}")
    world.emu.flush_deliveries()
    time.sleep(settle)
    return serve.turn_times()[m.task_id][0] - m.accepted


def breakdown(serve: Serve, mentions: list[Mention], chains: bool = False) -> dict[str, Any]:
    audits = serve.audit(m.task_id for m in mentions)
    turns = serve.turn_times()
    paths = [prof.chain(audits[m.task_id], turns[m.task_id][0]) for m in mentions]
    accept = [
        m.accepted - next(t for a, t in audits[m.task_id] if a == "webhook.accept")
        for m in mentions
    ]
    out: dict[str, Any] = {
        "steps": prof.rank(paths),
        "accept_row_to_202_received": summary_ms(accept),
    }
    if chains:
        out["chains"] = paths
    return out


def warm_run(
    world: World, serve: Serve, repo: str, issues: int, n: int
) -> tuple[list[Mention], dict[str, float]]:
    """One untimed task per issue (clone + worktrees), then n timed mentions in turn."""
    world.add_repo(repo, issues, serve.url)
    for issue in range(1, issues + 1):
        finish(serve, world, world.mention(repo, issue), 0.05)
    cpu = prof.CpuMeter(serve.pid)
    timed: list[Mention] = []
    for k in range(n):
        timed.append(world.mention(repo, 1 + k % issues))
        finish(serve, world, timed[-1], 0.1)
    return timed, cpu.stop()


def latencies(serve: Serve, mentions: list[Mention]) -> list[float]:
    turns = serve.turn_times()
    return [turns[m.task_id][0] - m.accepted for m in mentions]


def latency(world: World, new_serve: NewServe, n: int, issues: int, cold_n: int) -> dict[str, Any]:
    serve = new_serve("latency", 0.2)
    cold: list[Mention] = []
    for i in range(cold_n):
        repo = f"cold{i:02d}"
        world.add_repo(repo, 1, serve.url)
        cold.append(world.mention(repo, 1))
        finish(serve, world, cold[-1], 0.1)
    warm, usage = warm_run(world, serve, "warm", issues, n)
    return {
        "turn_s": 0.2,
        "cpu": usage,
        "warm": summary_ms(latencies(serve, warm)),
        "cold": summary_ms(latencies(serve, cold)),
        "warm_breakdown": breakdown(serve, warm),
        "cold_breakdown": breakdown(serve, cold),
    }


def scaling_round(serve: Serve, world: World, repos: list[str], turn: float) -> dict[str, Any]:
    cpu = prof.CpuMeter(serve.pid)
    ms = world.mention_all([(r, 1) for r in repos])
    states = serve.wait_terminal([m.task_id for m in ms], 120 + 2 * len(ms))
    usage = cpu.stop()
    turns = serve.turn_times()
    first = min(m.accepted for m in ms)
    ends = [turns[m.task_id][1] or 0.0 for m in ms]
    starts = [turns[m.task_id][0] for m in ms]
    makespan = max(ends) - first
    bad = {t: s for t, s in states.items() if s != "succeeded"}
    ours = sum(v for k, v in usage.items() if k.endswith("_s") and k not in ("wall_s", "foreign_s"))
    world.emu.flush_deliveries()
    return {
        "tasks": len(ms),
        "succeeded": len(ms) - len(bad),
        "not_succeeded": bad,
        "posting_s": round(max(m.accepted for m in ms) - first, 3),
        "first_start_s": round(min(starts) - first, 3),
        "last_start_s": round(max(starts) - first, 3),
        "makespan_s": round(makespan, 3),
        "ratio": round(makespan / turn, 3),
        "cpu_ms_per_task": round(ours / len(ms) * 1000, 1),
        # This much CPU work, spread perfectly over every core, takes at least:
        "cpu_floor_s": round(ours / (os.cpu_count() or 1), 2),
        "latency": summary_ms([turns[m.task_id][0] - m.accepted for m in ms]),
        "cpu": usage,
        "breakdown": breakdown(serve, ms),
    }


def scaling(world: World, new_serve: NewServe, count: int, turn: float) -> dict[str, Any]:
    serve = new_serve("scaling", turn)
    repos = [f"s{i:03d}" for i in range(count)]
    for r in repos:
        world.add_repo(r, 1, serve.url)
    cold = scaling_round(serve, world, repos, turn)
    time.sleep(1.0)
    warm = scaling_round(serve, world, repos, turn)
    return {"repos": count, "turn_s": turn, "cold": cold, "warm": warm}


def serial_round(serve: Serve, world: World, issues: list[int], turn: float) -> dict[str, Any]:
    cpu = prof.CpuMeter(serve.pid)
    ms = [world.mention("serial", i) for i in issues]
    states = serve.wait_terminal([m.task_id for m in ms], 60 + 4 * turn * len(ms))
    usage = cpu.stop()
    turns = serve.turn_times()
    spans = [(turns[m.task_id][0], turns[m.task_id][1] or 0.0) for m in ms]
    by_start = sorted(spans)
    overlaps = sum(1 for a, b in itertools.pairwise(by_start) if b[0] < a[1])
    makespan = max(e for _, e in spans) - min(m.accepted for m in ms)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(by_start)]
    audits = serve.audit(m.task_id for m in ms)
    claims = [next(t for a, t in audits[m.task_id] if a == "task.claim") for m in ms]
    to_claim = [c - prev[1] for prev, c in zip(spans, claims[1:], strict=False)]
    to_start = [s[0] - c for s, c in zip(spans[1:], claims[1:], strict=True)]
    world.emu.flush_deliveries()
    return {
        "tasks": len(ms),
        "succeeded": sum(1 for s in states.values() if s == "succeeded"),
        "overlapping_pairs": overlaps,
        "fifo": [s for s, _ in spans] == [s for s, _ in by_start],
        "makespan_s": round(makespan, 3),
        "overhead": round(makespan / (len(ms) * turn) - 1, 4),
        "first_start_ms": round((spans[0][0] - ms[0].accepted) * 1000, 1),
        "handoff_gap": summary_ms(gaps),
        # turn end → next claim: the turn's last events, then one transaction records
        # its end, moves it to verifying_reply, gives the lease back and claims the
        # next task (the reply is verified meanwhile); next claim → its turn start:
        # the same chain as the latency breakdown.
        "handoff_end_to_claim": summary_ms(to_claim),
        "handoff_claim_to_start": summary_ms(to_start),
        "cpu": usage,
    }


def serial(world: World, new_serve: NewServe, count: int, turn: float) -> dict[str, Any]:
    serve = new_serve("serial", turn)
    world.add_repo("serial", count + 1, serve.url)
    finish(serve, world, world.mention("serial", count + 1), 0.2, timeout=60 + turn)
    issues = list(range(1, count + 1))
    fresh = serial_round(serve, world, issues, turn)
    time.sleep(0.5)
    warm = serial_round(serve, world, issues, turn)
    return {"turn_s": turn, "fresh_sessions": fresh, "warm_sessions": warm}


def profile(world: World, new_serve: NewServe, root: Path, n: int, repos: int) -> dict[str, Any]:
    """Warm latency with git trace2 + py-spy, a warm scaling round with py-spy, and the
    same two with uvloop hidden from the serve process (uvicorn then runs asyncio's loop)."""
    bin_dir, trace_dir = prof.git_wrapper(root / "profile-git")
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    serve = new_serve("profile", 0.2, PATH=path)
    spy = _spy(serve, root / "pyspy-latency.txt")
    ms, usage = warm_run(world, serve, "pwarm", 5, n)
    b = breakdown(serve, ms, chains=True)
    git = prof.git_by_step(prof.read_git_trace(trace_dir), b.pop("chains"))
    out: dict[str, Any] = {
        "latency": {"tasks": n, "breakdown": b, "git": git, "cpu": usage, "py_spy": spy.stop()}
    }
    serve = new_serve("profile-scaling", 2.0)
    spy = _spy(serve, root / "pyspy-scaling.txt", start=False)
    out["scaling_warm"] = profile_scaling(world, serve, "p", repos, spy)
    out["scaling_py_spy"] = spy.stop()

    shim = root / "no-uvloop" / "uvloop"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("hidden by bench/dispatch.py")\n')
    serve = new_serve("whatif-latency", 0.2, PYTHONPATH=str(shim.parent))
    ms, usage = warm_run(world, serve, "qwarm", 5, n)
    out["asyncio_loop"] = {
        "latency": summary_ms(latencies(serve, ms)),
        "cpu": usage,
        "breakdown": breakdown(serve, ms),
    }
    serve = new_serve("whatif-scaling", 2.0, PYTHONPATH=str(shim.parent))
    out["asyncio_loop"]["scaling_warm"] = profile_scaling(world, serve, "q", repos, None)
    return out


def profile_scaling(
    world: World, serve: Serve, prefix: str, repos: int, spy: prof.PySpy | None
) -> dict[str, Any]:
    names = [f"{prefix}{i:03d}" for i in range(repos)]
    for r in names:
        world.add_repo(r, 1, serve.url)
    scaling_round(serve, world, names, 2.0)  # untimed cold round
    time.sleep(1.0)
    if spy is not None:
        spy.start()
    return scaling_round(serve, world, names, 2.0)


def _spy(serve: Serve, out: Path, start: bool = True) -> prof.PySpy:
    spy = prof.PySpy(serve.pid, out)
    _spies.append(spy)
    if start:
        spy.start()
    return spy


_spies: list[prof.PySpy] = []


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--latency-n", type=int, default=100, help="warm timed mentions")
    p.add_argument("--latency-issues", type=int, default=10, help="warm issues they rotate over")
    p.add_argument("--cold-n", type=int, default=10, help="cold mentions (fresh repositories)")
    p.add_argument("--repos", type=int, default=100, help="repositories in the scaling run")
    p.add_argument("--serial-n", type=int, default=10, help="tasks in the serial run")
    p.add_argument("--turn", type=float, default=2.0, help="turn seconds (scaling, serial)")
    p.add_argument("--profile-n", type=int, default=30, help="mentions in the profile pass")
    p.add_argument("--no-profile", action="store_true", help="skip the profile pass")
    p.add_argument("--no-docs", action="store_true", help="leave docs/BENCHMARKS.md alone")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="S",
        help="first wait up to S seconds until other processes use < 0.3 cores for 15 s",
    )
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited ignored
    root = Path(tempfile.mkdtemp(prefix="forgeflow-dispatch-"))
    servers: list[Serve] = []
    world: World | None = None

    def new_serve(name: str, turn: float, **env: str) -> Serve:
        assert world is not None
        while servers:  # one serve at a time: scenarios run one after the other
            servers.pop().stop()
        s = Serve(root / name, world.emu.url, world.bot_token, turn, extra_env=env)
        servers.append(s)
        s.start()
        return s

    wait_quiet(args.wait_quiet)
    started = datetime.now(UTC)
    result: dict[str, Any] = {"started": started.isoformat(), "args": vars(args)}
    try:
        world = World(root)
        result["machine"] = machine()
        result["machine"]["loadavg_1m_at_start"] = prof.loadavg()
        t0 = time.monotonic()
        result["latency"] = latency(
            world, new_serve, args.latency_n, args.latency_issues, args.cold_n
        )
        result["scaling"] = scaling(world, new_serve, args.repos, args.turn)
        result["serial"] = serial(world, new_serve, args.serial_n, args.turn)
        if not args.no_profile:
            result["profile"] = profile(world, new_serve, root, args.profile_n, args.repos)
        result["duration_s"] = round(time.monotonic() - t0, 1)
    finally:
        for spy in _spies:
            spy.kill()
        for s in servers:
            s.stop()
        if world is not None:
            world.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)
    result["goals"] = report.goals(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"dispatch-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    tables = report.markdown(result)
    print(tables)
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    if not args.no_docs:
        report.update_docs(ROOT / "docs" / "BENCHMARKS.md", tables, out.name)
        print("updated docs/BENCHMARKS.md", file=sys.stderr)
    return 0 if all(g["met"] for g in result["goals"]) else 1


def wait_quiet(limit: float) -> None:
    """Wait (at most ``limit`` seconds) for three 5-second windows with < 0.3 busy cores."""
    deadline, quiet = time.monotonic() + limit, 0
    while quiet < 3 and time.monotonic() < deadline:
        busy = prof.machine_busy()
        time.sleep(5)
        quiet = quiet + 1 if (prof.machine_busy() - busy) / 5 < 0.3 else 0


def machine() -> dict[str, Any]:
    git = subprocess.run(["git", "--version"], capture_output=True, text=True, check=False)

    def read_git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return {
        "commit": read_git("rev-parse", "HEAD"),
        "uncommitted_src": read_git("status", "--porcelain", "--", "src").splitlines(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "git": git.stdout.strip(),
        "database": "sqlite (WAL)",
    }


if __name__ == "__main__":
    sys.exit(main())
