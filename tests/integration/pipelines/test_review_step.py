"""``conversation.reviewPullRequest`` on a real store, the real webhook intake and the
Gitea emulator: a step's review is the review command's task (mode pr_review, the pull
request's own session, its head), admitted once per execution and taken over by a later
attempt; the permission rule of a mention applies to the Gitea sender of the run's event
(of the run at the top of a chain of child runs), an operator's run needs none; the
step outputs the review's id once the task posted it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import Connection, select

from forgeflow.config import Settings
from forgeflow.domain import modes
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.records import Task
from forgeflow.domain.review_asks import ReviewAsk, ReviewAsked, ask_task_id
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, PermissionCache
from forgeflow.pipelines import templates
from forgeflow.pipelines.definition import load_definition
from forgeflow.pipelines.runs import Parent
from forgeflow.rejections import RejectionLog
from forgeflow.store import Store, deliveries, schema, tasks
from forgeflow.store import comments as comment_q
from forgeflow.tasks.intake import WebhookIngress
from forgeflow.tasks.review_asks import ReviewAsks
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.integration.pipelines.harness import harness, run_async
from tests.support.pipelines import dag_doc

BOT = "ccweb-bot"
REPO = RepoRef("acme", "widget")


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    settings: Settings
    token: str
    pull: ResourceRef
    head: str
    tmp: Path

    def asks(self, gitea: GiteaClient) -> ReviewAsks:
        permissions = PermissionCache(gitea, 0)
        rejections = RejectionLog(self.store, 60, 1)
        ingress = WebhookIngress(self.settings, self.store, permissions, rejections)
        return ReviewAsks(self.store, ingress, gitea)

    def ask(self, *asks: ReviewAsk) -> list[ReviewAsked]:
        async def go() -> list[ReviewAsked]:
            gitea = GiteaClient(self.emu.url, self.token)
            try:  # one intake, as one forgeflow process has
                port = self.asks(gitea)
                return [await port.ask(a) for a in asks]
            finally:
                await gitea.aclose()

        return asyncio.run(go())

    def task(self, task_id: str) -> Task:
        found = self.store.db.read_sync(lambda c: tasks.get(c, task_id))
        assert found is not None
        return found

    def run(self, *, event: dict[str, Any] | None = None, parent: str | None = None) -> str:
        def start(c: Connection) -> str:
            started = templates.start(
                c,
                "rv",
                trigger_type="event" if event else ("pipeline" if parent else "manual"),
                event_type="CommentCreated" if event else None,
                event=event,
                actor=f"pipeline:{parent}" if parent else "admin:olga",
                parent=Parent(parent, "call", -1) if parent else None,
            )
            return str(started.run.run_id)

        return self.store.db.write_sync(start)

    def pull_tasks(self) -> list[str]:
        query = select(schema.tasks.c.task_id).where(schema.tasks.c.resource_key == self.pull.key)
        rows = self.store.db.read_sync(lambda c: c.execute(query).all())
        return sorted(r[0] for r in rows)


REVIEW_DOC = dag_doc(
    "t>review review>end",
    key="rv",
    review={
        "kind": "listen",
        "bodyKey": "conversation.reviewPullRequest",
        "inputs": {"repo": "acme/widget", "number": "{{ inputs.number }}", "focus": "errors"},
        "outputKey": "review",
        "extras": {"pollSeconds": 0.05},
    },
)
REVIEW_DOC["inputs"] = [{"name": "number", "type": "integer", "default": 1}]


@pytest.fixture
def world(tmp_path: Path, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        emu.add_user("mallory")
        emu.add_repo("acme", "widget", files={"app.txt": "one\n"})
        for login, level in (("alice", "write"), ("mallory", "read"), (BOT, "admin")):
            emu.set_permission("acme", "widget", login, level)
        head = emu.push_branch("acme", "widget", "feature", {"app.txt": "two\n"}, pusher="alice")
        number = emu.add_pull("acme", "widget", title="Two", head="feature", author="alice")
        settings = Settings(
            data_dir=tmp_path / "ff", webhook_secret=SecretStr("s"), gitea_url=emu.url
        )
        loaded = load_definition(REVIEW_DOC)
        store.db.write_sync(lambda c: templates.create(c, loaded, actor="test"))
        pull = ResourceRef(REPO, ResourceKind.PULL_REQUEST, number)
        yield World(emu, store, settings, token, pull, head, tmp_path / "engine")


def _ask(w: World, run_id: str, attempt: int, earlier: int = 0) -> ReviewAsk:
    key = f"{run_id}:review:{attempt}"
    before = tuple(f"{run_id}:review:{a}" for a in range(earlier, 0, -1))
    return ReviewAsk(key, run_id, w.pull, "the error paths", before)


def test_an_operators_step_makes_the_review_commands_task_once(world: World) -> None:
    run_id = world.run()
    first, again = world.ask(_ask(world, run_id, 1), _ask(world, run_id, 1))
    assert first.code is None and first.task_id == ask_task_id(f"{run_id}:review:1")
    assert again.task_id == first.task_id  # a body called again after a crash
    assert first.task_id is not None
    task = world.task(first.task_id)
    # The review command's task: pull request review mode, the PR's own session (not a
    # pipeline space), its head, the focus as the review's instruction, queued.
    assert (task.mode, task.session_key, task.state) == (
        modes.PR_REVIEW,
        world.pull.key,
        TaskState.QUEUED,
    )
    assert task.refs is not None and task.refs.head_sha == world.head
    assert (task.author, task.instruction) == ("admin:olga", "review the error paths")
    record = world.store.db.read_sync(
        lambda c: deliveries.get(c, f"default:pipeline-review:{run_id}:review:1")
    )
    assert record is not None and (record.status, record.task_id) == ("accepted", task.task_id)
    # A later attempt takes the running task over; once it failed, a new one is asked.
    (taken,) = world.ask(_ask(world, run_id, 2, earlier=1))
    assert (taken.task_id, taken.adopted) == (first.task_id, True)
    world.store.db.write_sync(
        lambda c: tasks.transition(
            c, tasks.Transition(task.task_id, TaskState.CANCELLED, task.state_version)
        )
    )
    (fresh,) = world.ask(_ask(world, run_id, 3, earlier=2))
    assert fresh.task_id not in (None, first.task_id) and not fresh.adopted
    assert world.pull_tasks() == sorted([first.task_id, str(fresh.task_id)])


def test_a_run_of_a_gitea_event_asks_as_its_sender(world: World) -> None:
    refused_run = world.run(event={"sender": "mallory", "eventType": "CommentCreated"})
    (refused,) = world.ask(_ask(world, refused_run, 1))
    assert refused.code == "insufficient_permission" and not refused.retryable
    assert "mallory" in refused.message
    assert refused.task_id is not None
    assert world.task(refused.task_id).state == TaskState.REJECTED
    # A child run asks as whoever started the run at the top of its chain.
    child = world.run(parent=refused_run)
    (also,) = world.ask(_ask(world, child, 1))
    assert also.code == "insufficient_permission"
    allowed_run = world.run(event={"sender": {"login": "alice"}})
    (allowed,) = world.ask(_ask(world, allowed_run, 1))
    assert allowed.code is None and allowed.task_id is not None
    assert world.task(allowed.task_id).author == "alice"
    # A sender that is no Gitea login is refused before anything is asked of Gitea.
    odd = world.run(event={"sender": "not a login"})
    (bad,) = world.ask(_ask(world, odd, 1))
    assert (bad.code, bad.task_id) == ("invalid_actor", None)


def test_a_pull_request_gitea_does_not_have_fails_the_step(world: World) -> None:
    async def scenario() -> Any:
        gitea = GiteaClient(world.emu.url, world.token)
        try:
            async with harness(world.store, world.tmp, reviews=world.asks(gitea)) as h:
                return await h.run("rv", inputs={"number": 999})
        finally:
            await gitea.aclose()

    run = run_async(scenario)
    assert (run.status, run.error_code) == ("failed", "gitea_not_found")
    assert world.pull_tasks() == []


def _post_review(store: Store, task: Task, review_id: int) -> None:
    """What the task's turn and verification leave: its review sent, the task done."""

    def done(c: Connection) -> None:
        comment_q.record_intent(
            c,
            comment_key=f"review:{task.task_id}",
            task_id=task.task_id,
            kind="review",
            resource_key=task.resource_key,
            turn_key=f"{task.task_id}:1",
            body_hash="sha256:x",
            body="{}",
        )
        comment_q.record_result(
            c, f"review:{task.task_id}", status=comment_q.SENT, comment_id=review_id
        )
        version = task.state_version
        for state in (
            TaskState.PREPARING,
            TaskState.RUNNING,
            TaskState.VERIFYING_REPLY,
            TaskState.SUCCEEDED,
        ):
            version = tasks.transition(
                c, tasks.Transition(task.task_id, state, version)
            ).state_version

    store.db.write_sync(done)


def test_the_step_waits_for_its_task_and_outputs_the_review(world: World) -> None:
    async def scenario() -> Any:
        gitea = GiteaClient(world.emu.url, world.token)
        try:
            async with harness(world.store, world.tmp, reviews=world.asks(gitea)) as h:
                run_id = await h.start("rv", inputs={"number": world.pull.number})

                async def asked() -> Any:
                    step = (await h.steps(run_id))["review"]
                    return step.status == "suspended" and step

                step = await h.wait(asked, what="the step waits for its review task")
                task = world.task(step.suspend["data"]["taskId"])
                assert step.suspend["reason"] == "awaiting_review"
                await asyncio.to_thread(_post_review, world.store, task, 4242)
                return task, await h.finished(run_id)
        finally:
            await gitea.aclose()

    task, run = run_async(scenario)
    assert run.status == "succeeded", run.error
    assert run.state["review"] == {"taskId": task.task_id, "state": "succeeded", "reviewId": 4242}
    assert world.pull_tasks() == [task.task_id]
