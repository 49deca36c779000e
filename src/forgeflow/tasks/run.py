"""The life of a claimed task: ``preparing`` → ``running`` → ``verifying_reply``.

One :class:`Execution` drives one claimed task as far as it goes now, one step per
state, each step in its own module and returning the task's row after it:

- ``preparing``: ``prepare.py`` makes the workspace ready, posts the receipt and reads
  the prompt's context (``prompting.py``);
- ``running``: ``turn.py`` runs one agent turn, from its prompt to its end (its events
  followed by ``follow.py``);
- ``verifying_reply``: ``publish.py`` pushes what the agent committed, then
  ``verify.py`` looks for the answer on Gitea (and owns the rule for a missing one).

Any other state ends the run (a terminal state, a retry, a question to the user). The
run holds its repository's lease (the dispatcher renews it) until a move leaves the
active states. Every state change goes through the store's transition function; every
side effect (clone, turn, comment, push) is recorded before and after it happens.
"""

from __future__ import annotations

from forgeflow.domain.records import Repository, Task
from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.store.scheduling import Claim
from forgeflow.tasks import drafts, reviews
from forgeflow.tasks.dispatch import Dispatcher
from forgeflow.tasks.prepare import Preparer
from forgeflow.tasks.prompting import Context
from forgeflow.tasks.publish import Outcome, Publisher
from forgeflow.tasks.turn import TurnRunner
from forgeflow.tasks.verify import EndedTurn, Verifier
from forgeflow.workspace.manager import WorkspaceManager

S = TaskState
# At most this long a finished turn's verification lets preparing tasks go first.
_VERIFY_DEFER_SECONDS = 1.0


class Execution:
    def __init__(
        self,
        dispatcher: Dispatcher,
        preparer: Preparer,
        turns: TurnRunner,
        verifier: Verifier,
        workspace: WorkspaceManager,
        publisher: Publisher | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.workspace = workspace
        self.preparer = preparer
        self.turns = turns
        self.verifier = verifier
        self.publisher = publisher

    async def run(self, claim: Claim) -> Task:
        """Drive a just-claimed task as far as it goes now; return its last row."""
        task = claim.task
        context: Context | None = None  # the prompt's, read by this run's preparation
        ended: EndedTurn | None = None  # the turn this run ran, for its verification
        # The run works in the repository from its preparation to its push: a session's
        # removal (a pipeline's cleanup) waits for it (workspace/locks.py).
        async with (
            self.dispatcher.holding(task) as lease,
            self.workspace.working(task.resource.repo),
        ):
            while True:
                if task.state not in ACTIVE_STATES:
                    lease.given_back()  # the move out of the active states released it
                before = task.state_version
                if task.state == S.PREPARING:
                    task, context = await self._preparing(task, claim.repo)
                elif task.state == S.RUNNING:
                    task, ended = await self.turns.run(task, claim.session, context)
                elif task.state == S.VERIFYING_REPLY:
                    return await self._verifying(task, ended)
                else:
                    return task
                if task.state_version == before:
                    return task  # a step that did not move the task: nothing more now

    async def _preparing(self, task: Task, repo: Repository | None) -> tuple[Task, Context | None]:
        try:
            prepared = await self.preparer.prepare(task, repo)
        finally:
            self.dispatcher.prepared(task.task_id)
        return prepared.task, prepared.context

    async def _verifying(self, task: Task, ended: EndedTurn | None) -> Task:
        published = await self._publish(task)
        # Let the tasks this process prepares go first (bounded): the next task of the
        # repository was claimed when this one gave its lease back, and its turn waits
        # for its preparation; this verification (a Gitea read and a commit) only
        # delays this task's own ``succeeded``.
        await self.dispatcher.first(_VERIFY_DEFER_SECONDS)
        return await self.verifier.verify(task, ended, published)

    async def _publish(self, task: Task) -> Outcome | None:
        """Push what the agent committed in this turn (recorded; a refusal fails no
        task, the next turn's prompt says so). Drafts publish nothing."""
        if self.publisher is None or drafts.is_draft(task) or reviews.is_review(task):
            return None
        return await self.publisher.publish(task)
