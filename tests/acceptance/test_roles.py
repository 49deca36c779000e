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


def test_two_workers_share_repositories_by_affinity_and_take_over(
    gitea: GiteaEmulator, tmp_path: Path, pg_url: str
) -> None:
    repos = ("r1", "r2", "r3", "r4")
    ingress = make_cluster(gitea, tmp_path / "ingress", pg_url, repos=repos)
    workers = [Cluster(gitea, tmp_path / f"w{i}", pg_url, ingress.bot_token) for i in (1, 2)]
    for path in ("ingress", "w1", "w2"):
        (tmp_path / path).mkdir()
    fast = {"FORGEFLOW_LEASE_TTL_SECONDS": "2", "FORGEFLOW_TEST_TURN_SECONDS": "0.3"}
    try:
        ingress.start("--role", "ingress")
        workers[0].start("--role", "worker", FORGEFLOW_WORKER_ID="worker-1", **fast)
        hook(ingress, repos)
        issues = {r: gitea.add_issue("acme", r, title="t", author="alice") for r in repos}

        def done(ids: list[str]) -> bool:
            return all((t := watch.task(x)) is not None and t["state"] == "succeeded" for x in ids)

        with DbWatch(pg_url) as watch:
            # r1 and r2 are first seen while worker-1 is alone: their workspaces live there.
            first = [ingress.mention(issues[r], repo=r) for r in ("r1", "r2")]
            wait_for(lambda: done(first), timeout=60, what="first round")
            workers[1].start("--role", "worker", FORGEFLOW_WORKER_ID="worker-2", **fast)
            first += [ingress.mention(issues[r], repo=r) for r in repos for _ in range(2)]
            wait_for(lambda: done(first), timeout=60, what="second round")
            bound = _affinity(pg_url)
            assert set(bound) == set(f"default:acme/{r}" for r in repos)
            assert bound["default:acme/r1"] == bound["default:acme/r2"] == "worker-1"
            # Every task of a repository ran on the worker its workspace lives on.
            for task_id in first:
                owner = _claimers(ingress, task_id)
                repo = watch.task(task_id)["repo_key"]  # type: ignore[index]
                assert {o.split("/")[0] for o in owner} == {bound[repo]}
            # worker-1 dies: after its heartbeat ages past the lease, worker-2 takes over.
            workers[0].kill9()
            second = [ingress.mention(issues[r], text="@ccweb-bot again", repo=r) for r in repos]
            wait_for(lambda: done(second), timeout=60, what="after the takeover")
        assert watch.violations == [] and watch.samples > 50
        assert set(_affinity(pg_url).values()) == {"worker-2"}
        with ingress.admin() as admin:
            taken = admin.get(
                "/api/gitea-workflow/audit", params={"action": "repository.takeover", "limit": 100}
            ).json()
        moved = {e["repoKey"] for e in taken["items"]}
        assert moved == {k for k, w in bound.items() if w == "worker-1"}
    finally:
        for w in workers:
            w.stop()
        ingress.stop()


def _affinity(pg_url: str) -> dict[str, str]:
    from sqlalchemy import create_engine, select

    from forgeflow.store.schema import repositories

    engine = create_engine(pg_url)
    with engine.connect() as conn:
        rows = conn.execute(select(repositories.c.repo_key, repositories.c.worker_id)).all()
    engine.dispose()
    return {k: w for k, w in rows if w}


def _claimers(cluster: Cluster, task_id: str) -> list[str]:
    with cluster.admin() as admin:
        audit = admin.get("/api/gitea-workflow/audit", params={"taskId": task_id}).json()
    return [e["metadata"]["owner"] for e in audit["items"] if e["action"] == "task.claim"]


def test_a_second_live_process_with_the_same_worker_id_is_refused(
    gitea: GiteaEmulator, tmp_path: Path, pg_url: str
) -> None:
    first = make_cluster(gitea, tmp_path / "a", pg_url)
    second = Cluster(gitea, tmp_path / "b", pg_url, first.bot_token)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        first.start("--role", "worker", FORGEFLOW_WORKER_ID="same")
        try:
            second.start("--role", "worker", FORGEFLOW_WORKER_ID="same")
        except RuntimeError:
            pass
        else:
            raise AssertionError("the second process started")
        assert "give each worker its own FORGEFLOW_WORKER_ID" in second.log()
    finally:
        second.stop()
        first.stop()
