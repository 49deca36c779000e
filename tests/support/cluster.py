"""A Gitea emulator plus real ``forgeflow serve`` processes that tests can kill -9."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.support.process import clean_env, free_port, start_serve, wait_healthy
from tests.support.world import BOT

SCRIPTED = "forgeflow_testkit.runtimes:scripted_runtime"


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s")


@dataclass
class Cluster:
    gitea: GiteaEmulator
    workdir: Path
    db_url: str
    bot_token: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def trace(self) -> Path:
        return self.workdir / "trace.jsonl"

    def env(self) -> dict[str, str]:
        return (
            clean_env(
                FORGEFLOW_DATA_DIR=str(self.workdir / "data"),
                FORGEFLOW_DATABASE_URL=self.db_url,
                FORGEFLOW_PORT=str(self.port),
                FORGEFLOW_WEBHOOK_SECRET=WEBHOOK_SECRET,
                FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
                FORGEFLOW_GITEA_URL=self.gitea.url,
                FORGEFLOW_GITEA_TOKEN=self.bot_token,
                FORGEFLOW_AGENT_RUNTIME=SCRIPTED,
                FORGEFLOW_TEST_TRACE=str(self.trace),
                FORGEFLOW_RETRY_BASE_SECONDS="0.2",
                FORGEFLOW_POLL_SECONDS="0.5",
            )
            | self.extra_env
        )

    def start(self, *args: str, **env: str) -> None:
        self.extra_env.update(env)
        self.proc = start_serve(self.env(), *args, stderr_path=self.workdir / "serve.log")
        wait_healthy(self.url, self.proc)

    def kill9(self) -> tuple[int, float]:
        """SIGKILL the process; returns its pid and the moment it was killed."""
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        self.proc.wait(timeout=30)
        self.proc = None
        return pid, killed

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )

    def mention(self, index: int, text: str = "@ccweb-bot do it", repo: str = "widget") -> str:
        comment = self.gitea.post_comment("acme", repo, index, author="alice", body=text)
        delivery = self.gitea.delivery_of_comment(comment["id"])
        assert delivery.status_code == 202, delivery.response
        task_id: str = json.loads(delivery.response)["taskId"]
        return task_id

    def trace_events(self) -> list[dict[str, Any]]:
        if not self.trace.exists():
            return []
        return [json.loads(line) for line in self.trace.read_text().splitlines() if line]

    def bot_comments(self, index: int, repo: str = "widget") -> list[dict[str, Any]]:
        return [c for c in self.gitea.comments("acme", repo, index) if c["user"]["login"] == BOT]

    def log(self) -> str:
        path = self.workdir / "serve.log"
        return path.read_text() if path.exists() else ""


def make_cluster(
    gitea: GiteaEmulator, workdir: Path, db_url: str, repos: tuple[str, ...] = ("widget",)
) -> Cluster:
    bot_token = gitea.add_user(BOT)
    gitea.add_user("alice")
    for repo in repos:
        gitea.add_repo("acme", repo)
        gitea.set_permission("acme", repo, "alice", "write")
        gitea.set_permission("acme", repo, BOT, "admin")
    cluster = Cluster(gitea, workdir, db_url, bot_token)
    return cluster


def hook(cluster: Cluster, repos: tuple[str, ...] = ("widget",)) -> None:
    for repo in repos:
        cluster.gitea.add_hook(
            "acme", repo, url=cluster.url + "/api/gitea/webhook", secret=WEBHOOK_SECRET
        )


def turn_intervals(
    events: list[dict[str, Any]], killed_at: dict[int, float]
) -> list[tuple[str, str, float, float]]:
    """(repo, turnKey, start, end) of every turn; a turn whose process was killed
    mid-way ends when its process was killed (``killed_at`` by pid)."""
    starts: dict[tuple[int, str], dict[str, Any]] = {}
    out = []
    for e in events:
        if e["event"] == "start":
            starts[(e["pid"], e["turn"])] = e
        elif e["event"] in ("end", "interrupted") and (e["pid"], e.get("turn", "")) in starts:
            s = starts.pop((e["pid"], e["turn"]))
            out.append((s["repo"], s["turn"], s["t"], e["t"]))
    for (pid, turn), s in starts.items():
        out.append((s["repo"], turn, s["t"], killed_at.get(pid, time.time())))
    return out


def overlapping(intervals: list[tuple[str, str, float, float]]) -> list[tuple[str, str]]:
    """Pairs of turns of one repository that ran at the same time."""
    bad = []
    for i, (repo_a, turn_a, start_a, end_a) in enumerate(intervals):
        for repo_b, turn_b, start_b, end_b in intervals[i + 1 :]:
            if repo_a == repo_b and start_a < end_b and start_b < end_a:
                bad.append((turn_a, turn_b))
    return bad


def secret_hits(cluster: Cluster) -> list[str]:
    """Where any of the cluster's secrets appear: log, files under the data folder, rows."""
    secrets = {
        "bot token": cluster.bot_token,
        "webhook secret": WEBHOOK_SECRET,
        "admin token": ADMIN_TOKEN,
    }
    return scan_for_secrets(
        secrets,
        logs=[cluster.workdir / "serve.log"],
        folders=[cluster.workdir / "data"],
        db_url=cluster.db_url,
    )


def scan_for_secrets(
    secrets: dict[str, str],
    *,
    logs: Sequence[Path] = (),
    folders: Sequence[Path] = (),
    db_url: str | None = None,
    texts: dict[str, str] | None = None,
) -> list[str]:
    """Where any secret value appears: each log line, every file below ``folders``, every
    row of every table of the database (reflected, so tables added later are covered
    too), a data dump of it (``pg_dump``, or the SQLite file with its WAL), and ``texts``
    (for example comments read from Gitea), named by where they came from."""
    hits: list[str] = []
    values = {name: value for name, value in secrets.items() if value}
    for log in logs:
        if log.exists():
            for number, line in enumerate(log.read_text(errors="replace").splitlines(), 1):
                hits += [
                    f"{name} in {log.name} line {number}" for name, v in values.items() if v in line
                ]
    for folder in folders:
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                hits += [f"{name} in {path}" for name, v in values.items() if v.encode() in data]
    for where, text in (texts or {}).items():
        hits += [f"{name} in {where}" for name, v in values.items() if v in text]
    if db_url is not None:
        hits += _database_hits(values, db_url)
    return hits


def _database_hits(values: dict[str, str], db_url: str) -> list[str]:
    from sqlalchemy import MetaData, create_engine, select
    from sqlalchemy.engine import make_url

    hits = []
    engine = create_engine(db_url)
    try:
        reflected = MetaData()
        reflected.reflect(engine)
        with engine.connect() as conn:
            for table in reflected.sorted_tables:
                for row in conn.execute(select(table)):
                    text = repr(tuple(row))
                    hits += [f"{n} in table {table.name}" for n, v in values.items() if v in text]
    finally:
        engine.dispose()
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        assert url.database
        for path in (Path(url.database), Path(url.database + "-wal")):
            if path.exists():
                data = path.read_bytes()
                hits += [f"{n} in {path.name}" for n, v in values.items() if v.encode() in data]
    else:
        libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
        dump = subprocess.run(
            ["pg_dump", "--data-only", "--no-owner", libpq],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        hits += [f"{n} in pg_dump" for n, v in values.items() if v in dump]
    return hits
