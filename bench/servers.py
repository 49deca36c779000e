"""Start, stop and audit the two servers of bench/ingest.py as real child processes."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
FORGEFLOW = str(VENV_BIN / "forgeflow")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    db_path: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def machine_load(seconds: float = 2.0) -> float:
    """Cores the whole machine kept busy over the next `seconds`."""

    def busy() -> float:  # user + nice + system + steal, as in loadgen.py
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return (sum(fields[:3]) + fields[7]) / os.sysconf("SC_CLK_TCK")

    b0, t0 = busy(), time.monotonic()
    time.sleep(seconds)
    return (busy() - b0) / (time.monotonic() - t0)


def wait_quiet(threshold: float, max_wait: float) -> tuple[float, float]:
    """Wait (at most `max_wait` s) until other processes use under `threshold` cores.

    The machine may be shared; a run that starts under load measures the neighbours.
    Returns the last load seen and the seconds waited."""
    start = time.monotonic()
    load = machine_load()
    while load >= threshold and time.monotonic() - start < max_wait:
        time.sleep(3)
        load = machine_load()
    return round(load, 3), round(time.monotonic() - start, 1)


def snapshot_source(ref: str, dest: Path) -> dict[str, str]:
    """Copy forgeflow's `src/` at git `ref` (or the work tree as it is now, for
    "worktree") to `dest`/src, so that every server of a run executes the same code even
    while the work tree changes. Read-only git commands; returns what was taken."""
    root = BENCH.parent
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD" if ref == "worktree" else ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    if ref == "worktree":
        shutil.copytree(root / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        label = f"work tree on {head[:10]}" + (" with uncommitted changes" if dirty else "")
    else:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", "--format=tar", head, "src"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        label = f"commit {head[:10]}"
    return {"ref": ref, "commit": head, "label": label, "src": str(dest / "src")}


def niced(nice: int) -> list[str]:
    """Command prefix running a process at scheduling priority `nice` (nice(1) execs, so
    the pid stays that of the process itself); negative values need root."""
    return ["nice", "-n", str(nice)] if nice else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
    env.update(extra)
    return env


def start_forgeflow(
    run_dir: Path,
    *,
    secret: str,
    gitea_url: str,
    gitea_token: str,
    role: str,
    src: str,
    nice: int = 0,
) -> Server:
    """`forgeflow serve` importing forgeflow from `src` (a snapshot_source copy)."""
    data_dir = run_dir / "data"
    port = free_port()
    env = _clean_env(
        FORGEFLOW_DATA_DIR=str(data_dir),
        FORGEFLOW_WEBHOOK_SECRET=secret,
        FORGEFLOW_GITEA_URL=gitea_url,
        FORGEFLOW_GITEA_TOKEN=gitea_token,
        FORGEFLOW_ADMIN_TOKEN="bench-admin-token-0123456789",
        PYTHONPATH=src,  # ahead of the editable install's .pth entry
    )
    log = run_dir / "forgeflow.stderr"
    with log.open("ab") as err:
        argv = [FORGEFLOW, "serve", "--host", "127.0.0.1", "--port", str(port), "--role", role]
        proc = subprocess.Popen(
            [*niced(nice), *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server("forgeflow", proc, port, data_dir / "forgeflow.db", log, env)
    _wait_healthy(server)
    return server


def start_baseline(run_dir: Path, *, nice: int = 0) -> Server:
    port = free_port()
    db = run_dir / "baseline.db"
    log = run_dir / "baseline.stderr"
    with log.open("ab") as err:
        argv = [sys.executable, str(BENCH / "baseline_app.py"), "--port", str(port)]
        proc = subprocess.Popen(
            [*niced(nice), *argv, "--db", str(db)],
            env=_clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server("baseline", proc, port, db, log)
    _wait_healthy(server)
    return server


def start_floor(
    run_dir: Path, *, secret: str, bot: str, src: str, minimal: bool = False, nice: int = 0
) -> Server:
    """bench/floor_app.py on a database migrated by forgeflow's code from `src`."""
    port = free_port()
    name = "floor-minimal" if minimal else "floor"
    db = run_dir / f"{name}.db"
    log = run_dir / f"{name}.stderr"
    with log.open("ab") as err:
        argv = [sys.executable, str(BENCH / "floor_app.py"), "--port", str(port), "--db", str(db)]
        proc = subprocess.Popen(
            [*niced(nice), *argv, "--secret", secret, "--bot", bot, *(["--minimal"] * minimal)],
            env=_clean_env(PYTHONPATH=src),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server(name, proc, port, db, log)
    _wait_healthy(server)
    return server


PROBOT = BENCH / "probot"


def setup_probot() -> str:
    """`npm ci` the pinned Probot app of bench/probot once (its lock file pins every
    package); returns the Probot version installed."""
    marker = PROBOT / "node_modules" / "probot" / "package.json"
    lock = PROBOT / "package-lock.json"
    if not marker.exists() or marker.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=PROBOT,
            check=True,
            timeout=600,
        )
    version: str = json.loads(marker.read_text())["version"]
    return version


def start_probot(run_dir: Path, *, secret: str, nice: int = 0) -> Server:
    """bench/probot/app.js on Node: Probot's createNodeMiddleware, nothing persisted."""
    port = free_port()
    log = run_dir / "probot.stderr"
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [*niced(nice), "node", str(PROBOT / "app.js"), str(port), secret],
            cwd=PROBOT,
            env=_clean_env(NODE_ENV="production"),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server("probot", proc, port, run_dir / "none.db", log)
    _wait_healthy(server)
    return server


def probot_handled(server: Server) -> int:
    """How many `issue_comment.created` mentions Probot's handler saw (its /healthz)."""
    return int(httpx.get(server.url + "/healthz", timeout=5).text.split()[1])


def imported_from(src: str) -> str:
    """Where `forgeflow` resolves with PYTHONPATH=src (proof the snapshot is used), after
    importing what `forgeflow serve` needs; raises when that code cannot even import."""
    probe = "import forgeflow, forgeflow.api, forgeflow.cli, forgeflow.services as s; "
    probe += "print(forgeflow.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=_clean_env(PYTHONPATH=src),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"forgeflow does not import from {src}: {last[0]} (try --ref)")
    return done.stdout.strip()


def _wait_healthy(server: Server, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}; see {server.log_path}"
            )
        try:
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop(server)
    raise RuntimeError(f"{server.name} did not become healthy within {timeout:.0f} s")


def stop(server: Server, timeout: float = 30.0) -> int | None:
    """SIGTERM (uvicorn shuts down gracefully and forgeflow closes its store), then kill."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)
    return server.proc.returncode


def _scalar(conn: sqlite3.Connection, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0])


def audit_forgeflow(db_path: Path, accepted: int, *, all_queued: bool) -> dict[str, Any]:
    """Every 202 must have left exactly one task behind (and nothing more); with no worker
    in the process (role ingress) every one of them must still be queued."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        tasks = _scalar(conn, "SELECT count(*) FROM tasks")
        by_state = dict(conn.execute("SELECT state, count(*) FROM tasks GROUP BY state"))
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM webhook_deliveries GROUP BY status")
        )
        audits = _scalar(conn, "SELECT count(*) FROM audit_events")
    finally:
        conn.close()
    return {
        "answers_202": accepted,
        "tasks": tasks,
        "tasks_by_state": by_state,
        "deliveries_by_status": statuses,
        "audit_events": audits,
        "ok": tasks == accepted == statuses.get("accepted", 0)
        and (not all_queued or by_state.get("queued", 0) == accepted),
    }


def audit_baseline(db_path: Path, accepted: int) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = _scalar(conn, "SELECT count(*) FROM deliveries")
    finally:
        conn.close()
    return {"answers_202": accepted, "rows": rows, "ok": rows == accepted}
