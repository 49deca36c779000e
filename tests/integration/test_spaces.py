"""Draft spaces in the store: their own session row, tasks that carry the mode, and an
outbox that owes them no comment."""

from __future__ import annotations

from sqlalchemy import Connection, update

from forgeflow.domain.ids import parse_resource_key
from forgeflow.domain.records import Task
from forgeflow.store import Store, outbox, sessions, tasks
from forgeflow.store.schema import tasks as tasks_table

RESOURCE = parse_resource_key("default:acme/widget:pull_request:3")


def _pipeline_task(store: Store, task_id: str, *, space: bool) -> Task:
    def make(c: Connection) -> Task:
        session_key, mode = None, "chat"
        if space:
            row = sessions.open_space(c, RESOURCE, mode="review", run_id="run-1")
            session_key, mode = row.session_key, row.mode
        return tasks.create_pipeline_task(
            c,
            task_id=task_id,
            resource=RESOURCE,
            instruction="review it",
            run_id="run-1",
            clone_url="http://gitea/acme/widget.git",
            default_branch="main",
            workspace_path="/w/acme/widget",
            session_key=session_key,
            mode=mode,
        )

    created: Task = store.db.write_sync(make)
    return created


def test_a_review_space_is_a_session_of_its_own(store: Store) -> None:
    draft = _pipeline_task(store, "pipeline-task-draft", space=True)
    chat = _pipeline_task(store, "pipeline-task-chat", space=False)
    assert draft.mode == "review" and draft.session_key == sessions.space_key(RESOURCE, "run-1")
    assert chat.mode == "chat" and chat.session_key == RESOURCE.session_key
    space = store.db.read_sync(lambda c: sessions.get(c, str(draft.session_key)))
    own = store.db.read_sync(lambda c: sessions.get(c, RESOURCE.session_key))
    assert space is not None and own is not None
    assert (space.mode, space.runtime["mode"], space.mcp) == (
        "review",
        "read-only",
        {"server": None},
    )
    assert (own.mode, own.runtime["mode"]) == (None, "yolo")
    # Opening it again in the same run returns the same row, mode unchanged.
    again = store.db.write_sync(
        lambda c: sessions.open_space(c, RESOURCE, mode="plan", run_id="run-1")
    )
    assert (again.session_key, again.mode) == (space.session_key, "review")


def test_draft_tasks_owe_no_receipt_and_no_failure_notice(store: Store) -> None:
    _pipeline_task(store, "pipeline-task-draft", space=True)
    _pipeline_task(store, "pipeline-task-chat", space=False)
    owed = store.db.read_sync(outbox.receipts_owed)
    assert [t.task_id for t in owed] == ["pipeline-task-chat"]
    store.db.write_sync(
        lambda c: c.execute(update(tasks_table).values(state="failed", error_code="turn_failed"))
    )
    owed = store.db.read_sync(outbox.results_owed)
    assert [t.task_id for t in owed] == ["pipeline-task-chat"]
