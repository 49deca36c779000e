"""A PipelineEngine on a real store, with test bodies registered as ordinary functions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forgeflow.agent.oneshot import JailRunner
from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep
from forgeflow.pipelines import templates
from forgeflow.pipelines.adapters import LocalWorkspace
from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.definition import load_definition
from forgeflow.pipelines.engine import PipelineEngine
from forgeflow.pipelines.registry import PipelineBodyRegistry, StepContext, StepFailed
from forgeflow.store import Store
from forgeflow.store import pipelines as q

Row = PipelineRun
T = TypeVar("T")


@dataclass
class Harness:
    store: Store
    engine: PipelineEngine
    registry: PipelineBodyRegistry
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    attempts: list[tuple[str, int, float]] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)

    async def add(self, doc: dict[str, Any]) -> None:
        loaded = load_definition(doc, bodies=self.registry.keys())
        await self.store.write(lambda c: templates.create(c, loaded, actor="test"))

    async def start(self, key: str, **kw: Any) -> str:
        started = await self.engine.start(key, **kw)
        return str(started.run.run_id)

    async def run(self, key: str, timeout: float = 15.0, **kw: Any) -> Row:
        return await self.finished(await self.start(key, **kw), timeout)

    async def get(self, run_id: str) -> Row:
        row = await self.store.read(lambda c: q.get_run(c, run_id))
        assert row is not None
        return row

    async def wait(self, check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)
        raise AssertionError(f"{what or 'condition'} not met within {timeout}s")

    async def finished(self, run_id: str, timeout: float = 15.0) -> Row:
        async def _done() -> Row | None:
            row = await self.get(run_id)
            return row if row.status != "running" else None

        result: Row = await self.wait(_done, timeout, f"run {run_id} finished")
        return result

    async def steps(self, run_id: str) -> dict[str, PipelineStep]:
        """Rows by ``step`` (node rows) and ``step#i`` (forEach items)."""
        rows = await self.store.read(lambda c: q.steps_of(c, run_id))
        return {r.step_id + ("" if r.item_index < 0 else f"#{r.item_index}"): r for r in rows}

    async def step_status(self, run_id: str, step: str) -> str:
        return (await self.steps(run_id))[step].status


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a scenario on a fresh event loop in its own thread: the test's thread may
    already run a loop (Playwright's sync API leaves one behind)."""
    with ThreadPoolExecutor(1, thread_name_prefix="scenario") as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


def max_overlap(intervals: list[tuple[str, float, float]]) -> int:
    points = sorted([(s, 1) for _, s, _ in intervals] + [(e, -1) for _, _, e in intervals])
    best = now = 0
    for _, delta in points:
        now += delta
        best = max(best, now)
    return best


def _register_test_bodies(h: Harness) -> None:
    async def echo(ctx: StepContext) -> Any:
        return ctx.inputs.get("value", dict(ctx.inputs))

    async def record(ctx: StepContext) -> Any:
        name = ctx.step_id if ctx.item_index is None else f"{ctx.step_id}#{ctx.item_index}"
        start = time.monotonic()
        await asyncio.sleep(float(ctx.inputs.get("sleep", 0.1)))
        h.intervals.append((name, start, time.monotonic()))
        return ctx.inputs.get("value")

    async def flaky(ctx: StepContext) -> Any:
        h.attempts.append((ctx.step_id, ctx.attempt, time.monotonic()))
        if ctx.attempt <= int(ctx.inputs.get("fails", 0)):
            raise StepFailed("flaky", f"attempt {ctx.attempt} failed")
        return {"attempt": ctx.attempt}

    async def fail(ctx: StepContext) -> Any:
        raise RuntimeError(str(ctx.inputs.get("message", "boom")))

    async def block(ctx: StepContext) -> Any:
        try:
            await h.released.wait()
        except asyncio.CancelledError:
            h.cancelled.append(ctx.step_id)
            raise
        return "released"

    for key, body in (
        ("test.echo", echo),
        ("test.record", record),
        ("test.flaky", flaky),
        ("test.fail", fail),
        ("test.block", block),
    ):
        h.registry.register(key, body)


@asynccontextmanager
async def harness(
    store: Store, tmp_path: Path, *, owner: str = "node-a/1", **engine: Any
) -> AsyncIterator[Harness]:
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    workspace = LocalWorkspace(
        str(tmp_path / "workspaces"),
        str(tmp_path / "scratch"),
        jail_runner=JailRunner(tmp_path / "workspaces"),
        store=store,
    )
    pe = PipelineEngine(
        store,
        registry,
        owner=owner,
        node_prefix=owner.split("/")[0] + "/",
        workspace=workspace,
        poll_seconds=engine.pop("poll_seconds", 0.05),
        lease_ttl=engine.pop("lease_ttl", 3.0),
        **engine,
    )
    h = Harness(store, pe, registry)
    _register_test_bodies(h)
    await pe.start_loop()
    try:
        yield h
    finally:
        await pe.stop()
