"""Restart recovery with a real ``forgeflow serve`` killed with ``kill -9`` (AC-09)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import (
    Cluster,
    hook,
    make_cluster,
    overlapping,
    secret_hits,
    turn_intervals,
    wait_for,
)
from tests.support.dbwatch import DbWatch

TERMINAL = {
    "succeeded",
    "succeeded_with_rest_fallback",
    "failed",
    "failed_reply",
    "cancelled",
    "aborted",
}


@pytest.fixture
def cluster(gitea: GiteaEmulator, tmp_path: Path, db_url: str) -> Iterator[Cluster]:
    c = make_cluster(gitea, tmp_path, db_url)
    try:
        yield c
    finally:
        c.stop()


def _state(watch: DbWatch, task_id: str) -> str | None:
    row = watch.task(task_id)
    return None if row is None else str(row["state"])


def test_kill_mid_turn_with_a_queued_task_behind_it(cluster: Cluster, db_url: str) -> None:
    """The force-kill case: never two active tasks on the repository, before or after."""
    # A turn far longer than the test: it is killed once seen running, and a turn that
    # could end first (a busy machine) would leave nothing running to kill.
    cluster.start(FORGEFLOW_TEST_TURN_SECONDS="600")
    hook(cluster)
    first = cluster.gitea.add_issue("acme", "widget", title="one", author="alice")
    second = cluster.gitea.add_issue("acme", "widget", title="two", author="alice")
    with DbWatch(db_url) as watch:
        a = cluster.mention(first)
        b = cluster.mention(second)
        wait_for(lambda: _state(watch, a) == "running", what="first task running")
        assert _state(watch, b) == "queued"
        pid, killed = cluster.kill9()
        assert _state(watch, a) == "running"  # nobody was left to say otherwise
        cluster.start(FORGEFLOW_TEST_TURN_SECONDS="0.5")
        wait_for(lambda: {_state(watch, a), _state(watch, b)} <= TERMINAL, what="both end")
    assert watch.samples > 100 and watch.violations == []
    ta, tb = watch.task(a), watch.task(b)
    assert ta is not None and tb is not None
    assert (ta["state"], ta["attempt"]) == ("succeeded", 1)
    assert tb["state"] == "succeeded" and tb["attempt"] == 0
    with cluster.admin() as admin:
        audit = admin.get("/api/gitea-workflow/audit", params={"taskId": a}).json()["items"]
    recover = [e for e in audit if e["action"] == "task.recover"]
    assert [(e["fromState"], e["toState"], e["errorCode"]) for e in recover] == [
        ("running", "retry_wait", "interrupted_by_restart")
    ]
    assert any(
        e["action"] == "lease.release" for e in admin_audit(cluster, repo_key="default:acme/widget")
    )
    assert overlapping(turn_intervals(cluster.trace_events(), {pid: killed})) == []
    for index in (first, second):
        kinds = [c["body"].rsplit("kind=", 1)[1] for c in cluster.bot_comments(index)]
        assert sorted(kinds) == ["final -->", "receipt -->"], kinds
    cluster.stop()
    assert secret_hits(cluster) == []


def admin_audit(cluster: Cluster, **params: str) -> list[dict[str, object]]:
    with cluster.admin() as admin:
        items: list[dict[str, object]] = admin.get(
            "/api/gitea-workflow/audit", params={**params, "limit": 5000}
        ).json()["items"]
        return items


def test_second_interruption_fails_with_one_result_comment(cluster: Cluster, db_url: str) -> None:
    cluster.start(FORGEFLOW_TEST_TURN_SECONDS="600")  # each attempt is killed while it runs
    hook(cluster)
    issue = cluster.gitea.add_issue("acme", "widget", title="one", author="alice")
    with DbWatch(db_url) as watch:
        a = cluster.mention(issue)
        wait_for(lambda: _state(watch, a) == "running", what="running")
        cluster.kill9()
        cluster.start()
        wait_for(
            lambda: (
                (t := watch.task(a)) is not None and t["state"] == "running" and t["attempt"] == 1
            ),
            what="retry running",
        )
        cluster.kill9()
        cluster.start()
        wait_for(lambda: _state(watch, a) == "failed", what="failed")
        task = watch.task(a)
    assert task is not None and task["error_code"] == "interrupted_by_restart"
    wait_for(
        lambda: any("kind=result" in c["body"] for c in cluster.bot_comments(issue)),
        what="result comment",
    )
    kinds = sorted(c["body"].rsplit("kind=", 1)[1] for c in cluster.bot_comments(issue))
    assert kinds == ["receipt -->", "result -->"]


def test_restart_keeps_queued_waiting_and_terminal_tasks(cluster: Cluster, db_url: str) -> None:
    cluster.start(FORGEFLOW_TEST_TURN_SECONDS="0.2", FORGEFLOW_TEST_REPLY="ask")
    hook(cluster)
    asks = cluster.gitea.add_issue("acme", "widget", title="ask", author="alice")
    later = cluster.gitea.add_issue("acme", "widget", title="later", author="alice")
    with DbWatch(db_url) as watch:
        w = cluster.mention(asks)
        wait_for(lambda: _state(watch, w) == "waiting_user", what="waiting_user")
        with cluster.admin() as admin:
            admin.post("/api/gitea-workflow/control/pause", json={"requestId": "p1"})
        q = cluster.mention(later)
        cluster.kill9()
        cluster.start(FORGEFLOW_TEST_REPLY="mcp")
        assert _state(watch, q) == "queued"
        with cluster.admin() as admin:
            admin.post("/api/gitea-workflow/control/resume", json={"requestId": "r1"})
        wait_for(lambda: _state(watch, q) == "succeeded", what="queued task ran")
        assert _state(watch, w) == "waiting_user"
        done = watch.task(q)
        cluster.kill9()
        cluster.start()
        cluster.stop()
        assert watch.task(q) == done  # terminal: untouched by a restart
    question = [c for c in cluster.bot_comments(asks) if "Which branch" in c["body"]]
    assert len(question) == 1


def test_kill_after_the_answer_landed_never_answers_twice(cluster: Cluster, db_url: str) -> None:
    """The agent posted its answer, then forgeflow died before recording it: the retry
    finds the answer on Gitea and confirms it instead of running a second turn."""
    cluster.start(FORGEFLOW_TEST_TURN_SECONDS="30", FORGEFLOW_TEST_REPLY="early")
    hook(cluster)
    issue = cluster.gitea.add_issue("acme", "widget", title="t", author="alice")
    with DbWatch(db_url) as watch:
        task = cluster.mention(issue)
        wait_for(
            lambda: any(e["event"] == "posted" for e in cluster.trace_events()),
            what="the answer was posted",
        )
        cluster.kill9()
        cluster.start(FORGEFLOW_TEST_TURN_SECONDS="0.2")
        wait_for(lambda: _state(watch, task) == "succeeded", what="succeeded")
    finals = [c for c in cluster.bot_comments(issue) if "kind=final" in c["body"]]
    assert len(finals) == 1
    events = admin_audit(cluster, taskId=task)
    assert any(e["action"] == "turn.skipped_answer_exists" for e in events)
    assert [e["metadata"]["turnKey"] for e in events if e["action"] == "turn.intent"] == [
        f"{task}:1"
    ]


def test_exhausted_retries_after_the_answer_landed_post_no_failure_notice(
    cluster: Cluster, db_url: str
) -> None:
    cluster.start(
        FORGEFLOW_TEST_TURN_SECONDS="30", FORGEFLOW_TEST_REPLY="early", FORGEFLOW_MAX_RETRIES="0"
    )
    hook(cluster)
    issue = cluster.gitea.add_issue("acme", "widget", title="t", author="alice")
    with DbWatch(db_url) as watch:
        task = cluster.mention(issue)
        wait_for(
            lambda: any(e["event"] == "posted" for e in cluster.trace_events()),
            what="the answer was posted",
        )
        cluster.kill9()
        cluster.start()
        wait_for(lambda: _state(watch, task) == "failed", what="failed")
    wait_for(
        lambda: any(
            e["action"] == "comment.result"
            and e["metadata"].get("how") == "answer_already_on_gitea"
            for e in admin_audit(cluster, taskId=task)
        ),
        what="result skipped",
    )
    kinds = sorted(c["body"].rsplit("kind=", 1)[1] for c in cluster.bot_comments(issue))
    assert kinds == ["final -->", "receipt -->"]
