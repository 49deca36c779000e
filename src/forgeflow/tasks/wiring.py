"""Build a worker process's task runner: the scheduler and the objects a task's run goes
through, each given its collaborators as it is built. ``services.py`` builds what the
whole process shares and hands it over as a :class:`Process`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from forgeflow.agent.port import AgentRuntime
from forgeflow.config import Settings
from forgeflow.domain.retry import RetryPolicy
from forgeflow.gitea.client import GiteaClient
from forgeflow.store import Store
from forgeflow.tasks.abort_watch import AbortWatch
from forgeflow.tasks.dispatch import Dispatcher, Wakeup
from forgeflow.tasks.environment import Environments
from forgeflow.tasks.follow import TurnFollower
from forgeflow.tasks.images import ConversationImages
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.outbox import Outbox
from forgeflow.tasks.prepare import Preparer
from forgeflow.tasks.prompting import Prompts
from forgeflow.tasks.publish import Publisher
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.review_prompt import ReviewLimits, ReviewPrompts
from forgeflow.tasks.reviews import PullReviews
from forgeflow.tasks.run import Execution
from forgeflow.tasks.scheduler import Scheduler
from forgeflow.tasks.threads import ReviewThreads
from forgeflow.tasks.tracking import Tracker
from forgeflow.tasks.turn import TurnRunner
from forgeflow.tasks.verify import Verifier
from forgeflow.workspace.manager import WorkspaceManager


@dataclass(frozen=True)
class Process:
    """What the process shares with its task runner (``services.Services`` holds it)."""

    settings: Settings
    store: Store
    gitea: GiteaClient
    workspace: WorkspaceManager
    wakeup: Wakeup
    retry: RetryPolicy
    worker_id: str
    owner: str
    threads: ReviewThreads | None


def build_scheduler(
    p: Process,
    publisher: Publisher,
    runtime: AgentRuntime,
    reviews: PullReviews | None = None,
    environments: Environments | None = None,
) -> Scheduler:
    """The scheduler and every object a run goes through; no I/O until it starts."""
    s = p.settings
    dispatcher = Dispatcher(
        p.store,
        owner=p.owner,
        lease_ttl=timedelta(seconds=s.lease_ttl_seconds),
        worker_id=p.worker_id,
        max_preparations=s.max_preparations,
    )
    replies = _replies(p)
    tracker = Tracker(
        p.store,
        p.gitea,
        replies,
        every_seconds=s.tracking_edit_seconds,
        prices=s.price_table(),
        default_model=s.model,
    )
    outbox = Outbox(p.store, replies, dispatcher, gitea=p.gitea, tracker=tracker)
    moves = TaskMoves(p.store, p.retry, dispatcher)
    prompts = _prompts(p, moves)
    verifier = Verifier(p.store, replies, moves, reviews)
    preparer = Preparer(
        p.store, p.workspace, p.gitea, outbox, moves, prompts, dispatcher, environments
    )
    turns = build_turns(p, runtime, replies, moves, prompts, verifier, tracker)
    execution = Execution(dispatcher, preparer, turns, verifier, p.workspace, publisher)
    return Scheduler(
        p.store,
        execution,
        dispatcher,
        outbox,
        p.wakeup,
        node_prefix=f"{p.worker_id}/",
        retry=p.retry,
        poll_seconds=s.poll_seconds,
    )


def _replies(p: Process) -> Replies:
    return Replies(
        p.store,
        p.gitea,
        p.settings.bot_login,
        workers_ttl=timedelta(seconds=p.settings.lease_ttl_seconds),
        public_url=p.settings.public_url,
        threads=p.threads,
    )


def _prompts(p: Process, moves: TaskMoves) -> Prompts:
    """Every prompt and its context, with the conversation's images."""
    images = ConversationImages(p.store, p.gitea, moves, p.settings.image_bounds())
    return Prompts(
        p.store,
        p.workspace,
        p.gitea,
        moves,
        bot_login=p.settings.bot_login,
        threads=p.threads,
        images=images,
    )


def build_turns(
    p: Process,
    runtime: AgentRuntime,
    replies: Replies,
    moves: TaskMoves,
    prompts: Prompts,
    verifier: Verifier,
    tracker: Tracker,
) -> TurnRunner:
    """The runner of a task's turn: its follower (abort watch, budgets, receipt) and
    the prompts of a pull request review."""
    s = p.settings
    follower = TurnFollower(
        p.store,
        runtime,
        AbortWatch(p.store),
        abort_timeout=s.abort_timeout_seconds,
        budgets=s.budgets(),
        tracker=tracker,
    )
    limits = ReviewLimits(s.review_diff_bytes, s.review_skipped())
    return TurnRunner(
        p.store,
        runtime,
        replies,
        moves,
        prompts,
        verifier,
        follower,
        workspace_root=str(s.resolved_workspace_root),
        review_prompts=ReviewPrompts(p.gitea, limits, store=p.store, mirror=p.workspace),
    )
