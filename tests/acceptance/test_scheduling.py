"""AC-03, AC-04 and AC-10 with a running worker (scripted runtime, real git, real Gitea API)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import overlapping, turn_intervals, wait_for
from tests.support.forgeflow import Running
from tests.support.world import BOT

Worker = tuple[GiteaEmulator, Running]


def _mention(gitea: GiteaEmulator, repo: str, index: int, text: str = "@ccweb-bot go") -> str:
    comment = gitea.post_comment("acme", repo, index, author="alice", body=text)
    d = gitea.delivery_of_comment(comment["id"])
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


def _detail(ff: Running, task_id: str) -> dict[str, Any]:
    with ff.admin() as admin:
        detail: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        return detail


def _state(ff: Running, task_id: str) -> str:
    return str(_detail(ff, task_id)["task"]["state"])


def _done(ff: Running, *task_ids: str) -> bool:
    return all(_detail(ff, t)["terminal"] for t in task_ids)


def _control(ff: Running, path: str, request_id: str) -> dict[str, Any]:
    with ff.admin() as admin:
        r = admin.post(f"/api/gitea-workflow/{path}", json={"requestId": request_id})
        body: dict[str, Any] = r.json()
        return body


def _trace(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "trace.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_first_task_clones_and_the_next_fetches(worker: Worker) -> None:  # AC-03
    """DESIGN "Workspaces", fetch rule: the first task clones; a task that starts a
    session fetches; a task of an existing session fetches only when the last fetch is
    older than FORGEFLOW_FETCH_INTERVAL_SECONDS (60 s here)."""
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    first = _mention(gitea, "widget", issue)
    wait_for(lambda: _done(ff, first))
    gitea.push_branch("acme", "widget", "main", {"new.txt": "upstream\n"})
    again = _mention(gitea, "widget", issue, "@ccweb-bot again")
    wait_for(lambda: _done(ff, again))
    other = gitea.add_issue("acme", "widget", title="u", author="alice")
    second = _mention(gitea, "widget", other)
    wait_for(lambda: _done(ff, second))
    actions = [
        [e["action"] for e in _detail(ff, t)["audit"] if e["action"].startswith("workspace.")]
        for t in (first, again, second)
    ]
    assert actions == [
        ["workspace.clone", "workspace.status"],
        ["workspace.fetch_skipped", "workspace.status"],
        ["workspace.fetch", "workspace.status"],
    ]
    root = ff.settings.resolved_workspace_root
    sessions = root / ".sessions" / "default" / "acme" / "widget"
    assert (sessions / f"issue-{issue}").is_dir()
    assert not (sessions / f"issue-{issue}" / "new.txt").exists()  # its branch is its own
    assert (sessions / f"issue-{other}" / "new.txt").exists()  # started from the fetch
    assert not (root / "default" / "acme" / "widget" / "new.txt").exists()  # never checked out


def test_dirty_main_clone_blocks_and_keeps_the_edit(worker: Worker) -> None:  # AC-03
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    first = _mention(gitea, "widget", issue)
    wait_for(lambda: _done(ff, first))
    readme = ff.settings.resolved_workspace_root / "default" / "acme" / "widget" / "README.md"
    edited = readme.read_bytes() + b"hand edit\n"
    readme.write_bytes(edited)
    blocked = _mention(gitea, "widget", issue, "@ccweb-bot once more")
    wait_for(lambda: _state(ff, blocked) == "blocked_workspace")
    assert readme.read_bytes() == edited
    audit = _detail(ff, blocked)["audit"]
    block = [e for e in audit if e["toState"] == "blocked_workspace"]
    assert len(block) == 1 and block[0]["errorCode"] == "workspace_dirty"
    # Released while still dirty: blocked again, and the edit is still there.
    assert _control(ff, f"tasks/{blocked}/release", "rel-1")["state"] == "queued"
    wait_for(
        lambda: (
            _state(ff, blocked) == "blocked_workspace"
            and len(
                [e for e in _detail(ff, blocked)["audit"] if e["toState"] == "blocked_workspace"]
            )
            == 2
        )
    )
    assert readme.read_bytes() == edited
    readme.write_bytes(edited[: -len(b"hand edit\n")])  # the operator cleans up
    _control(ff, f"tasks/{blocked}/release", "rel-2")
    wait_for(lambda: _state(ff, blocked) == "succeeded")


def test_one_repository_runs_serially_and_repositories_overlap(
    worker: Worker, tmp_path: Path
) -> None:  # AC-04
    gitea, ff = worker
    ff.services.runtime.turn_seconds = 1.0  # type: ignore[union-attr]
    widget = [gitea.add_issue("acme", "widget", title=f"w{i}", author="alice") for i in range(2)]
    gadget = gitea.add_issue("acme", "gadget", title="g", author="alice")
    tasks = [_mention(gitea, "widget", i) for i in widget] + [_mention(gitea, "gadget", gadget)]
    wait_for(lambda: _done(ff, *tasks))
    intervals = turn_intervals(_trace(tmp_path), {})
    assert len(intervals) == 3
    assert overlapping(intervals) == []
    by_repo = {repo: (start, end) for repo, _turn, start, end in intervals if "gadget" in repo}
    g_start, g_end = by_repo["acme/gadget"]
    w = [(s, e) for repo, _t, s, e in intervals if repo == "acme/widget"]
    assert any(s < g_end and g_start < e for s, e in w)  # repositories ran in parallel


def test_the_next_task_is_claimed_when_the_lease_is_given_back(
    worker: Worker, tmp_path: Path
) -> None:  # AC-04
    """The handoff: the move that gives the repository's lease back (turn done, on to
    reply verification) claims the repository's next task in the same transaction; no
    scheduler round in between, and the turns still never overlap."""
    gitea, ff = worker
    issues = [gitea.add_issue("acme", "widget", title=f"h{i}", author="alice") for i in range(2)]
    first, second = (_mention(gitea, "widget", i) for i in issues)
    wait_for(lambda: _done(ff, first, second))
    assert [_state(ff, t) for t in (first, second)] == ["succeeded", "succeeded"]
    audit = {t: {e["action"]: e for e in _detail(ff, t)["audit"]} for t in (first, second)}
    claim = audit[second]["task.claim"]
    assert claim["metadata"]["handoffFrom"] == first
    assert audit[first]["task.verify"]["seq"] < claim["seq"]
    assert claim["seq"] < audit[first]["reply.confirm"]["seq"]
    assert overlapping(turn_intervals(_trace(tmp_path), {})) == []


def test_pause_stops_claims_and_resume_restarts_them(worker: Worker) -> None:  # AC-10
    gitea, ff = worker
    ff.services.runtime.turn_seconds = 1.5  # type: ignore[union-attr]
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    other = gitea.add_issue("acme", "gadget", title="t", author="alice")
    running = _mention(gitea, "widget", issue)
    wait_for(lambda: _state(ff, running) == "running")
    _control(ff, "control/pause", "pause-1")
    waiting = _mention(gitea, "gadget", other)
    wait_for(lambda: _state(ff, running) == "succeeded")  # running work continues
    time.sleep(1.0)
    assert _state(ff, waiting) == "queued"
    _control(ff, "control/resume", "resume-1")
    wait_for(lambda: _state(ff, waiting) == "succeeded")


def test_abort_running_task_releases_the_lease(worker: Worker) -> None:  # AC-10
    gitea, ff = worker
    ff.services.runtime.turn_seconds = 30  # type: ignore[union-attr]
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _mention(gitea, "widget", issue)
    wait_for(lambda: _state(ff, task) == "running")
    first = _control(ff, f"tasks/{task}/abort", "abort-1")
    assert first["state"] == "aborting"
    again = _control(ff, f"tasks/{task}/abort", "abort-2")
    assert again["changed"] is False
    wait_for(lambda: _state(ff, task) == "aborted", timeout=10)
    from forgeflow.store.bookkeeping_schema import repo_leases

    leases = ff.services.store.db.read_sync(lambda c: c.execute(select(repo_leases)).all())
    assert leases == []
    audit = _detail(ff, task)["audit"]
    moves = [(e["fromState"], e["toState"], e["actor"]) for e in audit if e["toState"]]
    assert moves[-2:] == [("running", "aborting", "admin:admin"), ("aborting", "aborted", "system")]
    wait_for(
        lambda: any(
            "kind=result" in c["body"]
            for c in gitea.comments("acme", "widget", issue)
            if c["user"]["login"] == BOT
        )
    )
    # The repository is free again: the next task runs.
    ff.services.runtime.turn_seconds = 0.1  # type: ignore[union-attr]
    after = _mention(gitea, "widget", issue, "@ccweb-bot next")
    wait_for(lambda: _done(ff, after))


def test_pull_request_task_works_on_the_head_and_records_refs(worker: Worker) -> None:
    gitea, ff = worker
    gitea.push_branch("acme", "widget", "feature", {"feature.txt": "new\n"}, base="main")
    pull = gitea.add_pull("acme", "widget", title="Feature", head="feature", author="alice")
    task = _mention(gitea, "widget", pull, "@ccweb-bot please look at this change")
    wait_for(lambda: _done(ff, task))
    detail = _detail(ff, task)
    assert detail["task"]["state"] == "succeeded"
    refs = detail["task"]["refs"]
    assert refs["base"] == "main" and refs["head"] == "feature" and len(refs["headSha"]) == 40
    root = ff.settings.resolved_workspace_root
    worktree = root / ".sessions" / "default" / "acme" / "widget" / f"pull_request-{pull}"
    assert (worktree / "feature.txt").read_text() == "new\n"


def test_git_authentication_failure_retries_once_then_fails(worker: Worker) -> None:
    gitea, ff = worker
    gitea.fail_next("*", r"^/acme/widget\.git/", status=401, count=50)
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _mention(gitea, "widget", issue)
    wait_for(lambda: _state(ff, task) == "failed")
    moves = [(e["toState"], e["errorCode"]) for e in _detail(ff, task)["audit"] if e["toState"]]
    assert ("retry_wait", "git_auth_failed") in moves
    assert moves[-1] == ("failed", "git_auth_failed")
    token = ff.settings.gitea_token
    assert token is not None
    for e in _detail(ff, task)["audit"]:
        assert token.get_secret_value() not in json.dumps(e)


def test_hostile_repository_names_never_become_tasks(worker: Worker) -> None:
    gitea, ff = worker
    from tests.support.forgeflow import WEBHOOK_SECRET

    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    comment = gitea.post_comment("acme", "widget", issue, author="alice", body="hello")
    for name in ("..", "-rf", "a/b", "x" * 150, "a\x00b"):
        payload = gitea.comment_payload("acme", "widget", issue, comment, sender="alice")
        payload["repository"]["name"] = name
        payload["comment"]["body"] = "@ccweb-bot escape"
        headers, body = gitea.build_delivery(
            "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
        )
        import httpx

        r = httpx.post(ff.webhook_url, content=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"] == "invalid_payload", name
    root = ff.settings.resolved_workspace_root
    assert not root.exists() or sorted(p.name for p in root.iterdir()) in (
        [],
        [".forgeflow-askpass"],
    )
