"""The receipt's rendering (domain/tracking.py) and the plan notification's parsing
(agent/items.py), on the shapes of codex's TurnPlanUpdatedNotification / ItemStarted."""

from __future__ import annotations

from forgeflow.domain.tracking import MAX_BODY, MAX_STEPS, View, doing_line, plan_steps, render


def test_plan_is_a_bounded_checklist_under_the_receipt_text() -> None:
    plan = plan_steps(
        [
            {"step": "Read the issue", "status": "completed"},
            {"step": "Fix\nthe <b>test</b>", "status": "inProgress"},
            "junk",
        ]
        + [{"step": "x" * 500, "status": "pending"}] * 50
    )
    assert len(plan) == MAX_STEPS
    body = render(
        View(
            header="giteabot: 已收到",
            plan=plan,
            doing=doing_line({"type": "commandExecution", "command": "pytest -q"}),
            elapsed_seconds=75,
        )
    )
    assert body.startswith("giteabot: 已收到\n")
    assert "- [x] Read the issue" in body and "- [ ] Fix the ‹b›test‹/b›" in body
    assert "now: `$ pytest -q`" in body and "elapsed 1m15s" in body
    assert len(body) <= MAX_BODY


def test_final_view_shows_outcome_not_the_current_step() -> None:
    body = render(
        View(
            header="giteabot: 已收到",
            doing="$ ls",
            outcome="answered below",
            input_tokens=12,
            output_tokens=3,
            where=("branch: `ff/issue-1`",),
        )
    )
    assert "now:" not in body and "outcome: answered below" in body
    assert "tokens: 12 in, 3 out" in body and "branch: `ff/issue-1`" in body
