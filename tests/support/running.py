"""A task whose turn runs in its session, written through the store's own functions
(the tools' comment records belong to the running task of a session)."""

from __future__ import annotations

from sqlalchemy import Connection

from forgeflow.domain.ids import ResourceRef
from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.store import Store, repos, tasks


def running_task(store: Store, task_id: str, resource: ResourceRef, comment_id: int = 1) -> Task:
    """A task on ``resource`` (its own session) moved received → running, started by
    comment ``comment_id``."""

    def create(c: Connection) -> None:
        repo = resource.repo
        repos.register(c, repo=repo, clone_url="", default_branch="main", workspace_path="/w")
        tasks.insert_received(
            c,
            {
                "task_id": task_id,
                "delivery_key": f"default:{task_id}",
                "repo_key": repo.key,
                "resource_key": resource.key,
                "session_key": resource.key,
                "comment_id": comment_id,
                "author": "alice",
                "instruction": "x",
            },
        )
        version = 1
        for state in (TaskState.QUEUED, TaskState.PREPARING, TaskState.RUNNING):
            version = tasks.transition(c, tasks.Transition(task_id, state, version)).state_version

    store.db.write_sync(create)
    task = store.db.read_sync(lambda c: tasks.get(c, task_id))
    assert task is not None and task.state == TaskState.RUNNING
    return task
