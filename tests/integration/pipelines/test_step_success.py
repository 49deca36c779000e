"""A step's success (``steps.succeed_and_claim``) as one unit of work: what it claims,
how it drops the result of a step that moved on, on both drivers."""

from __future__ import annotations

from datetime import timedelta

from forgeflow.domain.pipeline_records import PipelineRun
from forgeflow.pipelines import steps, templates
from forgeflow.pipelines.definition import load_definition
from forgeflow.pipelines.registry import Done
from forgeflow.store import Store
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import StepKey
from forgeflow.store.types import utcnow
from tests.support.pipelines import dag_doc

TTL = timedelta(seconds=30)


def _chain(store: Store) -> tuple[str, steps.Claimed]:
    """A run of ``t > a > b > end`` (a writes ``out``) with its trigger claimed."""
    doc = dag_doc("t>a a>b b>end", a={"kind": "listen", "bodyKey": "x", "outputKey": "out"})
    loaded = load_definition(doc)
    store.db.write_sync(lambda c: templates.create(c, loaded, actor="test"))
    run = store.db.write_sync(lambda c: templates.start(c, "p", trigger_type="manual")).run
    trigger = store.db.read_sync(lambda c: q.get_step(c, StepKey(run.run_id, "t", -1)))
    assert trigger is not None and trigger.status == "runnable"
    claimed = store.db.write_sync(lambda c: steps.claim(c, trigger, owner="me", ttl=TTL))
    assert claimed is not None
    return run.run_id, claimed


def _succeed(
    store: Store, c: steps.Claimed, output: object
) -> tuple[PipelineRun | None, list[steps.Claimed], bool]:
    return store.db.write_sync(
        lambda conn: steps.succeed_and_claim(
            conn, c.step, Done(output), owner="me", ttl=TTL, limit=4
        )
    )


def test_a_success_claims_its_successor_in_the_same_transaction(store: Store) -> None:
    run_id, trigger = _chain(store)
    run, claimed, left = _succeed(store, trigger, None)
    assert run is not None and not left
    assert [c.step.step_id for c in claimed] == ["a"]
    a = claimed[0]
    assert (a.step.status, a.step.claimed_by, a.step.attempt) == ("running", "me", 1)
    assert a.step.lease_expires_at > utcnow()
    # The state is written (a has an outputKey) and the run row handed on is current.
    run, claimed, _ = _succeed(store, a, {"n": 1})
    stored = store.db.read_sync(lambda c: q.get_run(c, run_id))
    assert stored is not None and run is not None
    assert stored.state["out"] == {"n": 1} and stored.version == run.version
    assert [c.step.step_id for c in claimed] == ["b"]
    # The last step reaches the terminal through the full planner: the run ends.
    run, claimed, _ = _succeed(store, claimed[0], None)
    assert run is not None and run.status == "succeeded" and not claimed


def test_a_step_that_moved_on_is_dropped(store: Store) -> None:
    run_id, trigger = _chain(store)
    run, claimed, _ = _succeed(store, trigger, None)
    assert run is not None and [c.step.step_id for c in claimed] == ["a"]
    a = claimed[0]
    # The step moves on while its body runs (as a recovery does: the run does not).
    store.db.write_sync(lambda c: q.update_step(c, a.step, error_code="interrupted_by_restart"))
    before = store.db.read_sync(lambda c: q.get_run(c, run_id))
    run, claimed, _ = _succeed(store, a, {"n": 1})
    assert run is None and claimed == []
    after = store.db.read_sync(lambda c: q.get_run(c, run_id))
    assert after == before, "nothing of the dropped result was kept"


def test_a_limit_leaves_the_successor_runnable_for_the_claim_round(store: Store) -> None:
    run_id, trigger = _chain(store)
    run, claimed, left = store.db.write_sync(
        lambda conn: steps.succeed_and_claim(
            conn, trigger.step, Done(None), owner="me", ttl=TTL, limit=0
        )
    )
    assert run is not None and claimed == [] and left
    a = store.db.read_sync(lambda c: q.get_step(c, StepKey(run_id, "a", -1)))
    assert a is not None and (a.status, a.claimed_by) == ("runnable", None)


def test_the_commit_that_ends_a_run_is_announced_once(store: Store) -> None:
    run_id, trigger = _chain(store)
    seen: list[str] = []

    def on_run_ended() -> None:
        # Called after the commit: another connection already reads the run as ended.
        run = store.db.read_sync(lambda c: q.get_run(c, run_id))
        seen.append(run.status if run else "missing")

    unsubscribe = store.db.subscribe(q.RUN_ENDED, on_run_ended)
    try:
        _, claimed, _ = _succeed(store, trigger, None)
        _, claimed, _ = _succeed(store, claimed[0], {"n": 1})
        assert seen == [], "no run ended yet"
        _succeed(store, claimed[0], None)
    finally:
        unsubscribe()
    assert seen == ["succeeded"]
