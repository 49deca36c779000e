"""Ingress and worker as separate processes on one PostgreSQL database."""

from __future__ import annotations

import time
from pathlib import Path

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import Cluster, hook, make_cluster, wait_for
from tests.support.dbwatch import DbWatch


def test_worker_wakes_on_notify_from_another_process(
    gitea: GiteaEmulator, tmp_path: Path, pg_url: str
) -> None:
    ingress = make_cluster(gitea, tmp_path / "ingress", pg_url)
    worker = Cluster(gitea, tmp_path / "worker", pg_url, ingress.bot_token)
    (tmp_path / "ingress").mkdir()
    (tmp_path / "worker").mkdir()
    try:
        # A poll this slow would take a minute: only LISTEN/NOTIFY can be this quick.
        ingress.start("--role", "ingress", FORGEFLOW_POLL_SECONDS="60")
        worker.start(
            "--role", "worker", FORGEFLOW_POLL_SECONDS="60", FORGEFLOW_WORKER_ID="worker-a"
        )
        hook(ingress)
        issue = gitea.add_issue("acme", "widget", title="t", author="alice")
        with DbWatch(pg_url) as watch:
            started = time.monotonic()
            task = ingress.mention(issue)
            wait_for(
                lambda: (t := watch.task(task)) is not None and t["state"] == "succeeded",
                timeout=30,
                what="the worker ran the task",
            )
            assert time.monotonic() - started < 20
        with ingress.admin() as admin:
            audit = admin.get("/api/gitea-workflow/audit", params={"taskId": task}).json()
        claims = [e["metadata"]["owner"] for e in audit["items"] if e["action"] == "task.claim"]
        assert len(claims) == 1 and claims[0].startswith("worker-a/")
        assert "role ingress: this process does not run tasks" in ingress.log()
    finally:
        worker.stop()
        ingress.stop()
