"""Reviews asked for by pipeline steps, the pure part: who counts as asking (the Gitea
sender of the run's event, else the operator), the ids a step execution's request is
recorded under, and the bounded focus."""

from __future__ import annotations

import pytest

from forgeflow.domain import review_asks as ra
from forgeflow.domain.ids import delivery_key, task_id_for


def test_a_run_started_by_a_gitea_event_asks_as_its_sender() -> None:
    who = ra.asker({"sender": "alice", "eventType": "CommentCreated"}, "trigger:t1")
    assert (who.login, who.name) == ("alice", "alice")
    # A pipeline webhook's body carrying Gitea's own shape.
    hooked = ra.asker({"sender": {"login": "bob", "id": 3}}, "trigger:t2")
    assert hooked.login == "bob"


@pytest.mark.parametrize("created_by", ["admin:alice", "cli", "trigger:t9"])
def test_a_run_without_a_sender_asks_as_the_operator(created_by: str) -> None:
    for event in ({}, {"sender": None}, {"sender": ""}, {"schedule": "every:60"}):
        who = ra.asker(event, created_by)
        assert who.login is None and who.name == created_by


@pytest.mark.parametrize("sender", ["two words", "../etc", "x" * 41, 7, ["alice"]])
def test_a_sender_that_is_no_gitea_login_is_refused(sender: object) -> None:
    with pytest.raises(ValueError, match="not a Gitea login"):
        ra.asker({"sender": sender}, "trigger:t1")


def test_a_step_execution_is_one_delivery_and_one_task() -> None:
    key = "run-abc:review:1"
    assert ra.ask_delivery_id(key) == "pipeline-review:run-abc:review:1"
    assert ra.ask_task_id(key) == task_id_for(delivery_key("pipeline-review:run-abc:review:1"))
    assert ra.ask_task_id(key) != ra.ask_task_id("run-abc:review:2")


def test_the_focus_is_text_and_bounded() -> None:
    assert ra.bounded_focus(None) == ""
    assert ra.bounded_focus("  the error paths \n") == "the error paths"
    assert ra.bounded_focus(12) == "12"
    assert len(ra.bounded_focus("x" * (ra.MAX_FOCUS + 50))) == ra.MAX_FOCUS
