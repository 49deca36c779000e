"""PipelineEngine: starts runs, claims due steps, runs their bodies, keeps them alive.

One asyncio loop per process (started from ``Services.start``): it claims due steps
with compare-and-swap (``steps.claim``), runs each body in its own task, renews the
leases of the bodies it runs, recovers steps whose executor died, and fails steps
suspended for too long. Any number of processes may run it against one PostgreSQL
database: the database decides who runs what.

Everything a run does is recorded before and after it happens, so a run survives a
restart: the engine reloads unfinished runs from the store and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from datetime import timedelta
from functools import partial

import structlog

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep
from forgeflow.pipelines import execution, recovery, runs, snapshots, steps, templates
from forgeflow.pipelines.definition import NodeSpec
from forgeflow.pipelines.kinds import NODE_ROW, TERMINAL_RUN_STATUSES, RunStatus
from forgeflow.pipelines.ports import (
    AgentDispatchPort,
    ChildRun,
    GiteaPort,
    Ports,
    ReviewPort,
    WorkspacePort,
)
from forgeflow.pipelines.registry import (
    Done,
    PipelineBodyRegistry,
    StepFailed,
    Suspend,
)
from forgeflow.pipelines.runs import Parent, Started
from forgeflow.redaction import redact_text
from forgeflow.store import Store
from forgeflow.store import pipeline_recovery as qr
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import StepKey
from forgeflow.store.types import utcnow

log = structlog.get_logger("forgeflow.pipelines")


class PipelineEngine:
    def __init__(
        self,
        store: Store,
        registry: PipelineBodyRegistry,
        *,
        owner: str,
        node_prefix: str,
        workspace: WorkspacePort,
        agent: AgentDispatchPort | None = None,
        gitea: GiteaPort | None = None,
        reviews: ReviewPort | None = None,
        lease_ttl: float = 30.0,
        poll_seconds: float = 5.0,
        max_parallel: int = 64,
    ) -> None:
        self.store = store
        self.registry = registry
        self.owner = owner
        self.node_prefix = node_prefix
        self.lease_ttl = timedelta(seconds=lease_ttl)
        self.poll_seconds = poll_seconds
        self.max_parallel = max_parallel
        self.ports = Ports(
            runs=self, workspace=workspace, agent=agent, gitea=gitea, reviews=reviews
        )
        self._tasks: dict[StepKey, asyncio.Task[None]] = {}
        # The bodies running now; only these are cancelled when a lease is lost, never
        # the recording of a result (its write may already be committing, with claims).
        self._bodies: dict[StepKey, asyncio.Task[Done | Suspend | execution.Failed]] = {}
        self._lost: set[StepKey] = set()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._started = False

    # -- operations (units of work, then a wake-up) -----------------------------------

    async def start(
        self,
        template_key: str,
        *,
        trigger_type: str = "manual",
        event_type: str | None = None,
        inputs: JsonObject | None = None,
        event: JsonObject | None = None,
        dedupe_key: str | None = None,
        actor: str = "system",
    ) -> Started:
        """Start a run; raises :class:`PipelineError` (``template_disabled``, …)."""
        started = await self.store.write(
            partial(
                templates.start,
                key=template_key,
                trigger_type=trigger_type,
                event_type=event_type,
                inputs=inputs,
                event=event,
                dedupe_key=dedupe_key,
                actor=actor,
            )
        )
        self.wake()
        return started

    async def cancel(
        self, run_id: str, *, actor: str = "system", reason: str | None = None
    ) -> PipelineRun:
        run = await self.store.write(
            partial(runs.cancel_run, run_id=run_id, actor=actor, reason=reason)
        )
        await self._after(run)
        return run

    async def decide(
        self,
        run_id: str,
        step_id: str,
        *,
        approve: bool,
        actor: str = "system",
        reason: str | None = None,
        item_index: int = NODE_ROW,
    ) -> tuple[int, JsonObject]:
        result = await self.store.write(
            partial(
                steps.decide,
                run_id=run_id,
                step_id=step_id,
                item_index=item_index,
                approve=approve,
                actor=actor,
                reason=reason,
            )
        )
        run = await self.store.read(lambda c: q.get_run(c, run_id))
        await self._after(run)
        return result

    # -- RunsPort: pipelines starting pipelines -------------------------------------

    async def start_child(
        self,
        template_key: str,
        *,
        parent_run_id: str,
        parent_step_id: str,
        parent_item_index: int,
        inputs: JsonObject,
        dedupe_key: str,
    ) -> str:
        run_id = await self.store.write(
            partial(
                templates.start_child,
                key=template_key,
                parent=Parent(parent_run_id, parent_step_id, parent_item_index),
                inputs=inputs,
                dedupe_key=dedupe_key,
            )
        )
        self.wake()
        return run_id

    async def child(self, run_id: str) -> ChildRun:
        row = await self.store.read(lambda c: q.get_run(c, run_id))
        if row is None:
            raise StepFailed("child_run_missing", f"child run {run_id} does not exist")
        return ChildRun(row.run_id, row.status, row.state, row.error)

    # -- the loop -----------------------------------------------------------------------

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def start_loop(self) -> None:
        """Start the loop; its first round takes back what a dead predecessor of this
        node left running (retried each round until it succeeds, so a database that is
        briefly unavailable never stops the process from starting)."""
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._loop(), name="pipelines.loop")

    async def stop(self) -> None:
        """Stop claiming; bodies still running are left to recovery on the next start."""
        self._stopping = True
        pending = [t for t in (self._loop_task, *self._tasks.values()) if t is not None]
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _loop(self) -> None:
        housekeeping = min(self.poll_seconds, self.lease_ttl.total_seconds() / 3)
        last = 0.0
        while not self._stopping:
            due = None
            try:
                if time.monotonic() - last >= housekeeping:
                    last = time.monotonic()
                    await self._housekeeping()
                await self._claim_round()
                due = await self.store.read(q.next_due)
            except Exception:
                log.exception("pipeline.round_failed")
            delay = min(self.poll_seconds, housekeeping)
            if due is not None:
                delay = min(delay, max((due - utcnow()).total_seconds(), 0.01))
            assert self._wake is not None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.clear()

    async def _housekeeping(self) -> None:
        keys = sorted(self._tasks, key=lambda k: (k.run_id, k.step_id, k.item_index))
        if keys:
            until = utcnow() + self.lease_ttl
            held = await self.store.write(lambda c: qr.renew_leases(c, self.owner, keys, until))
            for key in keys:
                body = self._bodies.get(key)
                if key not in held and body is not None:
                    # Cancelled, decided or recovered elsewhere: the result would be dropped.
                    self._lost.add(key)
                    body.cancel()
        await self._recover(startup=not self._started)
        self._started = True
        for seen in await self.store.read(lambda c: recovery.overdue(c, utcnow())):
            await self._after(await self.store.write(partial(recovery.expire, seen=seen)))
        for child in await self.store.read(lambda c: qr.children_done_unseen(c, utcnow())):
            await self._after(child)  # wakes the step still waiting for it

    async def _recover(self, *, startup: bool) -> None:
        # Read first (on SQLite every write transaction takes the one write lock), then
        # one transaction per step, so each locks only its own run.
        now = utcnow()
        for seen in await self.store.read(qr.claimed_steps):
            if not recovery.abandoned(
                seen,
                owner=self.owner,
                node_prefix=self.node_prefix,
                startup=startup,
                now=now,
                executing=frozenset(self._tasks),
            ):
                continue
            run = await self.store.write(partial(recovery.recover, seen=seen))
            if run is not None:
                log.info("pipeline.recover", run_id=run.run_id, step_id=seen.step_id)
            await self._after(run)

    async def _claim_round(self) -> None:
        for seen in await self.store.read(lambda c: q.due_steps(c, utcnow())):
            if len(self._tasks) >= self.max_parallel or self._stopping:
                return
            key = StepKey.of(seen)
            if key in self._tasks:
                continue
            claimed = await self.store.write(
                partial(steps.claim, seen=seen, owner=self.owner, ttl=self.lease_ttl)
            )
            if claimed is not None:
                self._launch(claimed)

    def _launch(self, claimed: steps.Claimed) -> None:
        key = StepKey.of(claimed.step)
        self._tasks[key] = asyncio.create_task(
            self._run(claimed.step, claimed.run), name=f"step {key.run_id}/{key.step_id}"
        )

    async def _run(self, step: PipelineStep, run: PipelineRun) -> None:
        key = StepKey.of(step)
        wake = False
        try:
            await self._execute(step, run)
        except asyncio.CancelledError:
            if not self._stopping and key not in self._lost:
                raise
        except Exception:
            wake = True
            log.exception("pipeline.step_crashed", run_id=key.run_id, step_id=key.step_id)
        finally:
            # Every outcome of _execute wakes the loop when it has something to do; a
            # freed slot only matters when this engine was at its limit.
            full = len(self._tasks) >= self.max_parallel
            self._tasks.pop(key, None)
            self._lost.discard(key)
            if wake or full:
                self.wake()

    # -- one execution ------------------------------------------------------------------

    async def _execute(self, step: PipelineStep, run: PipelineRun) -> None:
        node = snapshots.definition_of(run).node(step.step_id)
        prepared = execution.prepare(run, node, step, self.registry, self.ports)
        if isinstance(prepared, execution.Failed):
            await self._fail(step, node, prepared)
            return
        inputs = prepared.ctx.inputs
        key = StepKey.of(step)
        body = self._bodies[key] = asyncio.ensure_future(execution.call(prepared))
        try:
            outcome = await body
        finally:
            self._bodies.pop(key, None)
        if isinstance(outcome, execution.Failed):
            await self._fail(step, node, outcome, inputs=inputs)
        elif isinstance(outcome, Suspend):
            await self.store.write(
                partial(steps.suspend, seen=step, s=outcome, input_snapshot=inputs)
            )
            self.wake()  # the loop's next sleep must end by the step's wake-up time
        else:
            await self._succeed(step, outcome, inputs)

    async def _succeed(self, step: PipelineStep, done: Done, inputs: Mapping[str, object]) -> None:
        # What this success made runnable is claimed in the same transaction and
        # started here; the loop is only woken when something is left for its round.
        limit = 0 if self._stopping else self.max_parallel - len(self._tasks)
        after, claimed, left = await self.store.write(
            partial(
                steps.succeed_and_claim,
                seen=step,
                done=done,
                input_snapshot=inputs,
                owner=self.owner,
                ttl=self.lease_ttl,
                limit=limit,
            )
        )
        for c in claimed:
            self._launch(c)
        await self._after(after, wake=left or not claimed)

    async def _fail(
        self,
        step: PipelineStep,
        node: NodeSpec,
        failed: execution.Failed,
        *,
        inputs: Mapping[str, object] | None = None,
    ) -> None:
        retry_at = None
        # Counted from the run's last retry (pipelines.retry), which keeps attempt numbers.
        tried = step.attempt - step.retry_base
        if failed.retryable and node.retry is not None and tried < node.attempts:
            retry_at = utcnow() + timedelta(seconds=node.retry.delay(tried))
        log.info(
            "pipeline.step_failed",
            run_id=step.run_id,
            step_id=step.step_id,
            code=failed.code,
            attempt=step.attempt,
            retry=retry_at is not None,
        )
        after = await self.store.write(
            partial(
                steps.fail,
                seen=step,
                code=failed.code,
                error=redact_text(failed.message)[:4000],
                retry_at=retry_at,
                input_snapshot=inputs,
            )
        )
        await self._after(after)

    async def _after(self, run: PipelineRun | None, *, wake: bool = True) -> None:
        """Wake the loop; a finished child run wakes the step waiting for it."""
        if run is not None and run.parent_run_id and RunStatus(run.status) in TERMINAL_RUN_STATUSES:
            await self.store.write(lambda c: runs.wake_parent(c, run))
            wake = True
        if wake:
            self.wake()
