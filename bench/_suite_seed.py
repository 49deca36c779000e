"""Seed a forgeflow database for bench/suite.py: many tasks, without many webhooks.

Tasks go in through the store's own acceptance transaction (``deliveries.accept``, the
one ingress runs per webhook), so every row a real mention leaves is there: delivery,
repository, session, task and audit event. Only the receipts (which the outbox would
have posted long before a backlog of this size builds up) and, for the memory
benchmark, the end states of finished tasks are written in bulk, because walking 10,000
tasks through the scheduler would take longer than the benchmark itself.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert, select, update

from _dispatch_support import BOT, OWNER, USER, World
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import repo_workspace
from forgeflow.store import Store, deliveries
from forgeflow.store.schema import comments, tasks
from forgeflow.store.types import utcnow

BATCH = 500  # acceptances per write transaction: seeding speed, not what is measured


@dataclass(frozen=True)
class Seeded:
    """A seeded SQLite database file, to be copied for each run."""

    db_file: Path
    repos: list[str]
    tasks: int
    sessions: int
    seconds: float


def _accepts(
    world: World, repos: list[str], issues: int, per_issue: int, workspace_root: str
) -> list[deliveries.Accept]:
    """One acceptance per (round, issue, repository), interleaved the way a backlog from
    many repositories arrives: the oldest tasks span every repository."""
    emu = world.emu
    template: dict[str, Any] = {}
    for repo in repos:
        payload = emu.comment_payload(
            OWNER, repo, 1, emu.post_comment(OWNER, repo, 1, author=USER, body="seed"), sender=USER
        )
        template[repo] = payload["repository"]
    out = []
    n = 0
    for k in range(per_issue):
        for issue in range(1, issues + 1):
            for repo in repos:
                n += 1
                ref = RepoRef(OWNER, repo)
                out.append(
                    deliveries.Accept(
                        delivery_key=f"default:seed-{n:06d}",
                        delivery_id=f"seed-{n:06d}",
                        event_type="issue_comment",
                        payload_hash=f"sha256:{n:064x}",
                        retention=timedelta(days=30),
                        resource=ResourceRef(ref, ResourceKind.ISSUE, issue),
                        clone_url=template[repo]["clone_url"],
                        default_branch=template[repo]["default_branch"],
                        workspace_path=repo_workspace(workspace_root, ref),
                        comment_id=10_000_000 + n,
                        author=USER,
                        instruction=f"@{BOT} seeded task {k} of issue {issue}",
                        refs=None,
                        permitted=True,
                        permission="write",
                    )
                )
    return out


def seed(
    world: World,
    workdir: Path,
    *,
    repos: int,
    issues: int,
    per_issue: int,
    prefix: str,
) -> Seeded:
    """`repos` × `issues` × `per_issue` queued tasks (sessions = repos × issues), their
    receipts recorded as posted; the repositories and issues exist in the emulator."""
    t0 = time.monotonic()
    names = [f"{prefix}{i:03d}" for i in range(repos)]
    for name in names:
        world.add_repo(name, issues, None)
    data = workdir / "data"
    db_file = data / "forgeflow.db"
    store = Store(f"sqlite:///{db_file}")
    try:
        store.migrate()
        accepts = _accepts(world, names, issues, per_issue, str(data / "workspaces"))
        for start in range(0, len(accepts), BATCH):
            batch = accepts[start : start + BATCH]

            def _write(conn: Connection, batch: list[deliveries.Accept] = batch) -> None:
                for a in batch:
                    record = deliveries.accept(conn, a)
                    if record.status != "accepted":
                        raise RuntimeError(f"seeding: {a.delivery_id} {record.status}")

            store.db.write_sync(_write)
        store.db.write_sync(_receipts_posted)
    finally:
        store.close()
    return Seeded(db_file, names, len(accepts), repos * issues, time.monotonic() - t0)


def _receipts_posted(conn: Connection) -> None:
    now = utcnow()
    rows = conn.execute(select(tasks.c.task_id, tasks.c.resource_key)).all()
    conn.execute(
        insert(comments),
        [
            {
                "comment_key": f"{task_id}:receipt",
                "task_id": task_id,
                "kind": "receipt",
                "resource_key": resource_key,
                "comment_id": 50_000_000 + i,
                "body_hash": "",
                "status": "confirmed",
                "created_at": now,
                "updated_at": now,
            }
            for i, (task_id, resource_key) in enumerate(rows)
        ],
    )


def copy_db(seeded: Seeded, data_dir: Path) -> Path:
    """A fresh copy of the seeded database in `data_dir` (each run changes its copy)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    dest = data_dir / "forgeflow.db"
    shutil.copyfile(seeded.db_file, dest)
    return dest


def finish_all_but_newest(db_file: Path) -> int:
    """Mark every task `succeeded` except the newest of each repository, which stays
    queued: a database of mostly finished work with a little left to do. Returns how many
    stay queued."""
    store = Store(f"sqlite:///{db_file}")

    def _write(conn: Connection) -> int:
        newest: dict[str, str] = {}
        order = select(tasks.c.repo_key, tasks.c.task_id).order_by(tasks.c.created_at)
        for repo_key, task_id in conn.execute(order):
            newest[repo_key] = task_id
        keep = set(newest.values())
        conn.execute(
            update(tasks)
            .where(tasks.c.task_id.not_in(keep))
            .values(state="succeeded", state_version=6, turn_count=1, updated_at=utcnow())
        )
        return len(keep)

    try:
        return store.db.write_sync(_write)
    finally:
        store.close()
