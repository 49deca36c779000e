"""(d) of bench/suite.py: SQLite in one process vs PostgreSQL with 1, 2 and 4 workers.

Every configuration gets the same workload on fresh repositories: R repositories × T
issues, one mention per issue (so T tasks queue behind each repository's lease), turns
of fixed length, all mentions posted at once from 16 threads to the process that
receives webhooks. Makespan = last turn end − first 202 (turn times from the scripted
runtime's trace file, which every process appends to; same clock).

- `sqlite-1`: `forgeflow serve --role all` on SQLite, the default deployment and the
  baseline;
- `pg-all-1`: the same single process on PostgreSQL (what the database alone changes);
- `pg-ingress+N`: `--role ingress` plus N `--role worker` processes, each with its own
  worker id and data directory, on one fresh PostgreSQL database.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg

from _dispatch_support import TERMINAL, Serve, World, summary_ms, wait_for
from _suite_proof import launch

PG_ADMIN = os.environ.get("FORGEFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_url(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0]
    return f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)


class Deployment:
    """The processes of one configuration, and how to read its tasks' states."""

    def __init__(self, world: World, root: Path, name: str, workers: int, db: str, turn: float):
        self.world = world
        self.root = root / name
        self.name = name
        self.db = db
        self.pg_name = f"ffbench_{os.getpid()}_{name.replace('-', '_').replace('+', '_')}"
        self.trace = self.root / "trace.jsonl"
        self.procs: list[Serve] = []
        env = {"FORGEFLOW_TEST_TRACE": str(self.trace)}
        if db == "postgresql":
            env["FORGEFLOW_DATABASE_URL"] = _pg_url(self.pg_name)
        self.roles = [("all", "w0")] if workers == 0 else [("ingress", "in")]
        self.roles += [("worker", f"w{i}") for i in range(1, workers + 1)]
        for _role, wid in self.roles:
            extra = {**env, "FORGEFLOW_WORKER_ID": f"bench-{wid}"}
            serve = Serve(self.root / wid, world.emu.url, world.bot_token, turn, extra_env=extra)
            self.procs.append(serve)
        self.startup: list[dict[str, float]] = []

    @property
    def entry(self) -> Serve:
        return self.procs[0]

    def start(self) -> None:
        if self.db == "postgresql":
            _admin(f'CREATE DATABASE "{self.pg_name}"')
        # The first process migrates the schema; the others start once it is ready.
        for serve, (role, _) in zip(self.procs, self.roles, strict=True):
            self.startup.append(launch(serve, "--role", role))

    def stop(self) -> None:
        for serve in reversed(self.procs):
            serve.stop()
        if self.db == "postgresql":
            _admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')

    def states(self, ids: list[str]) -> dict[str, str]:
        if self.db == "sqlite":
            return self.entry.states(ids)
        url = _pg_url(self.pg_name).replace("+psycopg", "")
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT task_id, state FROM tasks WHERE task_id = ANY(%s)", (ids,)
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    def turns(self) -> dict[str, tuple[float, float | None]]:
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        lines = self.trace.read_text().splitlines() if self.trace.exists() else []
        for e in (json.loads(line) for line in lines if line.strip()):  # all processes' turns
            if e["event"] == "start":
                starts.setdefault(e["task"], e["t"])
            elif e["event"] == "end":
                ends[e["task"]] = e["t"]
        return {t: (s, ends.get(t)) for t, s in starts.items()}


def run_config(
    world: World,
    root: Path,
    name: str,
    workers: int,
    db: str,
    repos: int,
    per_repo: int,
    turn: float,
) -> dict[str, Any]:
    dep = Deployment(world, root, name, workers, db, turn)
    names = [f"{name.replace('+', '')}-{i:03d}" for i in range(repos)]
    try:
        dep.start()
        for r in names:
            world.add_repo(r, per_repo, dep.entry.url)
        targets = [(r, issue) for issue in range(1, per_repo + 1) for r in names]
        mentions = world.mention_all(targets)
        ids = [m.task_id for m in mentions]

        def done() -> dict[str, str] | None:
            states = dep.states(ids)
            ok = len(states) == len(ids) and all(s in TERMINAL for s in states.values())
            return states if ok else None

        states = wait_for(done, 120 + 3 * len(ids), f"{name}: all tasks terminal", step=0.25)
        turns = dep.turns()
        world.emu.flush_deliveries()
    finally:
        dep.stop()
    first = min(m.accepted for m in mentions)
    ends = [turns[i][1] or 0.0 for i in ids if i in turns]
    starts = [turns[i][0] for i in ids if i in turns]
    makespan = max(ends) - first
    return {
        "name": name,
        "database": db,
        "processes": len(dep.procs),
        "workers": max(workers, 1),
        "tasks": len(ids),
        "succeeded": sum(1 for s in states.values() if s == "succeeded"),
        "posting_s": round(max(m.accepted for m in mentions) - first, 3),
        "makespan_s": round(makespan, 3),
        "tasks_per_s": round(len(ids) / makespan, 2),
        "ideal_s": per_repo * turn,
        "last_start_s": round(max(starts) - first, 3),
        "latency_202_to_start": summary_ms([turns[m.task_id][0] - m.accepted for m in mentions]),
        "startup_s": [round(s["readyz_s"], 3) for s in dep.startup],
    }


def cluster(
    world: World, root: Path, repos: int, per_repo: int, turn: float, worker_counts: list[int]
) -> dict[str, Any]:
    configs: list[tuple[str, int, str]] = [("sqlite-1", 0, "sqlite"), ("pg-all-1", 0, "postgresql")]
    configs += [(f"pg-ingress+{n}", n, "postgresql") for n in worker_counts]
    runs = []
    for name, workers, db in configs:
        t0 = time.monotonic()
        runs.append(run_config(world, root, name, workers, db, repos, per_repo, turn))
        runs[-1]["wall_s"] = round(time.monotonic() - t0, 1)
    base = runs[0]["makespan_s"]
    for r in runs:
        r["speedup_vs_sqlite"] = round(base / r["makespan_s"], 2)
    return {"repos": repos, "per_repo": per_repo, "turn_s": turn, "runs": runs}
