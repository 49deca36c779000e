"""Crash harness: real ``forgeflow serve`` processes killed with ``kill -9`` under load.

The workload: N repositories on the Gitea emulator, M mentions spread over their issues
(some issues get several), the scripted agent runtime with a turn length that varies per
task (``FORGEFLOW_TEST_TURN_SECONDS=lo-hi``), and the emulator delivering every webhook.
A controller thread sends SIGKILL to a random forgeflow process at random moments (a
seeded RNG; the seed is printed) and restarts it at once. A feeder thread posts the
mentions paced by the kills, so they arrive before, during and after crashes; a delivery
that got no 2xx (the process was down or died mid-request) is replayed the way an
operator uses Gitea's "Replay" button, with a new delivery id or the same one.

Invariants, checked while it runs (samplers) and at the end:

- no accepted delivery lost: every delivery answered 202 has its task, for its comment;
- no duplicate task: exactly one task per mentioning comment;
- no lost receipt: every task that got to its turn has its receipt;
- no duplicate bot comment: at most one receipt, final, fallback and result per task
  (counted by the hidden marker in the emulator), and each ended task answered exactly
  once (a final or fallback when it succeeded, a result comment otherwise);
- never two active tasks (``preparing``/``running``/``aborting``) on one repository
  (sampled from the database) and never two overlapping turns of one repository (from
  the runtime's trace; a killed process's turn ends when it was killed);
- every task ends terminal or ``waiting_user`` once the kills stop and the system drains;
- no 500 answer, every restart came up.

Run the short version with pytest (``tests/chaos/test_chaos.py``), the long one with:

    .venv/bin/python -m tests.chaos.harness --long --database sqlite
    .venv/bin/python -m tests.chaos.harness --long --database postgres --workers 3

(``--repos``, ``--tasks``, ``--kills``, ``--workers``, ``--seed``, ``--turn-seconds``
override the preset; see ``--help``.) Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select

from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.schema import tasks, webhook_deliveries
from forgeflow_testkit.gitea_emulator import Delivery, GiteaEmulator
from tests.support.cluster import SCRIPTED, scan_for_secrets
from tests.support.dbwatch import DbWatch
from tests.support.process import clean_env, free_port, start_serve, wait_healthy

BOT = "ccweb-bot"
AUTHOR = "alice"
OWNER = "acme"
TERMINAL = frozenset(
    {
        "succeeded",
        "succeeded_with_rest_fallback",
        "failed",
        "failed_reply",
        "cancelled",
        "aborted",
        "rejected",
    }
)
SETTLED = TERMINAL | {"waiting_user"}
ANSWERED_BY_RESULT = frozenset({"failed", "failed_reply", "cancelled", "aborted"})
ANSWERED = ANSWERED_BY_RESULT | {"succeeded", "succeeded_with_rest_fallback"}
MAX_REPLAYS = 200  # per mention
MARKER = re.compile(r"<!--\s*ccweb\s+taskId=(?P<task>[^\s>]+).*?\skind=(?P<kind>[a-z]+)")
PG_ADMIN_DSN = os.environ.get("FORGEFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class ChaosConfig:
    repos: int = 10
    tasks: int = 60
    kills: int = 8
    database: str = "sqlite"  # sqlite | postgres
    workers: int = 2  # PostgreSQL: worker processes beside one ingress; SQLite: one process
    seed: int = field(default_factory=lambda: random.SystemRandom().randrange(2**32))
    turn_seconds: str = "0.05-0.5"
    gap: tuple[float, float] = (0.3, 2.5)  # seconds a process stays up between kills
    drain_timeout: float = 120.0  # after the last kill; covers the 60 s in-flight rule
    restart_timeout: float = 60.0
    resend_share: float = 0.1  # accepted deliveries sent again, to see the duplicate answer

    def describe(self) -> str:
        procs = "1 process --role all"
        if self.database == "postgres":
            procs = f"1 --role ingress + {self.workers} --role worker"
        return (
            f"{self.repos} repositories, {self.tasks} mentions, {self.kills} kills, "
            f"{self.database} ({procs}), turns {self.turn_seconds} s, seed {self.seed}"
        )


LONG = {"repos": 50, "tasks": 500, "kills": 200}


# -- processes -------------------------------------------------------------------------


@dataclass
class Node:
    """One ``forgeflow serve`` process slot: killed and started again under one name."""

    name: str
    role: str
    workdir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "serve.log"

    def start(self, timeout: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = self.env | {"FORGEFLOW_PORT": str(self.port)}
        self.proc = start_serve(env, "--role", self.role, stderr_path=self.log)
        self.starts += 1
        try:
            wait_healthy(self.url, self.proc, timeout=timeout)
        except Exception:
            self.stop()
            raise

    def last_error(self) -> str:
        """The last exception line of the log (why a start failed)."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Version)\b", line)]
        return errors[-1][:300] if errors else "(no exception in the log)"

    def kill9(self) -> tuple[int, float]:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        self.proc.wait(timeout=30)
        self.proc = None
        return pid, killed

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@dataclass(frozen=True)
class Kill:
    index: int
    node: str
    pid: int
    at: float
    restart_seconds: float


# -- the run ---------------------------------------------------------------------------


@dataclass
class Mention:
    repo: str
    issue: int
    text: str
    comment_id: int = 0
    last_sent: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def accepted(self) -> bool:
        return any(d.ok for d in self.deliveries)


@dataclass
class ChaosResult:
    config: ChaosConfig
    violations: list[str]
    figures: dict[str, Any]
    secret_hits: list[str]

    def render(self) -> str:
        f = self.figures
        lines = [
            f"chaos: {self.config.describe()}",
            f"  reproduce: {f['command']}",
            f"  wall time {f['wall_seconds']:.1f} s (load and kills {f['load_seconds']:.1f} s, "
            f"drain {f['drain_seconds']:.1f} s)",
            f"  tasks {f['tasks']} for {f['mentions']} mentions on {f['issues']} issues; "
            f"final states {f['states']}",
            f"  kills {f['kills']} {f['kills_by_node']}; restart {f['restart_mean']:.2f} s mean, "
            f"{f['restart_max']:.2f} s max",
            f"  interruptions {f['interruptions']} (to retry_wait {f['interrupted_to_retry']}, "
            f"to failed {f['interrupted_to_failed']}, aborting→aborted "
            f"{f['interrupted_to_aborted']}, verifying redone {f['verify_redone']})",
            f"  retries: {f['retried_tasks']} tasks ran again ({f['retry_claims']} claims from "
            f"retry_wait); failures by code {f['failures_by_code']}",
            f"  deliveries of mentions: {f['mention_deliveries']} sent, by answer "
            f"{f['delivery_answers']}; replays {f['replays']}, resends {f['resends']}",
            f"  bot comments by kind {f['bot_comments']}; turns {f['turns']} "
            f"(killed mid-turn {f['turns_killed']})",
            f"  samples {f['samples']} (max active tasks at once {f['max_active']}), "
            f"periodic checks {f['checks']}",
            f"  canary scan: {len(self.secret_hits)} hits over {f['scanned']}",
        ]
        if self.violations:
            lines.append(f"  VIOLATIONS ({len(self.violations)}):")
            lines += [f"    - {v}" for v in self.violations[:50]]
        else:
            lines.append("  invariants: all held")
        return "\n".join(lines)


class ChaosRun:
    def __init__(self, config: ChaosConfig, workdir: Path, db_url: str) -> None:
        self.cfg = config
        self.workdir = workdir
        self.db_url = db_url
        rng = random.Random(config.seed)
        self.plan_rng = random.Random(rng.getrandbits(64))
        self.kill_rng = random.Random(rng.getrandbits(64))
        self.feed_rng = random.Random(rng.getrandbits(64))
        self.webhook_secret = f"canary-whsec-{secrets.token_hex(12)}"
        self.admin_token = f"canary-admin-{secrets.token_hex(12)}"
        self.gitea = GiteaEmulator(workdir / "gitea")
        self.bot_token = ""
        self.repos = [f"repo-{i:03d}" for i in range(config.repos)]
        self.nodes: list[Node] = []
        self.trace = workdir / "trace.jsonl"
        self.mentions: list[Mention] = []
        self.kills: list[Kill] = []
        self.violations: list[str] = []
        self.replays = 0
        self.resends = 0
        self.checks = 0
        self._kills_done = 0
        self._progress = threading.Condition()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.engine = create_engine(db_url)

    # -- set-up ----------------------------------------------------------------------

    def _violation(self, text: str) -> None:
        with self._lock:
            if text not in self.violations:
                self.violations.append(text)

    def _world(self) -> None:
        self.gitea.start()
        self.bot_token = self.gitea.add_user(BOT)
        self.gitea.add_user(AUTHOR)
        for repo in self.repos:
            self.gitea.add_repo(OWNER, repo)
            self.gitea.set_permission(OWNER, repo, AUTHOR, "write")
            self.gitea.set_permission(OWNER, repo, BOT, "admin")
        # Issues: ~60 % of the mentions get an issue of their own; the rest land on
        # issues picked at random, so some issues receive several mentions.
        rng = self.plan_rng
        issue_count = max(1, min(self.cfg.tasks, round(self.cfg.tasks * 0.6)))
        issues: list[tuple[str, int]] = []
        for i in range(issue_count):
            repo = self.repos[i % len(self.repos)]
            number = self.gitea.add_issue(OWNER, repo, title=f"chaos {i}", author=AUTHOR)
            issues.append((repo, number))
        targets = list(issues) + [rng.choice(issues) for _ in range(self.cfg.tasks - len(issues))]
        rng.shuffle(targets)
        self.mentions = [
            Mention(repo, number, f"@{BOT} chaos job {i} on {repo}#{number}")
            for i, (repo, number) in enumerate(targets)
        ]

    def _env(self, name: str) -> dict[str, str]:
        return clean_env(
            FORGEFLOW_DATA_DIR=str(self.workdir / name / "data"),
            FORGEFLOW_DATABASE_URL=self.db_url,
            FORGEFLOW_WEBHOOK_SECRET=self.webhook_secret,
            FORGEFLOW_ADMIN_TOKEN=self.admin_token,
            FORGEFLOW_GITEA_URL=self.gitea.url,
            FORGEFLOW_GITEA_TOKEN=self.bot_token,
            FORGEFLOW_AGENT_RUNTIME=SCRIPTED,
            FORGEFLOW_TEST_TRACE=str(self.trace),
            FORGEFLOW_TEST_TURN_SECONDS=self.cfg.turn_seconds,
            FORGEFLOW_RETRY_BASE_SECONDS="0.2",
            FORGEFLOW_POLL_SECONDS="0.5",
            FORGEFLOW_WORKER_ID=name,
        )

    def _fleet(self) -> None:
        if self.cfg.database == "postgres":
            specs = [("ingress", "ingress")] + [
                (f"worker-{i + 1}", "worker") for i in range(self.cfg.workers)
            ]
        else:
            specs = [("solo", "all")]
        self.nodes = [Node(n, role, self.workdir / n, self._env(n)) for n, role in specs]
        for node in self.nodes:  # one after the other: the first one migrates
            node.start(self.cfg.restart_timeout)
        front = self.nodes[0]
        for repo in self.repos:
            self.gitea.add_hook(
                OWNER, repo, url=front.url + "/api/gitea/webhook", secret=self.webhook_secret
            )

    # -- threads ---------------------------------------------------------------------

    def _controller(self) -> None:
        rng = self.kill_rng
        for index in range(self.cfg.kills):
            if self._stop.wait(rng.uniform(*self.cfg.gap)):
                return
            node = rng.choice(self.nodes)
            pid, at = node.kill9()
            began = time.monotonic()
            for attempt in range(3):
                try:
                    node.start(self.cfg.restart_timeout)
                    break
                except Exception as exc:
                    self._violation(
                        f"restart {attempt + 1} of {node.name} failed: {exc}: {node.last_error()}"
                    )
            else:
                self._stop.set()
                return
            self.kills.append(Kill(index, node.name, pid, at, time.monotonic() - began))
            with self._progress:
                self._kills_done += 1
                self._progress.notify_all()

    def _send(self, mention: Mention, delivery: Delivery | None = None, *, new_id: bool) -> None:
        if delivery is None:
            before = len(self.gitea.deliveries)
            posted = self.gitea.post_comment(
                OWNER, mention.repo, mention.issue, author=AUTHOR, body=mention.text
            )
            mention.comment_id = int(posted["id"])
            sent = [
                d
                for d in self.gitea.deliveries[before:]
                if d.event == "issue_comment" and d.payload["comment"]["id"] == mention.comment_id
            ]
        else:
            sent = [self.gitea.redeliver(delivery, new_id=new_id)]
        mention.deliveries += sent
        mention.last_sent = time.monotonic()
        for d in sent:
            if d.status_code is not None and d.status_code >= 500 and d.status_code != 503:
                self._violation(f"{d.status_code} for delivery {d.delivery_id}: {d.response}")

    def _replay_unanswered(self) -> None:
        """Replay what got no 2xx, at most once a second per comment (an operator's
        "Replay" in Gitea's webhook settings; Gitea itself does not retry)."""
        now = time.monotonic()
        for mention in self.mentions:
            if (
                mention.comment_id
                and not mention.accepted
                and mention.deliveries
                and len(mention.deliveries) < MAX_REPLAYS
                and now - mention.last_sent >= 1.0
            ):
                self.replays += 1
                self._send(mention, mention.deliveries[-1], new_id=self.feed_rng.random() < 0.5)

    def _feeder(self) -> None:
        rng = self.feed_rng
        total, kills = len(self.mentions), max(self.cfg.kills, 1)
        deadline = time.monotonic() + 60 + self.cfg.kills * (self.cfg.gap[1] + 30)
        for i, mention in enumerate(self.mentions):
            due = (i * self.cfg.kills) // total  # kills that should have happened by now
            with self._progress:
                while self._kills_done < due and not self._stop.is_set():
                    if time.monotonic() > deadline:
                        self._violation("feeder: kills did not progress in time")
                        return
                    self._progress.wait(0.5)
            if self._stop.is_set():
                return
            time.sleep(rng.uniform(0, 2 * self.cfg.gap[1] * kills / max(total, 1)))
            self._send(mention, new_id=True)
            if mention.accepted and rng.random() < self.cfg.resend_share:
                self.resends += 1
                self._send(mention, mention.deliveries[-1], new_id=rng.random() < 0.5)
            self._replay_unanswered()

    def _checker(self) -> None:
        """Invariants that can be judged at any moment, every ~2 s while it runs."""
        while not self._stop.wait(2.0):
            with contextlib.suppress(Exception):  # a database mid-restart: next round
                self._check_now()
                self.checks += 1

    # -- invariants ------------------------------------------------------------------

    def _task_rows(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(select(tasks))]

    def _bot_comments(self) -> dict[tuple[str, str], int]:
        counts: Counter[tuple[str, str]] = Counter()
        seen_issues = {(m.repo, m.issue) for m in self.mentions}
        for repo, issue in seen_issues:
            for c in self.gitea.comments(OWNER, repo, issue):
                if c["user"]["login"] != BOT:
                    continue
                last = (c["body"] or "").rstrip().splitlines()[-1:]
                match = MARKER.search(last[0]) if last else None
                if match is None:
                    self._violation(f"bot comment {c['id']} without a marker on its last line")
                    continue
                counts[(match["task"], match["kind"])] += 1
        return counts

    def _check_now(self) -> None:
        # The answers first, then the rows: a 202 given after the rows were read would
        # otherwise look lost.
        answered = [
            (m.comment_id, d)
            for m in list(self.mentions)
            for d in list(m.deliveries)
            if d.status_code == 202
        ]
        rows = self._task_rows()
        by_comment = Counter((r["repo_key"], r["comment_id"]) for r in rows)
        for key, n in by_comment.items():
            if n > 1:
                self._violation(f"{n} tasks for comment {key}")
        ids = {r["task_id"]: r for r in rows}
        for comment_id, d in answered:
            row = ids.get(json.loads(d.response)["taskId"])
            if row is None or row["comment_id"] != comment_id:
                self._violation(f"delivery {d.delivery_id} answered 202 has no task")
        for (task_id, kind), n in self._bot_comments().items():
            if n > 1:
                self._violation(f"{n} {kind} comments for task {task_id}")

    def _settled(self) -> bool:
        if not all(m.accepted for m in self.mentions):
            self._replay_unanswered()
            return False
        rows = self._task_rows()
        if len(rows) < len(self.mentions) or any(r["state"] not in SETTLED for r in rows):
            return False
        comments = self._bot_comments()
        return all(self._answers(r, comments) >= 1 for r in rows if r["state"] in ANSWERED)

    @staticmethod
    def _answers(row: dict[str, Any], comments: dict[tuple[str, str], int]) -> int:
        tid = row["task_id"]
        return sum(comments.get((tid, k), 0) for k in ("final", "fallback", "result"))

    def _final_checks(self, watch: DbWatch) -> dict[str, Any]:
        self._check_now()
        rows = self._task_rows()
        comments = self._bot_comments()
        by_comment = {(r["repo_key"].split("/")[-1], r["comment_id"]): r for r in rows}
        for m in self.mentions:
            if not m.accepted:
                self._violation(f"mention {m.repo}#{m.issue} comment {m.comment_id} never accepted")
            row = by_comment.get((m.repo, m.comment_id))
            if row is None:
                self._violation(f"no task for comment {m.comment_id} on {m.repo}#{m.issue}")
                continue
            for d in m.deliveries:
                if d.ok and json.loads(d.response).get("taskId") != row["task_id"]:
                    self._violation(f"delivery {d.delivery_id} answered another task id")
        if len(rows) != len(self.mentions):
            self._violation(f"{len(rows)} tasks for {len(self.mentions)} mentions")
        for r in rows:
            if r["state"] not in SETTLED:
                self._violation(f"task {r['task_id']} ended in {r['state']} ({r['error_code']})")
                continue
            answers = self._answers(r, comments)
            if r["state"] in ANSWERED and answers != 1:
                kinds = {k: n for (t, k), n in comments.items() if t == r["task_id"]}
                self._violation(
                    f"task {r['task_id']} ({r['state']}, attempt {r['attempt']}) answered "
                    f"{answers} times: {kinds}; audit: {self._evidence(r['task_id'])}"
                )
            # A task that got to its turn had its receipt posted before it (no fault of
            # Gitea's is injected here): a kill must not lose it.
            if r["state"] in ("succeeded", "succeeded_with_rest_fallback", "waiting_user") and (
                comments.get((r["task_id"], "receipt")) != 1
            ):
                self._violation(
                    f"task {r['task_id']} ({r['state']}) has no receipt; "
                    f"audit: {self._evidence(r['task_id'])}"
                )
            # A task that failed after its answer landed owes no failure notice: the one
            # answer it has is that answer (checked above).
            landed = any(comments.get((r["task_id"], k)) for k in ("final", "fallback"))
            if (
                r["state"] in ANSWERED_BY_RESULT
                and comments.get((r["task_id"], "result")) != 1
                and not (r["state"] == "failed" and landed)
            ):
                self._violation(f"task {r['task_id']} ({r['state']}) has no result comment")
        if watch.violations:
            self._violation(f"two active tasks on one repository: {watch.violations[:3]}")
        if watch.samples < 50:
            self._violation(f"only {watch.samples} samples of the active tasks")
        turns, killed = self._turn_intervals()
        for a, b in _overlaps(turns):
            self._violation(f"turns {a} and {b} of one repository overlapped")
        with self.engine.connect() as conn:
            stored = {
                r[0]
                for r in conn.execute(
                    select(webhook_deliveries.c.delivery_id).where(
                        webhook_deliveries.c.event_type.in_(
                            ("issue_comment", "pull_request_comment")
                        )
                    )
                )
            }
        for m in self.mentions:
            for d in m.deliveries:
                if d.ok and d.delivery_id not in stored:
                    self._violation(
                        f"delivery {d.delivery_id} answered {d.status_code}, not stored"
                    )
        return {"turns": len(turns), "turns_killed": killed}

    def _evidence(self, task_id: str) -> str:
        """The audit lines that explain a task's comments and recoveries, in order, with
        the kills that fell in between (UTC)."""
        wanted = ("mcp.call", "task.recover", "task.claim", "task.verify", "reply.confirm")
        with self.engine.connect() as conn:
            rows = list(
                conn.execute(
                    select(audit_events)
                    .where(audit_events.c.task_id == task_id)
                    .order_by(audit_events.c.seq)
                ).mappings()
            )
        events: list[tuple[float, str]] = []
        for r in rows:
            meta = r["metadata"] or {}
            if r["action"] not in wanted and r["action"] != "comment.result":
                continue
            what = r["action"]
            if r["from_state"]:
                what += f" {r['from_state']}->{r['to_state']}"
            if r["action"] == "comment.result":
                what += f" {meta.get('kind')} {meta.get('how')}"
            if r["action"] == "mcp.call":
                what += f" ok={meta.get('ok')} comment={r['comment_id']}"
            events.append((r["timestamp"].replace(tzinfo=UTC).timestamp(), what))
        if events:
            first, last = events[0][0], events[-1][0]
            events += [(k.at, f"KILL -9 {k.node}") for k in self.kills if first <= k.at <= last]
        return "; ".join(
            f"{datetime.fromtimestamp(t, UTC):%H:%M:%S.%f}"[:-3] + f" {w}"
            for t, w in sorted(events)
        )

    def _turn_intervals(self) -> tuple[list[tuple[str, str, float, float]], int]:
        killed_at: dict[int, list[float]] = defaultdict(list)  # a pid may be reused
        for k in self.kills:
            killed_at[k.pid].append(k.at)
        events = []
        if self.trace.exists():
            for line in self.trace.read_text().splitlines():
                with contextlib.suppress(ValueError):  # a line cut by kill -9
                    events.append(json.loads(line))
        starts: dict[tuple[int, str], dict[str, Any]] = {}
        out = []
        for e in events:
            if e.get("event") == "start":
                starts[(e["pid"], e["turn"])] = e
            elif (e.get("pid"), e.get("turn")) in starts:
                s = starts.pop((e["pid"], e["turn"]))
                out.append((s["repo"], s["turn"], s["t"], e["t"]))
        killed = 0
        for (pid, turn), s in starts.items():
            ends = [t for t in killed_at.get(pid, []) if t >= s["t"]]
            if ends:
                killed += 1
                out.append((s["repo"], turn, s["t"], min(ends)))
            else:
                self._violation(f"turn {turn} in live process {pid} never ended")
        return out, killed

    # -- figures ---------------------------------------------------------------------

    def _figures(self) -> dict[str, Any]:
        rows = self._task_rows()
        with self.engine.connect() as conn:
            recover = conn.execute(
                select(audit_events.c.from_state, audit_events.c.to_state, func.count())
                .where(audit_events.c.action == "task.recover")
                .group_by(audit_events.c.from_state, audit_events.c.to_state)
            ).all()
            retry_claims = conn.execute(
                select(func.count())
                .select_from(audit_events)
                .where(audit_events.c.action == "task.claim")
                .where(audit_events.c.from_state == "retry_wait")
            ).scalar_one()
            restart_errors = conn.execute(
                select(func.count())
                .select_from(audit_events)
                .where(audit_events.c.error_code == "interrupted_by_restart")
            ).scalar_one()
        recovered: Counter[str] = Counter()
        for from_state, to_state, n in recover:
            label = "verify_redone" if from_state == "verifying_reply" else str(to_state)
            recovered[label] += int(n)
        answers: Counter[str] = Counter()
        for m in self.mentions:
            for d in m.deliveries:
                status = d.status_code
                label = "no answer" if status is None else str(status)
                if status == 200:
                    label = "200 " + str(json.loads(d.response).get("status"))
                answers[label] += 1
        kinds: Counter[str] = Counter()
        for (_, kind), n in self._bot_comments().items():
            kinds[kind] += n
        restarts = [k.restart_seconds for k in self.kills] or [0.0]
        return {
            "tasks": len(rows),
            "mentions": len(self.mentions),
            "issues": len({(m.repo, m.issue) for m in self.mentions}),
            "states": dict(Counter(r["state"] for r in rows).most_common()),
            "kills": len(self.kills),
            "kills_by_node": dict(Counter(k.node for k in self.kills)),
            "restart_mean": sum(restarts) / len(restarts),
            "restart_max": max(restarts),
            "interruptions": sum(recovered.values()),
            "interrupted_to_retry": recovered.get("retry_wait", 0),
            "interrupted_to_failed": recovered.get("failed", 0),
            "interrupted_to_aborted": recovered.get("aborted", 0),
            "verify_redone": recovered.get("verify_redone", 0),
            "restart_error_rows": int(restart_errors),
            "retried_tasks": sum(1 for r in rows if int(r["attempt"]) > 0),
            "retry_claims": int(retry_claims),
            "failures_by_code": dict(
                Counter(
                    f"{r['state']}:{r['error_code']}"
                    for r in rows
                    if r["state"] not in ("succeeded", "waiting_user")
                ).most_common()
            ),
            "mention_deliveries": sum(len(m.deliveries) for m in self.mentions),
            "delivery_answers": dict(answers.most_common()),
            "replays": self.replays,
            "resends": self.resends,
            "bot_comments": dict(kinds.most_common()),
            "checks": self.checks,
        }

    # -- the whole run ---------------------------------------------------------------

    def run(self) -> ChaosResult:
        started = time.monotonic()
        try:
            self._world()
            self._fleet()
            with DbWatch(self.db_url, interval=0.02) as watch:
                threads = [
                    threading.Thread(target=self._controller, name="chaos-kill", daemon=True),
                    threading.Thread(target=self._feeder, name="chaos-feed", daemon=True),
                    threading.Thread(target=self._checker, name="chaos-check", daemon=True),
                ]
                for t in threads:
                    t.start()
                load_limit = 120 + self.cfg.kills * (self.cfg.gap[1] + 2 * self.cfg.restart_timeout)
                for t in threads[:2]:
                    t.join(timeout=max(load_limit - (time.monotonic() - started), 1))
                    if t.is_alive():
                        self._violation(f"{t.name} did not finish within {load_limit:.0f} s")
                load_done = time.monotonic()
                deadline = load_done + self.cfg.drain_timeout
                while not self._settled():
                    if self._stop.is_set():  # the controller gave up on a restart
                        break
                    if time.monotonic() > deadline:
                        self._violation(
                            f"not settled {self.cfg.drain_timeout:.0f} s after the load"
                        )
                        break
                    time.sleep(0.25)
                drained = time.monotonic()
                self._stop.set()
                threads[2].join(timeout=30)
                with contextlib.suppress(TimeoutError):
                    self.gitea.flush_deliveries(timeout=15)
                extra = self._final_checks(watch)
            figures = self._figures() | extra
            figures.update(
                samples=watch.samples,
                max_active=watch.max_active,
                load_seconds=load_done - started,
                drain_seconds=drained - load_done,
            )
        finally:
            self._stop.set()
            for node in self.nodes:
                node.stop()
        hits, scanned = self._canary_scan()
        figures.update(
            wall_seconds=time.monotonic() - started,
            scanned=scanned,
            command=_command(self.cfg),
        )
        for hit in hits:
            self._violation(f"secret found: {hit}")
        return ChaosResult(self.cfg, list(self.violations), figures, hits)

    def _canary_scan(self) -> tuple[list[str], str]:
        """After the processes stopped: logs, data folders, trace, every table and a dump
        of the database, and every comment in the emulator."""
        texts = {}
        for repo, issue in {(m.repo, m.issue) for m in self.mentions}:
            for c in self.gitea.comments(OWNER, repo, issue):
                texts[f"comment {c['id']} on {repo}#{issue}"] = c["body"] or ""
        values = {
            "bot token": self.bot_token,
            "webhook secret": self.webhook_secret,
            "admin token": self.admin_token,
        }
        hits = scan_for_secrets(
            values,
            logs=[n.log for n in self.nodes] + [self.trace],
            folders=[n.workdir / "data" for n in self.nodes],
            db_url=self.db_url,
            texts=texts,
        )
        scanned = (
            f"{len(self.nodes)} logs, {len(self.nodes)} data folders, the trace, "
            f"every table + dump, {len(texts)} comments"
        )
        return hits, scanned

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self.engine.dispose()
        self.gitea.stop()


def _overlaps(intervals: list[tuple[str, str, float, float]]) -> list[tuple[str, str]]:
    by_repo: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for repo, turn, start, end in intervals:
        by_repo[repo].append((start, end, turn))
    bad = []
    for spans in by_repo.values():
        spans.sort()
        latest_end, latest_turn = float("-inf"), ""
        for start, end, turn in spans:
            if start < latest_end:
                bad.append((latest_turn, turn))
            if end > latest_end:
                latest_end, latest_turn = end, turn
    return bad


def _command(cfg: ChaosConfig) -> str:
    parts = [
        ".venv/bin/python -m tests.chaos.harness",
        f"--database {cfg.database}",
        f"--repos {cfg.repos} --tasks {cfg.tasks} --kills {cfg.kills}",
        f"--turn-seconds {cfg.turn_seconds} --seed {cfg.seed}",
    ]
    if cfg.database == "postgres":
        parts.insert(2, f"--workers {cfg.workers}")
    return " ".join(parts)


def run_chaos(config: ChaosConfig, workdir: Path, db_url: str) -> ChaosResult:
    run = ChaosRun(config, workdir, db_url)
    try:
        return run.run()
    finally:
        run.close()


# -- the command line ------------------------------------------------------------------


@contextlib.contextmanager
def _database(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'forgeflow.db'}"
        return
    import psycopg

    name = f"ff_chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.harness",
        description="Crash harness: forgeflow processes killed with kill -9 under load.",
    )
    parser.add_argument("--long", action="store_true", help="50 repos, 500 tasks, 200 kills")
    parser.add_argument("--repos", type=int)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--kills", type=int)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--workers", type=int, default=3, help="PostgreSQL worker processes")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--turn-seconds", default="0.05-0.5")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    values: dict[str, Any] = dict(LONG) if args.long else {}
    for name in ("repos", "tasks", "kills", "seed"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    config = ChaosConfig(
        database=args.database, workers=args.workers, turn_seconds=args.turn_seconds, **values
    )
    print(f"chaos: {config.describe()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="forgeflow-chaos-"))
    try:
        with _database(config.database, workdir) as url:
            result = run_chaos(config, workdir, url)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    print(result.render(), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": config.__dict__,
                    "figures": result.figures,
                    "violations": result.violations,
                },
                indent=2,
                default=str,
            )
        )
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
