"""What the scripts of bench/ share: the Gitea emulator of the testkit in this process, a
real ``forgeflow serve`` child process on SQLite, signed deliveries, the real Codex path
(its settings, the scripted model answering, a serve driving it), percentiles and the
description of the machine a figure was measured on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"  # raw JSON of each run; not committed
FORGEFLOW = str(Path(sys.executable).parent / "forgeflow")
BOT, USER, OWNER = "ccweb-bot", "alice", "acme"
SECRET = "whsec-bench-0123456789"
ADMIN_TOKEN = "admin-bench-token-abcdef"
SCRIPTED = "forgeflow_testkit.runtimes:scripted_runtime"
TERMINAL = {"succeeded", "failed", "failed_reply", "aborted", "waiting_user", "blocked_workspace"}
TERMINAL |= {"succeeded_with_rest_fallback"}
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
GITEA_MCP = str(Path(sys.executable).parent / "gitea-mcp")  # PyPI's, a test extra


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(check: Callable[[], T | None], timeout: float, what: str, step: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy; bounded in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"{what} not met within {timeout:g}s")


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
    }


def machine() -> dict[str, Any]:
    """CPU model and cores (lscpu), the commit measured and how busy the machine was."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln)

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_src": bool(git("status", "--porcelain", "--", "src")),
        "loadavg_1m": os.getloadavg()[0],
        "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return out


def epoch(stamp: str) -> float:
    """Epoch seconds of a timestamp forgeflow stored (naive, in UTC)."""
    return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()


def codex_env(home: Path, model_url: str, sandbox: str = "bwrap") -> dict[str, str]:
    """A serve's settings for the real agent path: the pinned ``codex app-server`` (in its
    jail unless ``sandbox`` is ``none``) with a CODEX_HOME at ``home`` whose model is the
    testkit's scripted model server at ``model_url``."""
    env = write_codex_home(home, model_url).env()
    env |= {"FORGEFLOW_AGENT_RUNTIME": "codex", "FORGEFLOW_MODEL": "scripted-model"}
    env |= {"FORGEFLOW_CODEX_COMMAND": f"{CODEX} app-server", "FORGEFLOW_SANDBOX": sandbox}
    return env


@dataclass
class Mention:
    repo: str
    issue: int
    task_id: str
    sent: float  # time.time() before the comment was posted
    accepted: float  # time.time() once the emulator had forgeflow's 202


@dataclass
class Serve:
    """One ``forgeflow serve`` process on a fresh SQLite data directory."""

    workdir: Path
    gitea_url: str
    bot_token: str
    extra_env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0  # time.time() of the exec

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.workdir / "data" / "forgeflow.db"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
        env.update(
            FORGEFLOW_DATA_DIR=str(self.workdir / "data"),
            FORGEFLOW_PORT=str(self.port),
            FORGEFLOW_WEBHOOK_SECRET=SECRET,
            FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
            FORGEFLOW_GITEA_URL=self.gitea_url,
            FORGEFLOW_GITEA_TOKEN=self.bot_token,
            FORGEFLOW_AGENT_RUNTIME=SCRIPTED,
            FORGEFLOW_TEST_TRACE=str(self.workdir / "trace.jsonl"),
            FORGEFLOW_LOG_LEVEL="warning",
        )
        return env | self.extra_env

    def start(self, wait: bool = True) -> Serve:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "serve.log").open("ab") as err:
            self.started = time.time()
            self.proc = subprocess.Popen(
                [FORGEFLOW, "serve", *self.args],
                env=self.env(),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        if wait:
            wait_for(self.healthy, 60, f"/healthz of {self.workdir.name}", step=0.02)
        return self

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"forgeflow exited: {self.log()}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        path = self.workdir / "serve.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the serve's database (WAL: readers never block its writer)."""
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql, tuple(params)).fetchall()
        finally:
            conn.close()

    def states(self, task_ids: list[str]) -> dict[str, str]:
        marks = ",".join("?" * len(task_ids))
        sql = f"SELECT task_id, state FROM tasks WHERE task_id IN ({marks})"  # noqa: S608
        return {r[0]: r[1] for r in self.query(sql, task_ids)}

    def wait_terminal(self, task_ids: list[str], timeout: float) -> dict[str, str]:
        def done() -> dict[str, str] | None:
            states = self.states(task_ids)
            ended = len(states) == len(task_ids) and set(states.values()) <= TERMINAL
            return states if ended else None

        return wait_for(done, timeout, f"{len(task_ids)} tasks ended", step=0.02)

    def audit(self, task_id: str) -> list[tuple[str, float]]:
        """The task's audit rows as (action, epoch seconds), in the order written."""
        rows = self.query(
            "SELECT action, timestamp FROM audit_events WHERE task_id = ? ORDER BY seq", [task_id]
        )
        return [(a, epoch(t)) for a, t in rows]

    def turn_times(self) -> dict[str, tuple[float, float | None]]:
        """task id -> (first turn start, its end), from the scripted runtime's trace."""
        path = self.workdir / "trace.jsonl"
        events = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        for e in events:
            if e["event"] == "start":
                starts.setdefault(e["task"], e["t"])
            elif e["event"] in ("end", "interrupted"):
                ends.setdefault(e["task"], e["t"])
        return {t: (s, ends.get(t)) for t, s in starts.items()}


class World:
    """The emulated Gitea: owner ``acme``, the bot with admin, ``alice`` with write."""

    def __init__(self, root: Path) -> None:
        self.emu = GiteaEmulator(root / "gitea")
        self.emu.start()
        self.bot_token = self.emu.add_user(BOT)
        self.emu.add_user(USER)

    def add_repo(self, name: str, issues: int, hook_url: str | None) -> None:
        self.emu.add_repo(OWNER, name)
        self.emu.set_permission(OWNER, name, USER, "write")
        self.emu.set_permission(OWNER, name, BOT, "admin")
        for i in range(issues):  # before the hook: no `issues` deliveries to ignore
            self.emu.add_issue(OWNER, name, title=f"issue {i + 1}", author=USER)
        if hook_url is not None:
            url = hook_url + "/api/gitea/webhook"
            self.emu.add_hook(OWNER, name, url=url, secret=SECRET, events=None)

    def mention(self, repo: str, issue: int, text: str = "do it") -> Mention:
        """Post a mention; the emulator delivers the webhook before this returns."""
        sent = time.time()
        comment = self.emu.post_comment(OWNER, repo, issue, author=USER, body=f"@{BOT} {text}")
        accepted = time.time()
        for d in reversed(self.emu.deliveries):
            if d.event_type == "issue_comment" and d.payload["comment"]["id"] == comment["id"]:
                if d.status_code != 202:
                    raise RuntimeError(f"delivery answered {d.status_code}: {d.response}")
                return Mention(repo, issue, json.loads(d.response)["taskId"], sent, accepted)
        raise RuntimeError(f"no delivery for comment {comment['id']}")

    def signed(self, repo: str, issue: int, text: str) -> tuple[dict[str, str], bytes]:
        """Headers and body of a new mention's delivery, signed as Gitea signs it, not
        sent (the repository has no hook): the caller times the HTTP request itself."""
        comment = self.emu.post_comment(OWNER, repo, issue, author=USER, body=f"@{BOT} {text}")
        payload = self.emu.comment_payload(OWNER, repo, issue, comment, sender=USER)
        return self.emu.build_delivery(OWNER, repo, "issue_comment", payload, secret=SECRET)

    def stop(self) -> None:
        self.emu.stop()


def answering_model() -> ScriptedModel:
    """The testkit's scripted model server, started, whose every turn answers the mention
    with forgeflow's Gitea tools (``answering_agent``); the caller stops it."""
    model = ScriptedModel().start()
    answering_agent(model)
    return model


def codex_serve(
    world: World,
    workdir: Path,
    home: Path,
    model: ScriptedModel,
    *,
    sandbox: str = "bwrap",
    **env: str,
) -> Serve:
    """A started serve in ``workdir`` on the real agent path (:func:`codex_env`, its
    CODEX_HOME at ``home``) against ``world``'s Gitea emulator; ``env``: more settings."""
    settings = codex_env(home, model.url, sandbox) | env
    return Serve(workdir, world.emu.url, world.bot_token, settings).start()


@contextmanager
def scratch(prefix: str, *, keep: bool, parent: str | None = None) -> Iterator[Path]:
    """A temporary folder for one benchmark run, removed afterwards unless ``keep``."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
