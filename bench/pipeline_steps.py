"""Per-step overhead of no-op pipeline steps on SQLite: forgeflow's engine beside DBOS
Transact workflow steps, in the same run (issue #5: goal ≤ 1.0× DBOS's per-step cost).

forgeflow: a template ``trigger → s1 → … → sN → terminal`` (chain) and ``trigger →
N parallel steps → join → terminal`` (fan-out) whose steps run a body that returns at
once, through the real :class:`PipelineEngine` on a fresh SQLite file (WAL, the
store's own settings). The clock runs from ``engine.start`` to the commit that ends
the run. DBOS: a ``@DBOS.workflow`` calling N ``@DBOS.step`` no-ops on a fresh SQLite
system database, run in a child interpreter that has ``dbos`` installed
(``--dbos-python``, default ``/work/benchvenv/bin/python``: dbos is no dependency of
forgeflow). Both report the median of ``--repeat`` runs after a warm-up run; DBOS runs before
and after forgeflow and its runs are pooled.

    .venv/bin/python bench/pipeline_steps.py --steps 100 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DBOS_PYTHON = os.environ.get("FORGEFLOW_BENCH_DBOS_PYTHON", "/work/benchvenv/bin/python")

DBOS_CHILD = r"""
import json, os, sys, time, logging
from dbos import DBOS
path, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
logging.getLogger("dbos").setLevel(logging.WARNING)
DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{path}",
             "run_admin_server": False, "log_level": "WARNING"})

@DBOS.step()
def noop(i: int) -> int:
    return i

@DBOS.workflow()
def chain(n: int) -> int:
    for i in range(n):
        noop(i)
    return n

DBOS.launch()
chain(min(n, 10))  # warm-up
times = []
for _ in range(repeat):
    t = time.perf_counter()
    chain(n)
    times.append(time.perf_counter() - t)
DBOS.destroy()
import dbos
from importlib.metadata import version
print(json.dumps({"times": times, "version": version("dbos")}))
"""


def _chain(n: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "kind": "trigger"}]
    nodes += [{"id": f"s{i}", "kind": "listen", "bodyKey": "bench.noop"} for i in range(n)]
    nodes.append({"id": "end", "kind": "terminal"})
    ids = [x["id"] for x in nodes]
    edges = [{"from": a, "to": b} for a, b in itertools.pairwise(ids)]
    return {
        "key": "chain",
        "name": "chain",
        "enabled": True,
        "config": {"maxSteps": 10 * n + 10},
        "nodes": nodes,
        "edges": edges,
        "triggers": [{"type": "manual"}],
    }


def _fanout(n: int) -> dict[str, Any]:
    steps = [f"p{i}" for i in range(n)]
    return {
        "key": "fanout",
        "name": "fanout",
        "enabled": True,
        "config": {"maxSteps": 10 * n + 10, "maxConcurrentSteps": n},
        "nodes": [
            {"id": "start", "kind": "trigger"},
            *({"id": s, "kind": "listen", "bodyKey": "bench.noop"} for s in steps),
            {"id": "join", "kind": "join"},
            {"id": "end", "kind": "terminal"},
        ],
        "edges": [
            *({"from": "start", "to": s} for s in steps),
            *({"from": s, "to": "join"} for s in steps),
            {"from": "join", "to": "end"},
        ],
        "triggers": [{"type": "manual"}],
    }


async def _forgeflow(n: int, repeat: int, folder: Path) -> dict[str, list[float]]:
    from forgeflow.pipelines import templates
    from forgeflow.pipelines.adapters import LocalWorkspace
    from forgeflow.pipelines.bodies import register_builtins
    from forgeflow.pipelines.definition import load_definition
    from forgeflow.pipelines.engine import PipelineEngine
    from forgeflow.pipelines.kinds import TERMINAL_RUN_STATUSES, RunStatus
    from forgeflow.pipelines.registry import PipelineBodyRegistry, StepContext
    from forgeflow.store import Store

    finished: dict[str, asyncio.Event] = {}

    class Observed(PipelineEngine):
        # Observation only: the engine hands every run row it moved to _after; the
        # clock stops when one arrives finished (no polling reads competing with it).
        async def _after(self, run: dict[str, Any] | None, **kw: Any) -> None:
            await super()._after(run, **kw)
            if run is not None and RunStatus(run["status"]) in TERMINAL_RUN_STATUSES:
                event = finished.get(run["run_id"])
                if event is not None:
                    event.set()

    async def noop(ctx: StepContext) -> Any:
        return None

    store = Store(f"sqlite:///{folder / 'forgeflow.db'}")
    store.migrate()
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    registry.register("bench.noop", noop)
    engine = Observed(
        store,
        registry,
        owner="bench/1",
        node_prefix="bench/",
        workspace=LocalWorkspace(str(folder / "ws"), str(folder / "scratch")),
        poll_seconds=1.0,
        lease_ttl=60.0,
    )
    out: dict[str, list[float]] = {}
    try:
        for doc in (_chain(n), _fanout(n)):
            loaded = load_definition(doc, bodies=registry.keys())
            await store.write(lambda c, x=loaded: templates.create(c, x, actor="bench"))
        await engine.start_loop()
        for key in ("chain", "fanout"):
            times = []
            for i in range(repeat + 1):
                started_at = time.perf_counter()
                started = await engine.start(key)
                run_id = started.run["run_id"]
                event = finished.setdefault(run_id, asyncio.Event())
                if started.run["status"] == RunStatus.RUNNING:
                    await asyncio.wait_for(event.wait(), timeout=600)
                elapsed = time.perf_counter() - started_at
                if i:  # the first run warms caches and the thread pools
                    times.append(elapsed)
            out[key] = times
    finally:
        await engine.stop()
        store.close()
    return out


def _dbos(n: int, repeat: int, folder: Path, python: str) -> dict[str, Any] | None:
    if not Path(python).exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [python, "-c", DBOS_CHILD, str(folder / "dbos.sqlite"), str(n), str(repeat)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=folder,
    )
    if done.returncode != 0:
        raise SystemExit(f"dbos child failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _ms_per_step(times: list[float], n: int) -> float:
    return round(statistics.median(times) / n * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dbos-python", default=DBOS_PYTHON)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    n = args.steps
    with tempfile.TemporaryDirectory(prefix="ff-bench-steps-") as tmp:
        folder = Path(tmp)
        # DBOS before and after forgeflow, pooled: on a shared machine the load drifts,
        # and bracketing keeps the drift from favouring either side.
        before = _dbos(n, args.repeat, folder / "before", args.dbos_python)
        ff = asyncio.run(_forgeflow(n, args.repeat, folder))
        after = _dbos(n, args.repeat, folder / "after", args.dbos_python)
        dbos = None
        if before is not None and after is not None:
            dbos = {"version": before["version"], "times": before["times"] + after["times"]}
    figures: dict[str, Any] = {
        "steps": n,
        "repeat": args.repeat,
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "forgeflow_chain_ms_per_step": _ms_per_step(ff["chain"], n),
        "forgeflow_fanout_ms_per_step": _ms_per_step(ff["fanout"], n),
    }
    if dbos is not None:
        figures["dbos_version"] = dbos["version"]
        figures["dbos_chain_ms_per_step"] = _ms_per_step(dbos["times"], n)
        figures["ratio_chain"] = round(
            figures["forgeflow_chain_ms_per_step"] / figures["dbos_chain_ms_per_step"], 2
        )
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if dbos is None:
        print(f"(dbos not found at {args.dbos_python}: no comparison)", file=sys.stderr)


if __name__ == "__main__":
    main()
