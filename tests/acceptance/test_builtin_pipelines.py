"""The built-in templates through forgeflow's public surface: seeded at start, the
disabled ones refused, ``pr_review`` run end to end with the scripted agent against
the Gitea emulator (a review task: exactly one Gitea review and its receipt), then
``pr_merged_cleanup`` sweeping the merged pull request's worktree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from forgeflow.pipelines.seeds import SHIPPED_DISABLED, SHIPPED_ENABLED
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running


def _run(admin: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
    return body


def test_builtins_are_seeded_and_pr_review_posts_one_review(
    worker: tuple[GiteaEmulator, Running],
) -> None:
    gitea, ff = worker
    gitea.push_branch("acme", "widget", "feature", {"f.txt": "x\n"}, base="main")
    pull = gitea.add_pull("acme", "widget", title="Feature", head="feature", author="alice")
    before = gitea.comments("acme", "widget", pull)
    with ff.admin() as admin:
        items = admin.get("/api/pipelines/templates").json()["items"]
        switches = {t["key"]: t["enabled"] for t in items if t["builtIn"]}
        assert {k for k, on in switches.items() if on} == SHIPPED_ENABLED
        assert {k for k, on in switches.items() if not on} == SHIPPED_DISABLED
        r = admin.post(
            "/api/pipelines/templates/pr_triage/runs",
            json={"requestId": "t1", "inputs": {"resource": "default:acme/widget:pull_request:1"}},
        )
        assert (r.status_code, r.json()["error"]) == (409, "template_disabled")

        r = admin.post(
            "/api/pipelines/templates/pr_review/runs",
            json={"requestId": "rv1", "inputs": {"repo": "acme/widget", "number": pull}},
        )
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, run_id))["status"] != "running" and x)
        assert run["status"] == "succeeded", run
        # The review command's task made one Gitea review: the scripted agent never
        # calls submit_review, so forgeflow posted its last message as the summary.
        out = run["state"]["review"]
        task = admin.get(f"/api/gitea-workflow/tasks/{out['taskId']}").json()["task"]
        assert (task["mode"], task["sessionKey"]) == (
            "pr_review",
            f"default:acme/widget:pull_request:{pull}",
        )
        assert out["state"] == "succeeded_with_rest_fallback"
        reviews = [r for r in gitea.reviews("acme", "widget", pull) if r["state"] == "COMMENT"]
        assert [r["id"] for r in reviews] == [out["reviewId"]]
        assert reviews[0]["body"].startswith("comment: draft review of acme/widget")
        # Besides the review, the pull request got the task's receipt only.
        after = gitea.comments("acme", "widget", pull)
        assert len(after) == len(before) + 1 and f"taskId={out['taskId']} " in after[-1]["body"]

        # The PR is merged: the daily sweep (run by hand here) removes its worktree.
        root = Path(ff.settings.resolved_workspace_root)
        worktree = root / ".sessions/default/acme/widget" / f"pull_request-{pull}"
        assert worktree.is_dir()
        r = admin.post("/api/pipelines/templates/pr_merged_cleanup/runs", json={"requestId": "c1"})
        first = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, first))["status"] != "running" and x)
        assert run["state"]["cleanup"] == {"removed": [], "kept": []} and worktree.is_dir()
        gitea.merge_pull("acme", "widget", pull, merger="alice")
        # The merge's PrMerged event may remove it first (when the trigger dispatcher
        # runs); the sweep then finds nothing left. Either way exactly one run removed it.
        r = admin.post("/api/pipelines/templates/pr_merged_cleanup/runs", json={"requestId": "c2"})
        second = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, second))["status"] != "running" and x)
        assert run["status"] == "succeeded", run
        wait_for(lambda: not worktree.exists(), what="the merged PR's worktree removed")
        resource = f"default:acme/widget:pull_request:{pull}"
        runs = admin.get("/api/pipelines/runs", params={"templateKey": "pr_merged_cleanup"})
        removals = []
        for item in runs.json()["items"]:
            done = wait_for(
                lambda i=item: (x := _run(admin, i["runId"]))["status"] != "running" and x
            )
            cleanup = done["state"].get("cleanup", {})
            if cleanup.get("removed") is True or resource in (cleanup.get("removed") or []):
                removals.append((done["triggerType"], cleanup))
        assert removals in (
            [("manual", {"removed": [resource], "kept": []})],
            [("event", {"resourceKey": resource, "removed": True})],
        ), removals
