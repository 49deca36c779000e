"""Harness of bench/dispatch.py: a Gitea emulator in this process, a real
``forgeflow serve`` child process, and readers for its trace file and SQLite database.

Nothing here imports from tests/: the few lines it needs from tests/support are copied.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

from forgeflow_testkit.gitea_emulator import GiteaEmulator

T = TypeVar("T")

BOT = "ccweb-bot"
USER = "alice"
OWNER = "acme"
WEBHOOK_SECRET = "whsec-bench-0123456789"
ADMIN_TOKEN = "admin-bench-token-abcdef"
SCRIPTED = "forgeflow_testkit.runtimes:scripted_runtime"
FORGEFLOW = str(Path(sys.executable).parent / "forgeflow")
TERMINAL = {
    "succeeded",
    "succeeded_with_rest_fallback",
    "failed",
    "failed_reply",
    "aborted",
    "waiting_user",
    "blocked_workspace",
}


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


def summary_ms(seconds: list[float]) -> dict[str, float | int]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
        "mean_ms": round(sum(ms) / len(ms), 1),
        "min_ms": round(min(ms), 1),
    }


@dataclass
class Mention:
    repo: str
    issue: int
    task_id: str
    sent: float  # time.time() before post_comment
    accepted: float  # time.time() when post_comment returned (the 202 is in)


@dataclass
class Serve:
    """One ``forgeflow serve`` process on a fresh SQLite data directory."""

    workdir: Path
    gitea_url: str
    bot_token: str
    turn_seconds: float
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _db: sqlite3.Connection | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def trace_path(self) -> Path:
        return self.workdir / "trace.jsonl"

    @property
    def db_path(self) -> Path:
        return self.workdir / "data" / "forgeflow.db"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
        env.update(
            FORGEFLOW_DATA_DIR=str(self.workdir / "data"),
            FORGEFLOW_PORT=str(self.port),
            FORGEFLOW_WEBHOOK_SECRET=WEBHOOK_SECRET,
            FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
            FORGEFLOW_GITEA_URL=self.gitea_url,
            FORGEFLOW_GITEA_TOKEN=self.bot_token,
            FORGEFLOW_AGENT_RUNTIME=SCRIPTED,
            FORGEFLOW_TEST_TRACE=str(self.trace_path),
            FORGEFLOW_TEST_TURN_SECONDS=str(self.turn_seconds),
            FORGEFLOW_LOG_LEVEL="warning",
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "serve.log").open("ab") as err:
            self.proc = subprocess.Popen(
                [FORGEFLOW, "serve"], env=self.env(), stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"forgeflow exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("forgeflow did not become healthy")

    def stop(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        path = self.workdir / "serve.log"
        return path.read_text()[-4000:] if path.exists() else ""

    # -- reading what the process wrote -------------------------------------------------

    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(str(self.db_path), timeout=30, check_same_thread=False)
        return self._db

    def states(self, task_ids: Iterable[str]) -> dict[str, str]:
        ids = list(task_ids)
        marks = ",".join("?" * len(ids))
        rows = self.db().execute(
            f"SELECT task_id, state FROM tasks WHERE task_id IN ({marks})",  # noqa: S608
            ids,
        )
        return {r[0]: r[1] for r in rows}

    def wait_terminal(self, task_ids: list[str], timeout: float) -> dict[str, str]:
        def check() -> dict[str, str] | None:
            states = self.states(task_ids)
            done = len(states) == len(task_ids) and all(s in TERMINAL for s in states.values())
            return states if done else None

        return wait_for(check, timeout, f"{len(task_ids)} tasks terminal", step=0.02)

    def audit(self, task_ids: Iterable[str]) -> dict[str, list[tuple[str, float]]]:
        """Each task's audit rows as (action, epoch seconds), in the order written."""
        ids = list(task_ids)
        marks = ",".join("?" * len(ids))
        rows = self.db().execute(
            "SELECT task_id, action, timestamp FROM audit_events "  # noqa: S608
            f"WHERE task_id IN ({marks}) ORDER BY seq",
            ids,
        )
        out: dict[str, list[tuple[str, float]]] = {t: [] for t in ids}
        for task_id, action, stamp in rows:
            when = datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
            out[task_id].append((action, when))
        return out

    def trace(self) -> list[dict[str, Any]]:
        if not self.trace_path.exists():
            return []
        lines = self.trace_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def turn_times(self) -> dict[str, tuple[float, float | None]]:
        """task id -> (first turn start, its end) from the runtime's trace."""
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        for e in self.trace():
            if e["event"] == "start":
                starts.setdefault(e["task"], e["t"])
            elif e["event"] in ("end", "interrupted") and e["task"] not in ends:
                ends[e["task"]] = e["t"]
        return {t: (s, ends.get(t)) for t, s in starts.items()}


class World:
    """The emulated Gitea: owner ``acme``, bot with admin, ``alice`` with write."""

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
            self.hook(name, hook_url)

    def hook(self, name: str, url: str) -> None:
        self.emu.add_hook(
            OWNER, name, url=url + "/api/gitea/webhook", secret=WEBHOOK_SECRET, events=None
        )

    def mention(self, repo: str, issue: int, text: str = "do it") -> Mention:
        sent = time.time()
        comment = self.emu.post_comment(OWNER, repo, issue, author=USER, body=f"@{BOT} {text}")
        accepted = time.time()
        for d in reversed(self.emu.deliveries):
            if d.event_type != "issue_comment" or d.payload["comment"]["id"] != comment["id"]:
                continue
            if d.status_code != 202:
                raise RuntimeError(f"delivery answered {d.status_code}: {d.response}")
            return Mention(repo, issue, json.loads(d.response)["taskId"], sent, accepted)
        raise RuntimeError(f"no delivery for comment {comment['id']}")

    def mention_all(self, targets: list[tuple[str, int]], threads: int = 16) -> list[Mention]:
        """All mentions as fast as possible, from ``threads`` concurrent posters."""
        with ThreadPoolExecutor(threads, thread_name_prefix="mention") as pool:
            return list(pool.map(lambda t: self.mention(*t), targets))

    def stop(self) -> None:
        self.emu.stop()
