"""Pages never fail on missing data: the task page of a task in every state, on an issue
and on a pull request (commented as Gitea >= 1.21 and Forgejo send it), renders. The
in-process server runs with strict templates, so a template reading a value the task
lacks fails here instead of rendering empty."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from sqlalchemy import update

from forgeflow.domain.states import TaskState
from forgeflow.store.schema import tasks
from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.world import World


@contextmanager
def _signed_in(world: World) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=world.ff.url, timeout=30) as client:
        form = client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        r = client.post(
            "/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN, "operator": "ops"}
        )
        assert r.status_code == 303, r.text
        yield client


def _task(world: World, index: int) -> str:
    posted = world.gitea.post_comment(
        "acme", "widget", index, author="alice", body="@ccweb-bot look"
    )
    reply = world.gitea.delivery_of_comment(posted["id"])
    assert reply.status_code == 202, reply.response
    task_id: str = json.loads(reply.response)["taskId"]
    return task_id


def _set(world: World, task_id: str, **values: object) -> None:
    # The test's own write: a task is put in each state as the store would hold it.
    world.ff.services.store.db.write_sync(
        lambda c: c.execute(update(tasks).where(tasks.c.task_id == task_id).values(**values))
    )


# The refs of a pull-request task before it is prepared, as forgeflow.gitea.webhook reads
# them from the ``pull_request`` object Gitea >= 1.21 and Forgejo send (no upstreamMoved).
UNPREPARED_REFS = {"base": "main", "head": "feature", "headSha": "ab" * 20, "headRepo": None}


def test_task_page_renders_in_every_state_of_every_resource_kind(world: World) -> None:
    on_issue, on_pull = _task(world, world.issue), _task(world, world.pull)
    _set(world, on_pull, refs=UNPREPARED_REFS)
    with _signed_in(world) as client:
        for task_id, kind in ((on_issue, "issue"), (on_pull, "pull request")):
            for state in TaskState:
                _set(world, task_id, state=state)
                r = client.get(f"/ui/tasks/{task_id}")
                assert r.status_code == 200, (kind, state, r.text[:500])
                assert f"s-{state.value}" in r.text, (kind, state)
        # A pull request's page shows its refs (present only on pull-request tasks).
        assert "Pull request" in client.get(f"/ui/tasks/{on_pull}").text


def _fact(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : html.index("</dd>", start)]


def test_task_page_shows_the_mentions_model_and_token_cap(world: World) -> None:
    task_id = _task(world, world.issue)
    with _signed_in(world) as client:
        plain = client.get(f"/ui/tasks/{task_id}").text
        # No options: the configured model (none here: the Codex configuration's) and
        # no cap of its own.
        assert "the Codex configuration's" in _fact(plain, "task-model")
        assert "--model" not in _fact(plain, "task-model")
        assert "none (the repository" in _fact(plain, "task-cap")
        # What `@ccweb-bot --model gpt-x --max-tokens 5000 …` stores (tasks.model,
        # tasks.max_tokens, #25 item 4).
        _set(world, task_id, model="gpt-x", max_tokens=5000, input_tokens=900, output_tokens=40)
        page = client.get(f"/ui/tasks/{task_id}").text
    assert "<code>gpt-x</code> (asked with <code>--model</code>)" in _fact(page, "task-model")
    assert "5000 tokens (<code>--max-tokens</code>)" in _fact(page, "task-cap")
    # No prices configured: tokens, no cost.
    assert "900 in + 40 out = 940" in _fact(page, "task-tokens")
    assert 'id="task-cost"' not in page
