"""The scheduler's dispatcher, which the runs and the outbox share: claims, busy
repositories, the tasks being prepared and their places, the wake-up."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from forgeflow.domain.records import Task
from forgeflow.store import Store
from forgeflow.store.scheduling import Claim
from forgeflow.tasks.dispatch import Dispatcher, Wakeup


def _claim(task_id: str, repo: str, state: str, lease: str | None = "l") -> Claim:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    task = Task(
        **{f.name: None for f in dataclasses.fields(Task)}
        | {"task_id": task_id, "repo_key": repo, "state": state, "created_at": at}
    )
    return Claim(task, lease)


@pytest.fixture
def bare_store(tmp_path: Path) -> Iterator[Store]:
    """What the dispatcher renews leases and claims with; these tests exercise its
    bookkeeping, which touches no table."""
    store = Store(f"sqlite:///{tmp_path / 'forgeflow.db'}")
    yield store
    store.close()


def _dispatcher(store: Store, limit: int = 2) -> Dispatcher:
    return Dispatcher(
        store,
        owner="w/1",
        lease_ttl=timedelta(seconds=30),
        worker_id="w",
        max_preparations=limit,
    )


def test_preparing_is_idle_only_when_nothing_is_prepared(bare_store: Store) -> None:
    async def scenario() -> None:
        d = _dispatcher(bare_store)
        assert d.idle.is_set()
        d.started([_claim("a", "r1", "preparing"), _claim("b", "r2", "preparing")])
        d.prepared("a")
        assert d.preparing("b") and not d.preparing("a") and not d.idle.is_set()
        d.prepared("b")
        assert d.idle.is_set()

    asyncio.run(scenario())


def test_claims_are_registered_at_once_and_started_in_order(bare_store: Store) -> None:
    async def scenario() -> list[str]:
        d = _dispatcher(bare_store)
        d.started([_claim("t1", "r1", "preparing"), _claim("t2", "r2", "running")])
        # Registered before any run started: a claim round must not claim them again.
        assert d.ids == {"t1", "t2"} and d.busy_repos == {"r1": "t1", "r2": "t2"}
        assert d.preparing("t1") and not d.preparing("t2")
        return [(await d.next_claim()).task.task_id for _ in range(2)]

    assert asyncio.run(scenario()) == ["t1", "t2"]


def test_a_run_frees_only_the_repository_it_holds(bare_store: Store) -> None:
    async def scenario() -> None:
        d = _dispatcher(bare_store)
        d.started([_claim("t1", "r1", "preparing")])
        # t1 gave its lease back and t2 was claimed in the same transaction.
        d.started([_claim("t2", "r1", "preparing")])
        d.ended("t1", "r1")  # t1's verification ended after the handoff
        assert d.busy_repos == {"r1": "t2"} and d.ids == {"t2"}
        assert not d.idle.is_set()
        d.ended("t2", "r1")
        assert d.busy_repos == {} and d.idle.is_set()

    asyncio.run(scenario())


def test_the_handoff_claims_only_for_repositories_with_waiting_tasks(bare_store: Store) -> None:
    d = _dispatcher(bare_store)
    assert d.claimer("r1", "t1") is None  # nobody was seen waiting: no query
    d.waiting_repos = frozenset({"r1"})
    assert d.claimer("r1", "t1") is not None
    d.stopping = True
    assert d.claimer("r1", "t1") is None


def test_a_wakeup_ends_the_sleep_early_and_is_then_forgotten() -> None:
    async def scenario() -> tuple[float, float]:
        wakeup = Wakeup()
        loop = asyncio.get_running_loop()
        wakeup.set()
        start = loop.time()
        await wakeup.sleep(5.0)
        woken = loop.time() - start
        start = loop.time()
        await wakeup.sleep(0.05)  # the nudge was used up: this one sleeps its time
        return woken, loop.time() - start

    woken, slept = asyncio.run(scenario())
    assert woken < 1.0 and slept >= 0.04


def test_preparations_beyond_the_limit_wait_for_a_place_in_order(bare_store: Store) -> None:
    async def scenario() -> tuple[list[str], list[tuple[int, int]]]:
        preparing = _dispatcher(bare_store, limit=2)
        order: list[str] = []
        seen: list[tuple[int, int]] = []
        release = asyncio.Event()

        async def prepare(name: str) -> None:
            async with preparing.place():
                order.append(name)
                seen.append((preparing.working, preparing.waiting))
                await release.wait()

        runs = [asyncio.create_task(prepare(n)) for n in "abcde"]
        await asyncio.sleep(0.01)
        assert (preparing.working, preparing.waiting) == (2, 3)
        assert order == ["a", "b"]
        release.set()
        await asyncio.gather(*runs)
        assert (preparing.working, preparing.waiting) == (0, 0)
        return order, seen

    order, seen = asyncio.run(scenario())
    assert order == list("abcde")  # first come, first served
    assert max(working for working, _ in seen) == 2


def test_a_preparation_cancelled_while_waiting_gives_up_its_turn(bare_store: Store) -> None:
    async def scenario() -> tuple[int, int]:
        preparing = _dispatcher(bare_store, limit=1)
        hold = asyncio.Event()

        async def prepare() -> None:
            async with preparing.place():
                await hold.wait()

        first = asyncio.create_task(prepare())
        second = asyncio.create_task(prepare())
        await asyncio.sleep(0.01)
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert (preparing.working, preparing.waiting) == (1, 0)
        hold.set()
        await first
        async with preparing.place():  # the place is free again
            return preparing.working, preparing.waiting

    assert asyncio.run(scenario()) == (1, 0)
