"""Scale-out and proof benchmarks (issue #7 item 4), each beside its baseline, one command:

    .venv/bin/python bench/suite.py --out docs/bench [--quick] [--only a,b,c,d,e,f]

(a) ingest: forgeflow vs a bare durable baseline (Starlette + uvicorn, one SQLite insert)
    vs Probot (bench/probot, `npm ci` here), same signed payloads  (_suite_ingest.py)
(b) 202 → turn start, beside the 202 itself                         (_suite_dispatch.py)
(c) cross-repository scaling, 1 → 200 repositories, beside one turn  (_suite_dispatch.py)
(d) SQLite single process vs PostgreSQL, 1 process and ingress + 1/2/4 workers
                                                                     (_suite_cluster.py)
(e) restart → first claim with 10,000 queued tasks, beside an empty start (_suite_proof.py)
(f) resident memory with 10,000 tasks / 1,000 sessions, beside empty   (_suite_proof.py)

Runs by hand, never under pytest. forgeflow's src/ at --ref (default HEAD) is copied
first and every process, this one included, imports that copy (the work tree is being
edited meanwhile). Writes bench/results/suite-<timestamp>.json, one PNG per benchmark
into --out, and the generated block of "Scale-out and proof benchmarks" in
docs/BENCHMARKS.md. Needs the PostgreSQL server on 127.0.0.1:5432 for (d) and Node/npm
for (a). Quick mode ≈ 10 minutes on 2 cores, full mode ≈ 40.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
SNAPSHOT_ENV = "BENCH_SUITE_SRC"  # set once the src snapshot is on PYTHONPATH
PARTS = "abcdef"


def snapshot_and_reexec(ref: str) -> None:
    """Copy src/ at `ref`, compile it (so no run pays for .pyc writing) and exec this
    script again with the copy first on PYTHONPATH; children inherit it."""
    sys.path.insert(0, str(BENCH))
    import servers

    tmp = Path(tempfile.mkdtemp(prefix="ff-suite-src-"))
    code = servers.snapshot_source(ref, tmp)
    compileall.compile_dir(code["src"], quiet=1)
    env = {**os.environ, SNAPSHOT_ENV: json.dumps(code), "PYTHONPATH": code["src"]}
    os.execve(sys.executable, [sys.executable, str(Path(__file__)), *sys.argv[1:]], env)  # noqa: S606


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    out: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=False)
    out["node"] = node.stdout.strip()
    try:
        import psycopg

        from _suite_cluster import PG_ADMIN

        with psycopg.connect(PG_ADMIN) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            out["postgres"] = row[0] if row else "?"
    except Exception as exc:  # (d) will fail on its own; the header just says so
        out["postgres"] = f"unreachable ({type(exc).__name__})"
    return out


def previous() -> dict[str, Any]:
    """The newest suite results, to keep the figures of parts not run this time."""
    files = sorted(RESULTS.glob("suite-*.json"))
    return json.loads(files[-1].read_text()) if files else {}


def run_parts(args: argparse.Namespace, root: Path, src: str) -> dict[str, Any]:
    import _suite_cluster
    import _suite_dispatch
    import _suite_ingest
    import _suite_proof
    import _suite_seed

    q = args.quick
    out: dict[str, Any] = {}

    def step(part: str, what: str) -> bool:
        if part not in args.only:
            return False
        print(f"[{part}] {what} ({time.strftime('%H:%M:%S')})", file=sys.stderr)
        return True

    def guarded(part: str, fn: Callable[[], dict[str, Any]]) -> None:
        """One part's failure is reported and the others still run (a shared machine
        makes long runs fragile); its figures then come from the previous results."""
        try:
            out[part] = fn()
        except Exception:
            traceback.print_exc()
            print(f"[{part}] FAILED; its figures are not updated", file=sys.stderr)

    if step("a", "ingest: forgeflow vs baseline vs Probot"):
        guarded("a", lambda: _suite_ingest.run(root / "ingest", src, q, args.nice))
    if not set(args.only) & set("bcdef"):
        return out
    world = _suite_dispatch.TimedWorld(root / "world")
    try:
        if step("b", "202 → turn start"):
            n, issues, cold = (30, 5, 5) if q else (100, 10, 10)
            guarded("b", lambda: _suite_dispatch.latency(world, root / "latency", n, issues, cold))
        if step("c", "scaling curve"):
            sizes = [1, 10, 50, 100, 200]
            guarded("c", lambda: _suite_dispatch.scaling_curve(world, root / "curve", sizes, 2.0))
        if step("d", "SQLite vs PostgreSQL workers"):
            repos, per, turn = (30, 2, 1.0) if q else (100, 2, 2.0)
            guarded(
                "d",
                lambda: _suite_cluster.cluster(
                    world, root / "cluster", repos, per, turn, [1, 2, 4]
                ),
            )
        if set(args.only) & set("ef"):
            print(f"[e/f] seeding 10,000 tasks ({time.strftime('%H:%M:%S')})", file=sys.stderr)
            seeded = _suite_seed.seed(
                world, root / "seed", repos=100, issues=10, per_issue=10, prefix="seed"
            )
            print(f"      seeded in {seeded.seconds:.0f} s", file=sys.stderr)
            if step("e", "restart to first claim"):
                runs = 1 if q else 3
                guarded("e", lambda: _suite_proof.restart_runs(world, seeded, root / "e", runs))
            if step("f", "resident memory"):
                settle = 5 if q else 15
                guarded("f", lambda: _suite_proof.memory_runs(world, seeded, root / "f", settle))
    finally:
        world.stop()
    return out


def write_outputs(result: dict[str, Any], out_dir: Path, docs: bool) -> None:
    import _suite_plots as plots
    import _suite_report as rep

    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        figdir = str(out_dir.resolve().relative_to((ROOT / "docs").resolve()))
    except ValueError:
        figdir = str(out_dir)
    lines = rep.header(result, figdir)
    parts = result["parts"]
    for key, plot, text in (
        ("a", plots.ingest, rep.ingest),
        ("b", plots.latency, rep.latency),
        ("c", plots.scaling, rep.scaling),
        ("d", plots.cluster, rep.cluster),
        ("e", plots.restart, rep.restart),
        ("f", plots.memory, rep.memory),
    ):
        if key in parts:
            plot(parts[key], out_dir)
            lines += text(parts[key], figdir)
    block = "\n".join(lines)
    print(block)
    if docs:
        rep.update_docs(ROOT / "docs" / "BENCHMARKS.md", block)
        print("updated docs/BENCHMARKS.md", file=sys.stderr)


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: processes stopped, dirs removed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench", help="PNG folder")
    p.add_argument("--quick", action="store_true", help="smaller runs, ≈ 10 minutes")
    p.add_argument("--only", default=PARTS, help="parts to run, e.g. 'ae' (others: last results)")
    p.add_argument("--ref", default="HEAD", help="git ref of src/ to serve, or 'worktree'")
    p.add_argument("--no-docs", action="store_true", help="leave docs/BENCHMARKS.md alone")
    p.add_argument("--from-json", type=Path, help="measure nothing: plots + docs from a file")
    p.add_argument("--nice", type=int, default=-10 if os.geteuid() == 0 else 0, help="(a) priority")
    args = p.parse_args()
    args.only = "".join(c for c in args.only.lower() if c in PARTS)
    if args.from_json is not None:
        write_outputs(json.loads(args.from_json.read_text()), args.out, not args.no_docs)
        return 0
    if SNAPSHOT_ENV not in os.environ:
        snapshot_and_reexec(args.ref)
    code = json.loads(os.environ[SNAPSHOT_ENV])
    signal.signal(signal.SIGTERM, _terminate)
    started = datetime.now(UTC)
    root = Path(tempfile.mkdtemp(prefix="ff-suite-"))
    t0 = time.monotonic()
    try:
        parts = run_parts(args, root, code["src"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(Path(code["src"]).parent, ignore_errors=True)
    kept = {k: v for k, v in previous().get("parts", {}).items() if k not in parts}
    name = f"suite-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    result = {
        "started": started.isoformat(timespec="seconds"),
        "command": "bench/suite.py " + " ".join(sys.argv[1:]),
        "mode": "quick" if args.quick else "full",
        "code": code["label"],
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": machine(),
        "results_file": name,
        "parts": {**kept, **parts},
        "kept_from_previous": sorted(kept),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote bench/results/{name}", file=sys.stderr)
    write_outputs(result, args.out, not args.no_docs)
    goals = [parts[k]["met"] for k in ("e", "f") if k in parts]
    return 0 if all(goals) else 1


if __name__ == "__main__":
    sys.exit(main())
