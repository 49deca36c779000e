"""Triggers on SQLite and PostgreSQL: the domain-event dispatcher and the schedule clock.

Events are recorded with ``store.events.emit`` inside a real transaction, as the task
state machine, sessions and budgets do (their real producers are exercised end to end
in ``tests/acceptance/test_triggers.py``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, update

from forgeflow.domain.pipeline_records import ArmedTrigger, PipelineRun
from forgeflow.pipelines import firing, templates
from forgeflow.pipelines.definition import load_definition
from forgeflow.pipelines.schedules import InvalidSchedule, next_fire
from forgeflow.pipelines.triggers import TriggerLoops
from forgeflow.store import Store, audit, events
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q
from forgeflow.store import triggers as tq
from forgeflow.store.bookkeeping_schema import domain_events
from forgeflow.store.types import utcnow
from tests.integration.pipelines.harness import Harness, harness, run_async
from tests.support.pipelines import dag_doc

REPO = "default:acme/widget"


def _doc(key: str, *triggers: dict[str, Any], enabled: bool = True) -> dict[str, Any]:
    doc = dag_doc("t>a a>end", key=key, a={"kind": "listen", "bodyKey": "test.echo"})
    doc["enabled"] = enabled
    doc["triggers"] = list(triggers)
    return doc


def _add(store: Store, doc: dict[str, Any]) -> None:
    loaded = load_definition(doc)
    store.db.write_sync(lambda c: templates.create(c, loaded, actor="test"))


def _emit(store: Store, event_type: str, key: str, **payload: Any) -> None:
    store.db.write_sync(
        lambda c: events.emit(
            c, event_type, dedupe_key=key, payload={"repoKey": REPO, **payload}, repo_key=REPO
        )
    )


def _runs(store: Store, key: str) -> list[PipelineRun]:
    return store.db.read_sync(lambda c: q.list_runs(c, template_key=key, limit=200))[0]


def _undispatched(store: Store) -> int:
    return len(store.db.read_sync(lambda c: events.pending(c, 1000)))


def _audits(store: Store, action: str) -> list[dict[str, Any]]:
    found = store.db.read_sync(lambda c: audit.query(c, audit.AuditQuery(action=action, limit=100)))
    return [e.json() for e in found]


# -- dispatcher ---------------------------------------------------------------------------


def test_an_event_starts_one_run_per_listening_template_with_match(store: Store) -> None:
    _add(store, _doc("on_fail", {"type": "event", "eventType": "TaskFailed"}))
    _add(
        store,
        _doc(
            "on_fail_other_repo",
            {"type": "event", "eventType": "TaskFailed", "match": {"repoKey": "default:x/y"}},
        ),
    )
    _add(
        store,
        _doc(
            "on_fail_choice",
            {"type": "event", "eventType": "TaskFailed", "match": {"toState": ["failed", "x"]}},
        ),
    )
    _add(store, _doc("on_created", {"type": "event", "eventType": "TaskCreated"}))
    _emit(store, "TaskFailed", "task-1:5", taskId="task-1", toState="failed")

    fired = store.db.write_sync(firing.dispatch_events)
    assert fired.consumed == 1 and len(fired.runs) == 2
    (run,) = _runs(store, "on_fail")
    assert (run.trigger_type, run.event_type) == ("event", "TaskFailed")
    assert run.state["event"]["taskId"] == "task-1"
    assert run.state["event"]["repoKey"] == REPO
    assert len(_runs(store, "on_fail_choice")) == 1
    assert _runs(store, "on_fail_other_repo") == [] and _runs(store, "on_created") == []
    assert _undispatched(store) == 0
    fired_at = store.db.read_sync(lambda c: tpl.list_triggers(c, "on_fail"))[0].last_fired_at
    assert fired_at is not None


def test_a_redispatched_event_never_starts_a_second_run(store: Store) -> None:
    """The crash case: the runs committed but the event's dispatched mark was lost (or
    another dispatcher handled it again) — the run's dedupe key keeps it to one run."""
    _add(store, _doc("on_fail", {"type": "event", "eventType": "TaskFailed"}))
    _emit(store, "TaskFailed", "task-1:5", taskId="task-1")
    assert len(store.db.write_sync(firing.dispatch_events).runs) == 1

    def _lose_the_mark(conn: Connection) -> None:
        conn.execute(update(domain_events).values(dispatched_at=None))

    store.db.write_sync(_lose_the_mark)
    assert _undispatched(store) == 1
    again = store.db.write_sync(firing.dispatch_events)
    assert again.consumed == 1 and again.runs == []
    assert len(_runs(store, "on_fail")) == 1
    assert _undispatched(store) == 0
    # The same event emitted again (a retried transaction) is not even recorded twice.
    _emit(store, "TaskFailed", "task-1:5", taskId="task-1")
    assert _undispatched(store) == 0


def test_a_disabled_template_does_not_fire_and_the_skip_is_audited(store: Store) -> None:
    _add(store, _doc("off", {"type": "event", "eventType": "SessionClosed"}, enabled=False))
    _emit(store, "SessionClosed", "s:2", sessionKey="s")
    fired = store.db.write_sync(firing.dispatch_events)
    assert (fired.consumed, fired.runs, fired.skipped) == (1, [], 1)
    assert _runs(store, "off") == []
    (skip,) = _audits(store, "pipeline.trigger.skip")
    assert skip["errorCode"] == "template_disabled"
    assert skip["metadata"]["templateKey"] == "off"
    assert skip["metadata"]["eventType"] == "SessionClosed"


def test_a_disabled_trigger_does_not_fire(store: Store) -> None:
    _add(store, _doc("quiet", {"type": "event", "eventType": "RepoAdded", "enabled": False}))
    _emit(store, "RepoAdded", REPO)
    assert store.db.write_sync(firing.dispatch_events).runs == []
    assert _runs(store, "quiet") == [] and _undispatched(store) == 0


def test_a_start_that_fails_is_audited_and_the_event_consumed(store: Store) -> None:
    doc = _doc("needs", {"type": "event", "eventType": "TaskCreated"})
    doc["inputs"] = [{"name": "ticket", "type": "integer", "required": True}]
    _add(store, doc)
    _emit(store, "TaskCreated", "t:2", taskId="t")
    _emit(store, "TaskCreated", "u:2", taskId="u", ticket=7)  # named like the input
    fired = store.db.write_sync(firing.dispatch_events)
    assert (fired.consumed, len(fired.runs), fired.skipped) == (2, 1, 1)
    (run,) = _runs(store, "needs")
    assert run.inputs == {"ticket": 7}
    (fail,) = _audits(store, "pipeline.trigger.fail")
    assert fail["errorCode"] == "invalid_inputs"


def test_event_triggers_refuse_unknown_event_types() -> None:
    from forgeflow.pipelines.definition import DefinitionError

    with pytest.raises(DefinitionError, match="TicketCreated"):
        load_definition(_doc("x", {"type": "event", "eventType": "TicketCreated"}))


@pytest.fixture
def second_store(db_url: str) -> Iterator[Store]:
    """Another engine on the same database: what a second process would hold."""
    other = Store(db_url)
    yield other
    other.close()


def test_two_dispatchers_start_each_run_once(store: Store, second_store: Store) -> None:
    _add(store, _doc("on_status", {"type": "event", "eventType": "TaskStatusChanged"}))
    for i in range(60):
        _emit(store, "TaskStatusChanged", f"task-{i}:2", taskId=f"task-{i}")
    barrier = threading.Barrier(2)
    results: list[int] = []

    def _drain(s: Store) -> None:
        barrier.wait()
        while True:
            fired = s.db.write_sync(lambda c: firing.dispatch_events(c, limit=7))
            results.append(len(fired.runs))
            if fired.consumed == 0:
                return

    threads = [threading.Thread(target=_drain, args=(s,)) for s in (store, second_store)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(results) == 60
    runs = _runs(store, "on_status")
    assert len(runs) == 60
    assert len({r.state["event"]["taskId"] for r in runs}) == 60
    assert _undispatched(store) == 0


def test_the_dispatcher_wakes_when_an_event_commits(store: Store, tmp_path: Path) -> None:
    """Poll every hour: only the in-process wake-up can start the run within the wait."""
    _add(store, _doc("on_fail", {"type": "event", "eventType": "TaskFailed"}))

    async def scenario(h: Harness) -> None:
        loops = TriggerLoops(store, h.engine, poll_seconds=3600)
        await loops.start()
        try:
            await loops.dispatch_once()  # settle the first round
            began = utcnow()
            await store.write(
                lambda c: events.emit(c, "TaskFailed", dedupe_key="w:1", payload={}, repo_key=REPO)
            )

            async def _started() -> Any:
                return _runs(store, "on_fail")

            (run,) = await h.wait(_started, timeout=60, what="a run")
            assert run.created_at >= began  # started by this event, not an earlier round
            await h.finished(run.run_id)
        finally:
            await loops.stop()

    async def _main() -> None:
        async with harness(store, tmp_path) as h:
            await scenario(h)

    run_async(_main)


# -- schedules -----------------------------------------------------------------------------


def test_next_fire_of_intervals_and_cron() -> None:
    now = datetime(2024, 5, 1, 12, 0, 30, tzinfo=UTC)
    assert next_fire("every:60", now=now) == now + timedelta(seconds=60)
    due = now - timedelta(hours=3, seconds=10)  # missed 180 fires: one slot after now
    assert next_fire("every:60", now=now, due=due) == due + timedelta(seconds=60 * 181)
    assert next_fire("*/15 * * * *", now=now) == datetime(2024, 5, 1, 12, 15, tzinfo=UTC)
    assert next_fire("@daily", now=now) == datetime(2024, 5, 2, tzinfo=UTC)
    for bad in ("every:0", "every:x", "every:-5", "61 * * * *", "nonsense"):
        with pytest.raises(InvalidSchedule):
            next_fire(bad, now=now)
    with pytest.raises(Exception, match="schedule"):
        load_definition(_doc("x", {"type": "schedule", "schedule": "every:soon"}))


def _schedule(store: Store, key: str) -> ArmedTrigger:
    (row,) = [t for t in store.db.read_sync(tq.schedules) if t.template_key == key]
    return row


def _tick(store: Store, now: datetime) -> firing.Fired:
    work = firing.schedule_work(store.db.read_sync(tq.schedules), now)
    return store.db.write_sync(lambda c: firing.fire_schedules(c, work, now))


def _set_next(store: Store, key: str, at: datetime | None) -> None:
    row = _schedule(store, key)
    store.db.write_sync(lambda c: tpl.update_trigger(c, row.trigger_id, next_fire_at=at))


def test_missed_fires_after_downtime_fire_once(store: Store) -> None:
    _add(store, _doc("hourly", {"type": "schedule", "schedule": "every:60"}))
    now = utcnow()
    assert _tick(store, now).runs == []  # a new schedule is planned, not fired
    assert _schedule(store, "hourly").next_fire_at == now + timedelta(seconds=60)
    due = now - timedelta(hours=5)  # "the process was down for five hours"
    _set_next(store, "hourly", due)
    fired = _tick(store, now)
    assert len(fired.runs) == 1
    assert _tick(store, now).runs == [] and _tick(store, now + timedelta(seconds=1)).runs == []
    row = _schedule(store, "hourly")
    assert now < row.next_fire_at <= now + timedelta(seconds=60)
    assert row.last_fired_at == now
    (run,) = _runs(store, "hourly")
    assert run.trigger_type == "schedule"
    assert run.dedupe_key == f"schedule:{row.trigger_id}:{due.isoformat().replace('+00:00', 'Z')}"
    assert run.state["event"]["schedule"] == "every:60"


def test_a_disabled_schedule_or_template_does_not_fire(store: Store) -> None:
    _add(store, _doc("off_trigger", {"type": "schedule", "schedule": "every:5", "enabled": False}))
    _add(store, _doc("off_template", {"type": "schedule", "schedule": "every:5"}, enabled=False))
    now = utcnow()
    _tick(store, now)
    assert _schedule(store, "off_trigger").next_fire_at is None
    _set_next(store, "off_trigger", now - timedelta(seconds=1))  # stale plan: forgotten
    _set_next(store, "off_template", now - timedelta(seconds=1))
    fired = _tick(store, now)
    assert (fired.runs, fired.skipped) == ([], 1)
    assert _schedule(store, "off_trigger").next_fire_at is None
    assert _schedule(store, "off_template").next_fire_at > now  # moved on, skip audited
    (skip,) = _audits(store, "pipeline.trigger.skip")
    assert skip["metadata"]["templateKey"] == "off_template"
    assert _runs(store, "off_trigger") == [] and _runs(store, "off_template") == []


def test_two_processes_fire_a_due_schedule_once(store: Store, second_store: Store) -> None:
    _add(store, _doc("sweep", {"type": "schedule", "schedule": "every:30"}))
    now = utcnow()
    _tick(store, now)
    _set_next(store, "sweep", now - timedelta(seconds=1))
    seen = firing.schedule_work(store.db.read_sync(tq.schedules), now)
    barrier = threading.Barrier(2)
    fired: list[firing.Fired] = []

    def _fire(s: Store) -> None:
        barrier.wait()
        fired.append(s.db.write_sync(lambda c: firing.fire_schedules(c, seen, now)))

    threads = [threading.Thread(target=_fire, args=(s,)) for s in (store, second_store)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(len(f.runs) for f in fired) == [0, 1]
    assert len(_runs(store, "sweep")) == 1


def test_every_second_fires_from_the_running_loop(store: Store, tmp_path: Path) -> None:
    # The clock must wake at each next_fire_at, not at its poll: with an hour's poll,
    # three runs arrive only if the loop sleeps until the planned fire time.
    _add(store, _doc("tick", {"type": "schedule", "schedule": "every:1"}))

    async def _main() -> None:
        async with harness(store, tmp_path) as h:
            loops = TriggerLoops(store, h.engine, poll_seconds=3600)
            await loops.start()
            try:

                async def _three() -> bool:
                    return len(_runs(store, "tick")) >= 3

                await h.wait(_three, timeout=120, what="three scheduled runs")
            finally:
                await loops.stop()

    run_async(_main)
    runs = sorted(_runs(store, "tick"), key=lambda r: r.created_at)
    fires = [r.state["event"] for r in runs]
    due = [datetime.fromisoformat(f["dueAt"]) for f in fires]
    # Each run consumed a later slot of the one-second cadence, in the order they were
    # created, and none fired before its slot (a slow machine may skip slots, once each).
    assert all(f["schedule"] == "every:1" for f in fires)
    steps = [(b - a).total_seconds() for a, b in itertools.pairwise(due)]
    assert all(s >= 1 and s == int(s) for s in steps), steps
    assert all(datetime.fromisoformat(f["firedAt"]) >= d for f, d in zip(fires, due, strict=True))
    assert len({r.run_id for r in runs}) == len(runs)
