"""The shipped templates (``forgeflow/pipelines/builtin/*.yaml``): each loads and
validates with no warning, and the set is the one the spec ships."""

from __future__ import annotations

import pytest

from forgeflow.domain.events import KNOWN_EVENT_TYPES as EVENT_TYPES
from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.definition import PipelineDefinition
from forgeflow.pipelines.kinds import StepKind
from forgeflow.pipelines.registry import PipelineBodyRegistry
from forgeflow.pipelines.seeds import (
    FORCED_ON,
    SHIPPED_DISABLED,
    SHIPPED_ENABLED,
    builtin_documents,
    load_builtins,
)


def _bodies() -> frozenset[str]:
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    return registry.keys()


BUILTINS = {x.definition.key: x for x in load_builtins(_bodies())}


def test_thirteen_templates_eight_of_them_disabled() -> None:
    assert len(builtin_documents()) == 13
    assert set(BUILTINS) == SHIPPED_DISABLED | SHIPPED_ENABLED
    assert len(SHIPPED_DISABLED) == 8 and len(SHIPPED_ENABLED) == 5
    assert {k for k, x in BUILTINS.items() if not x.definition.enabled} == SHIPPED_DISABLED
    assert {"pr_review", "pr_merged_cleanup"} <= SHIPPED_ENABLED


@pytest.mark.parametrize("key", sorted(BUILTINS))
def test_each_template_loads_without_warnings(key: str) -> None:
    loaded = BUILTINS[key]
    assert loaded.warnings == []
    d = loaded.definition
    assert d.name and d.description, "shown in the template picker"
    for t in d.triggers:
        if t.type == "event":
            assert t.eventType in EVENT_TYPES
        if t.type == "schedule" and (key, t.type, "") not in FORCED_ON:
            assert t.enabled is False, "schedules ship off: a periodic sweep is opted into"
    assert d.triggers, "a built-in without a trigger could never run"


def _paths(d: PipelineDefinition, start: str, goal: str) -> list[list[str]]:
    out: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        if node == goal:
            out.append(path)
            return
        for e in d.edges:
            if e.source == node:
                walk(e.to, [*path, e.to])

    walk(start, [start])
    return out


def test_safe_enabled_templates_give_no_agent_write_access_and_post_nothing() -> None:
    for key in SHIPPED_ENABLED - {"pr_review"}:
        bodies = {n.body for n in BUILTINS[key].definition.nodes}
        assert not bodies & {"conversation.promptAgent", "gitea.comment", "flow.callPipeline"}


def test_pr_review_is_a_review_task_and_runs_only_by_hand() -> None:
    d = BUILTINS["pr_review"].definition
    assert [t.type for t in d.triggers] == ["manual"]
    bodies = {n.body for n in d.nodes if n.kind is StepKind.LISTEN}
    # The review command's task (forgeflow posts its one review): no draft, no comment.
    assert bodies == {"conversation.reviewPullRequest"}
    review = d.node("review")
    assert set(review.inputs) == {"repo", "number", "focus"}


def test_the_review_family_posts_reviews_through_review_tasks_only() -> None:
    for key in ("pr_review", "cross_review"):
        bodies = [n.body for n in BUILTINS[key].definition.nodes]
        assert "gitea.comment" not in bodies
        assert bodies.count("conversation.reviewPullRequest") == 1
    cross = BUILTINS["cross_review"].definition
    trigger = next(n.id for n in cross.nodes if n.kind is StepKind.TRIGGER)
    publish = next(n.id for n in cross.nodes if n.body == "conversation.reviewPullRequest")
    # The lens drafts and their consolidation run in a review (draft) space before it.
    (path,) = _paths(cross, trigger, publish)
    drafts = [cross.node(x) for x in path if cross.node(x).body == "conversation.promptAgent"]
    assert len(drafts) == 2 and all(n.extras.get("spaceId") for n in drafts)
    gate = BUILTINS["pre_merge_gate"].definition
    call = next(n for n in gate.nodes if n.body == "flow.callPipeline")
    assert call.extras["templateKey"] == "pr_review"


def test_pr_merged_cleanup_is_garbage_collection_with_a_daily_schedule_on() -> None:
    d = BUILTINS["pr_merged_cleanup"].definition
    schedule = next(t for t in d.triggers if t.type == "schedule")
    assert (schedule.schedule, schedule.enabled) == ("every:86400", True)
    assert ("pr_merged_cleanup", "schedule", "") in FORCED_ON
    assert {n.body for n in d.nodes if n.kind is StepKind.LISTEN} == {"repos.cleanup"}
