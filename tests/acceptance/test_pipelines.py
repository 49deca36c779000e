"""Pipelines through forgeflow's public surface: /api/pipelines, an agent step run by
the scheduler against the Gitea emulator, and ``forgeflow pipelines`` on the CLI."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow.config import Role
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running, run_forgeflow
from tests.support.process import FORGEFLOW, clean_env
from tests.support.world import BOT

YAML = {"Content-Type": "application/yaml"}

TRIAGE = """
key: triage
name: Triage by label
inputs: [{name: label, type: string, required: true}, {name: count, type: integer}]
nodes:
  - {id: start, kind: trigger}
  - {id: route, kind: router, bodyKey: pipeline.condition, outputKey: route,
     extras: {switchKey: inputs.label, cases: {bug: bug}, default: other}}
  - {id: gate, kind: listen, bodyKey: human.gate, outputKey: approval,
     inputs: {message: "Label {{ inputs.label }}: go ahead?"}}
  - {id: done, kind: terminal}
edges:
  - {from: start, to: route}
  - {from: route, to: gate, routeKey: bug}
  - {from: route, to: done, routeKey: other}
  - {from: gate, to: done}
triggers: [{type: manual}, {type: webhook}]
"""


@pytest.fixture
def ff(tmp_path: Path, db_url: str) -> Iterator[Running]:
    with run_forgeflow(tmp_path / "ff", db_url, role=Role.ALL, poll_seconds=0.2) as running:
        yield running


def _run(admin: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
    return body


def _step(run: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in run["steps"] if s["stepId"] == step_id)


def test_templates_runs_and_gates_over_http(ff: Running) -> None:
    with ff.admin() as admin:
        assert httpx.get(ff.url + "/api/pipelines/templates").status_code == 401
        bad = TRIAGE.replace("backoff", "x").replace("kind: router", "kind: fork", 1)
        r = admin.post("/api/pipelines/templates", content=bad, headers=YAML)
        assert r.status_code == 400 and r.json()["error"] == "invalid_definition"
        assert any(e.startswith("nodes[route].kind:") for e in r.json()["errors"])
        r = admin.post("/api/pipelines/templates", content=TRIAGE, headers=YAML)
        assert r.status_code == 201, r.text
        template = r.json()["template"]
        assert (template["key"], template["enabled"], r.json()["warnings"]) == ("triage", False, [])
        webhook = next(t for t in template["triggers"] if t["type"] == "webhook")
        assert webhook["webhookPath"].startswith("/webhooks/")
        assert (
            admin.post("/api/pipelines/templates", content=TRIAGE, headers=YAML).json()["error"]
            == "template_exists"
        )
        listed = admin.get("/api/pipelines/templates").json()["items"]
        mine = [t for t in listed if not t["builtIn"]]
        assert [t["key"] for t in mine] == ["triage"] and "definition" not in mine[0]

        start = {"requestId": "r1", "inputs": {"label": "bug"}}
        r = admin.post("/api/pipelines/templates/triage/runs", json=start)
        assert (r.status_code, r.json()["error"]) == (409, "template_disabled")
        r = admin.post("/api/pipelines/templates/triage/enable", json={"requestId": "e1"})
        assert r.status_code == 200 and r.json()["enabled"] is True
        r = admin.post(
            "/api/pipelines/templates/triage/runs",
            json={"requestId": "r2", "inputs": {"label": 5, "count": "x", "colour": 1}},
        )
        assert r.status_code == 400 and r.json()["error"] == "invalid_inputs"
        assert r.json()["errors"] == [
            "inputs.colour: not a declared input",
            "inputs.label: expected string, got int",
            "inputs.count: expected integer, got str",
        ]
        r = admin.post("/api/pipelines/templates/triage/runs", json={**start, "requestId": "r3"})
        assert r.status_code == 201, r.text
        run_id = r.json()["run"]["runId"]
        again = admin.post(
            "/api/pipelines/templates/triage/runs", json={**start, "requestId": "r3"}
        )
        assert again.json()["run"]["runId"] == run_id and again.json()["replayed"] is True

        run = wait_for(
            lambda: (x := _run(admin, run_id)) and _step(x, "gate")["status"] == "suspended" and x
        )
        gate = _step(run, "gate")
        assert gate["suspend"]["data"] == {"message": "Label bug: go ahead?"}
        assert run["state"]["route"] == "bug"
        r = admin.post(
            f"/api/pipelines/runs/{run_id}/steps/route/approve", json={"requestId": "a0"}
        )
        assert (r.status_code, r.json()["error"]) == (409, "step_not_awaiting_approval")
        r = admin.post(
            f"/api/pipelines/runs/{run_id}/steps/gate/approve",
            json={"requestId": "a1", "reason": "looks right", "operator": "bob"},
        )
        assert r.status_code == 200 and r.json()["decision"] == "approved"
        run = wait_for(lambda: (x := _run(admin, run_id))["status"] != "running" and x)
        assert run["status"] == "succeeded"
        assert run["state"]["approval"] == {
            "decision": "approved",
            "by": "admin:bob",
            "reason": "looks right",
        }

        r = admin.post("/api/pipelines/templates/triage/runs", json={**start, "requestId": "r4"})
        second = r.json()["run"]["runId"]
        wait_for(lambda: _step(_run(admin, second), "gate")["status"] == "suspended")
        r = admin.post(
            f"/api/pipelines/runs/{second}/steps/gate/reject",
            json={"requestId": "j1", "reason": "not now"},
        )
        assert r.status_code == 200 and r.json()["decision"] == "rejected"
        run = wait_for(lambda: (x := _run(admin, second))["status"] != "running" and x)
        assert (run["status"], run["errorCode"]) == ("failed", "gate_rejected")

        r = admin.post(
            "/api/pipelines/templates/triage/runs",
            json={"requestId": "r5", "inputs": {"label": "question"}},
        )
        other = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, other))["status"] != "running" and x)
        assert run["status"] == "succeeded" and _step(run, "gate")["status"] == "skipped"

        page = admin.get("/api/pipelines/runs", params={"templateKey": "triage"}).json()
        assert page["total"] == 3 and "state" not in page["items"][0]
        failed = admin.get("/api/pipelines/runs", params={"status": "failed"}).json()
        assert [x["runId"] for x in failed["items"]] == [second]
        assert admin.get("/api/pipelines/runs/nope").json()["error"] == "run_not_found"


def test_put_cancel_and_disable(ff: Running) -> None:
    slow = TRIAGE.replace("{type: webhook}", "{type: schedule, schedule: '0 * * * *'}")
    with ff.admin() as admin:
        r = admin.put("/api/pipelines/templates/triage", content=slow, headers=YAML)
        assert r.status_code == 201 and r.json()["template"]["version"] == 1
        changed = slow.replace("Label {{", "Tag {{") + "enabled: true\n"
        r = admin.put("/api/pipelines/templates/triage", content=changed, headers=YAML)
        assert r.status_code == 200
        assert (r.json()["template"]["version"], r.json()["template"]["enabled"]) == (2, True)
        assert {t["type"] for t in r.json()["template"]["triggers"]} == {"manual", "schedule"}
        r = admin.put("/api/pipelines/templates/other", content=changed, headers=YAML)
        assert (r.status_code, r.json()["error"]) == (400, "key_mismatch")

        r = admin.post(
            "/api/pipelines/templates/triage/runs",
            json={"requestId": "c1", "inputs": {"label": "bug"}},
        )
        run_id = r.json()["run"]["runId"]
        wait_for(lambda: _step(_run(admin, run_id), "gate")["status"] == "suspended")
        r = admin.post(f"/api/pipelines/runs/{run_id}/cancel", json={"requestId": "x1"})
        assert r.status_code == 200 and r.json()["run"]["status"] == "cancelled"
        run = _run(admin, run_id)
        assert _step(run, "gate")["status"] == "cancelled"
        assert _step(run, "done")["status"] == "skipped"
        r = admin.post("/api/pipelines/templates/triage/disable", json={"requestId": "d1"})
        assert r.json()["enabled"] is False
        r = admin.post(
            "/api/pipelines/templates/triage/runs",
            json={"requestId": "c2", "inputs": {"label": "bug"}},
        )
        assert r.json()["error"] == "template_disabled"
        audit = admin.get("/api/gitea-workflow/audit", params={"limit": 500}).json()["items"]
        actions = [
            e["action"]
            for e in audit
            if e["action"].startswith("pipeline.") and e["metadata"].get("templateKey") == "triage"
        ]
        assert actions == [
            "pipeline.template.create",
            "pipeline.template.update",
            "pipeline.run.start",
            "pipeline.run.finish",
            "pipeline.template.disable",
        ]


AGENT = """
key: agent_flow
name: Ask the agent, then comment and label
enabled: true
inputs: [{name: issue, type: integer, required: true}]
nodes:
  - {id: start, kind: trigger}
  - id: space
    kind: listen
    bodyKey: messaging.createSpace
    outputKey: space
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}"}
    extras: {mode: chat}
  - id: ask
    kind: listen
    bodyKey: conversation.promptAgent
    outputKey: agent
    inputs:
      repo: acme/widget
      number: "{{ inputs.issue }}"
      prompt: "Summarise issue #{{ inputs.issue }}"
    extras: {pollSeconds: 0.2, spaceId: "{{ space.spaceId }}"}
  - id: comment
    kind: listen
    bodyKey: gitea.comment
    outputKey: comment
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}", body: "Agent said: {{ agent.reply }}"}
  - id: label
    kind: listen
    bodyKey: gitea.label
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}", labels: [triaged]}
  - id: cleanup
    kind: listen
    bodyKey: repos.cleanup
    outputKey: cleanup
    inputs: {resource: "default:acme/widget:issue:{{ inputs.issue }}"}
edges:
  - {from: start, to: space}
  - {from: space, to: ask}
  - {from: ask, to: comment}
  - {from: comment, to: label}
  - {from: label, to: cleanup}
triggers: [{type: manual}]
"""


def test_an_agent_step_runs_as_a_task_then_comments_and_labels(
    worker: tuple[GiteaEmulator, Running],
) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="Flaky", author="alice")
    gitea.add_label("acme", "widget", "triaged")
    with ff.admin() as admin:
        r = admin.post("/api/pipelines/templates", content=AGENT, headers=YAML)
        assert r.status_code == 201, r.text
        r = admin.post(
            "/api/pipelines/templates/agent_flow/runs",
            json={"requestId": "go", "inputs": {"issue": issue}},
        )
        run_id = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, run_id))["status"] != "running" and x)
        assert run["status"] == "succeeded", run
        task_id = run["state"]["agent"]["taskId"]
        task = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()["task"]
    assert task["author"] == f"pipeline:{run_id}" and task["commentId"] is None
    assert task["deliveryKey"] is None and task["state"] == "succeeded"
    assert task["instruction"] == f"Summarise issue #{issue}"
    assert run["state"]["agent"]["reply"] == f"done: {task_id}"
    resource = f"default:acme/widget:issue:{issue}"
    # chat mode is the mention workflow: the resource's own session, answer on the issue.
    assert run["state"]["space"] == {"spaceId": resource, "mode": "chat", "resourceKey": resource}
    assert task["mode"] == "chat" and task["sessionKey"] == resource
    assert run["state"]["cleanup"] == {"resourceKey": resource, "removed": True}
    worktree = Path(ff.settings.resolved_workspace_root) / ".sessions/default/acme/widget"
    assert not (worktree / f"issue-{issue}").exists()
    assert run["inputTokens"] == 100
    bodies = [c["body"] for c in gitea.comments("acme", "widget", issue)]
    posted = [b for b in bodies if b.startswith("Agent said:")]
    assert len(posted) == 1 and f"pipelineStep={run_id}:comment" in posted[0]
    assert run["state"]["comment"]["commentId"] > 0
    assert [x["name"] for x in gitea.issue("acme", "widget", issue)["labels"]] == ["triaged"]
    assert any(
        c["user"]["login"] == BOT and "kind=final" in c["body"]
        for c in gitea.comments("acme", "widget", issue)
    )


REVIEW_SPACE = """
key: review_space
name: A review space, then a step that tries to widen it
enabled: true
inputs: [{name: issue, type: integer, required: true}]
nodes:
  - {id: start, kind: trigger}
  - id: space
    kind: listen
    bodyKey: messaging.createSpace
    outputKey: space
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}"}
  - id: draft
    kind: listen
    bodyKey: conversation.promptAgent
    outputKey: draft
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}", prompt: "Review #{{ inputs.issue }}"}
    extras: {pollSeconds: 0.2, spaceId: "{{ space.spaceId }}"}
  - id: widen
    kind: listen
    bodyKey: conversation.promptAgent
    outputKey: widened
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}", prompt: "Now fix it"}
    extras: {pollSeconds: 0.2, spaceId: "{{ space.spaceId }}", mode: chat}
edges:
  - {from: start, to: space}
  - {from: space, to: draft}
  - {from: draft, to: widen}
triggers: [{type: manual}]
"""


def test_a_review_space_drafts_silently_and_a_step_cannot_widen_it(
    worker: tuple[GiteaEmulator, Running],
) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="Flaky", author="alice")
    resource = f"default:acme/widget:issue:{issue}"
    with ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", content=REVIEW_SPACE, headers=YAML).is_success
        r = admin.post(
            "/api/pipelines/templates/review_space/runs",
            json={"requestId": "go", "inputs": {"issue": issue}},
        )
        run_id = r.json()["run"]["runId"]
        run = wait_for(lambda: (x := _run(admin, run_id))["status"] != "running" and x)
        # The default mode is review; the space is a session of its own, not the issue's.
        space = run["state"]["space"]
        assert space["mode"] == "review" and space["spaceId"].startswith(resource + ":space-")
        draft = run["state"]["draft"]
        task = admin.get(f"/api/gitea-workflow/tasks/{draft['taskId']}").json()
        assert (task["task"]["state"], task["task"]["mode"]) == ("succeeded", "review")
        assert task["task"]["sessionKey"] == space["spaceId"]
        assert draft["reply"] == task["turns"][0]["lastMessage"] and draft["reply"]
        assert "draft.record" in [e["action"] for e in task["audit"]]
        # The widening step failed before any task was created.
        assert run["status"] == "failed", run
        widen = _step(run, "widen")
        assert (widen["status"], widen["errorCode"]) == ("failed", "mode_widening")
        assert "widened" not in run["state"]
    # Nothing reached the issue: no receipt, no answer, no failure notice.
    assert gitea.comments("acme", "widget", issue) == []

    # A later mention on the same issue keeps the full-access mention session.
    posted = gitea.post_comment("acme", "widget", issue, author="alice", body="@ccweb-bot fix it")
    mention = gitea.delivery_of_comment(posted["id"])
    assert mention.status_code == 202, mention.response
    mention_id = json.loads(mention.response)["taskId"]
    with ff.admin() as admin:
        detail = wait_for(
            lambda: (
                (d := admin.get(f"/api/gitea-workflow/tasks/{mention_id}").json())["terminal"] and d
            )
        )
    assert detail["task"]["state"] == "succeeded"
    assert (detail["task"]["sessionKey"], detail["task"]["mode"]) == (resource, None)
    assert detail["task"]["threadId"] != task["task"]["threadId"]
    kinds = sorted(
        c["body"].rsplit("kind=", 1)[1]
        for c in gitea.comments("acme", "widget", issue)
        if c["user"]["login"] == BOT
    )
    assert kinds == ["final -->", "receipt -->"]


def test_the_command_line(tmp_path: Path) -> None:
    env = clean_env(FORGEFLOW_DATA_DIR=str(tmp_path / "data"))
    doc = tmp_path / "triage.yaml"
    doc.write_text(TRIAGE)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [FORGEFLOW, "pipelines", *args], env=env, capture_output=True, text=True, timeout=60
        )

    assert cli("apply", str(doc)).stdout.strip() == "triage v1 disabled"
    assert cli("list").stdout.split("\t")[:4] == ["triage", "v1", "disabled", "manual,webhook"]
    out = cli("run", "triage", "--input", "label=bug")
    assert out.returncode == 1 and "template_disabled" in out.stderr
    assert cli("enable", "triage").stdout.strip() == "triage enabled"
    out = cli("run", "triage", "--input", "label=bug", "--input", "count=seven")
    assert out.returncode == 1 and "inputs.count: expected integer" in out.stderr
    out = cli("run", "triage", "--input", "label=bug", "--input", "count=7")
    assert out.returncode == 0 and out.stdout.startswith("run-")
    shown = cli("show", "triage").stdout
    assert out.stdout.strip() in shown and '"enabled": true' in shown
    assert cli("disable", "triage").stdout.strip() == "triage disabled"
    bad = tmp_path / "bad.yaml"
    bad.write_text(TRIAGE.replace("kind: terminal", "kind: terminal, bodyKey: x"))
    out = cli("apply", str(bad))
    assert out.returncode == 1 and "nodes[done].bodyKey: a terminal node has no body" in out.stderr


LABELS = """
key: labels
name: Label with and without creating
enabled: true
inputs: [{name: issue, type: integer, required: true}, {name: repo, type: string}]
nodes:
  - {id: start, kind: trigger}
  - id: label
    kind: listen
    bodyKey: gitea.label
    outputKey: labels
    inputs: {repo: "{{ inputs.repo }}", number: "{{ inputs.issue }}", labels: [LABEL]CREATE}
edges: [{from: start, to: label}]
triggers: [{type: manual}]
"""


def _label_run(admin: httpx.Client, key: str, body: str, issue: int, repo: str) -> Any:
    r = admin.post("/api/pipelines/templates", content=body.replace("labels", key, 1), headers=YAML)
    assert r.status_code == 201, r.text
    r = admin.post(
        f"/api/pipelines/templates/{key}/runs",
        json={"requestId": key, "inputs": {"issue": issue, "repo": repo}},
    )
    run_id = r.json()["run"]["runId"]
    return wait_for(lambda: (x := _run(admin, run_id))["status"] != "running" and x)


def test_a_label_step_creates_a_missing_label_or_names_it_and_gitea_refusals_keep_their_code(
    worker: tuple[GiteaEmulator, Running],
) -> None:
    from forgeflow.pipelines.seeds import load_builtins  # the shipped definitions

    # The built-in task_failed_notice asks for its label to be created: a fresh Gitea
    # has no forgeflow-failed label.
    [builtin] = [x.definition for x in load_builtins() if x.definition.key == "task_failed_notice"]
    [step] = [n for n in builtin.nodes if n.bodyKey == "gitea.label"]
    assert step.inputs["labels"] == ["forgeflow-failed"] and step.inputs["createMissing"] is True
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="Broken", author="alice")
    with ff.admin() as admin:
        named = _label_run(
            admin,
            "plain",
            LABELS.replace("LABEL", "forgeflow-failed").replace("CREATE", ""),
            issue,
            "acme/widget",
        )
        assert named["status"] == "failed", named
        failed = _step(named, "label")
        assert failed["errorCode"] == "label_missing"
        assert "forgeflow-failed" in failed["error"] and "createMissing" in failed["error"]
        assert gitea.issue("acme", "widget", issue)["labels"] == []
        made = _label_run(
            admin,
            "creating",
            LABELS.replace("LABEL", "forgeflow-failed").replace("CREATE", ", createMissing: true"),
            issue,
            "acme/widget",
        )
        assert made["status"] == "succeeded", made
        assert made["state"]["labels"] == {"labels": ["forgeflow-failed"]}
        assert [x["name"] for x in gitea.issue("acme", "widget", issue)["labels"]] == [
            "forgeflow-failed"
        ]
        # A Gitea 4xx is reported with its own code, not as gitea_unavailable.
        gitea.set_permission("acme", "gadget", BOT, "read")
        other = gitea.add_issue("acme", "gadget", title="Other", author="alice")
        refused = _label_run(
            admin,
            "refused",
            LABELS.replace("LABEL", "x").replace("CREATE", ", createMissing: true"),
            other,
            "acme/gadget",
        )
        assert refused["status"] == "failed"
        assert _step(refused, "label")["errorCode"] == "gitea_forbidden", refused
