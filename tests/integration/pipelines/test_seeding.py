"""Seeding the built-in templates on a real store (SQLite and PostgreSQL): first start,
reseeds that keep the user's choices, a shipped change, two processes at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Connection

from forgeflow.domain.pipeline_records import PipelineTemplate, PipelineTrigger
from forgeflow.pipelines import templates
from forgeflow.pipelines.definition import Loaded, TriggerSpec, load_definition
from forgeflow.pipelines.runs import PipelineError
from forgeflow.pipelines.seeds import (
    SHIPPED_DISABLED,
    SHIPPED_ENABLED,
    load_builtins,
    seed_builtins,
    seed_template,
)
from forgeflow.store import Store
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q
from tests.integration.pipelines.harness import run_async

Row = dict[str, Any]


def _triggers(store: Store, key: str) -> dict[tuple[str, str], PipelineTrigger]:
    rows = store.db.read_sync(lambda c: tpl.list_triggers(c, key))
    return {(r.trigger_type, r.event_type): r for r in rows}


def _definition(store: Store, key: str) -> PipelineTemplate:
    row = store.db.read_sync(lambda c: tpl.get_definition(c, key))
    assert row is not None
    return row


def _shipped(key: str) -> Loaded:
    return next(x for x in load_builtins() if x.definition.key == key)


def test_first_start_seeds_thirteen_with_their_switches(store: Store) -> None:
    outcomes = run_async(lambda: seed_builtins(store))
    assert set(outcomes.values()) == {"created"} and len(outcomes) == 13
    rows = {r.key: r for r in store.db.read_sync(tpl.list_definitions)}
    assert {k for k, r in rows.items() if not r.is_enabled} == SHIPPED_DISABLED
    assert {k for k, r in rows.items() if r.is_enabled} == SHIPPED_ENABLED
    assert all(r.built_in and r.version == 1 for r in rows.values())
    every = store.db.read_sync(tpl.list_triggers)
    schedules = {r.template_key: r.is_enabled for r in every if r.trigger_type == "schedule"}
    assert schedules == {"pr_merged_cleanup": True, "dep_audit": False, "pr_digest": False}
    assert all(r.is_enabled for r in every if r.trigger_type != "schedule")
    # The spec's surprise: a disabled template's triggers are on; the template refuses.
    assert _triggers(store, "pr_triage")[("event", "PullRequestPublished")].is_enabled
    with pytest.raises(PipelineError) as refused:
        store.db.write_sync(lambda c: templates.start(c, "pr_triage", trigger_type="manual"))
    assert refused.value.code == "template_disabled"

    assert set(run_async(lambda: seed_builtins(store)).values()) == {"unchanged"}
    assert _definition(store, "pr_review").revision == 1


def test_a_reseed_keeps_the_users_switches_and_triggers(store: Store) -> None:
    run_async(lambda: seed_builtins(store))
    cleanup_schedule = _triggers(store, "pr_merged_cleanup")[("schedule", "")]
    triage = _triggers(store, "pr_triage")
    digest_schedule = _triggers(store, "pr_digest")[("schedule", "")]

    def choose(conn: Connection) -> None:
        templates.set_enabled(conn, "pr_review", False, actor="admin")
        templates.set_enabled(conn, "pr_triage", True, actor="admin")
        tpl.update_trigger(
            conn, triage[("event", "PullRequestPublished")].trigger_id, is_enabled=False
        )
        tpl.delete_trigger(conn, triage[("manual", "")].trigger_id)
        tpl.update_trigger(conn, digest_schedule.trigger_id, is_enabled=True)
        tpl.update_trigger(conn, cleanup_schedule.trigger_id, is_enabled=False)

    store.db.write_sync(choose)
    outcomes = run_async(lambda: seed_builtins(store))
    assert set(outcomes.values()) == {"unchanged"}
    assert _definition(store, "pr_review").is_enabled is False
    assert _definition(store, "pr_triage").is_enabled is True
    after = _triggers(store, "pr_triage")
    assert after[("event", "PullRequestPublished")].is_enabled is False
    assert ("manual", "") not in after, "a row the user removed is not resurrected"
    assert _triggers(store, "pr_digest")[("schedule", "")].is_enabled is True
    # Garbage collection is not a user's choice: forced back on, same row.
    forced = _triggers(store, "pr_merged_cleanup")[("schedule", "")]
    assert forced.is_enabled is True and forced.trigger_id == cleanup_schedule.trigger_id
    store.db.write_sync(lambda c: tpl.delete_trigger(c, forced.trigger_id))
    run_async(lambda: seed_builtins(store))
    assert _triggers(store, "pr_merged_cleanup")[("schedule", "")].is_enabled is True


def test_a_shipped_change_bumps_the_version_and_runs_keep_theirs(store: Store) -> None:
    run_async(lambda: seed_builtins(store))
    inputs = {"repo": "acme/widget", "number": 3}
    run = store.db.write_sync(
        lambda c: templates.start(c, "pr_review", trigger_type="manual", inputs=inputs)
    ).run
    assert run.definition_version == 1
    store.db.write_sync(lambda c: templates.set_enabled(c, "pr_review", False, actor="admin"))

    shipped = _shipped("pr_review").definition
    changed = shipped.model_copy(
        update={
            "description": "a new text",
            "triggers": [*shipped.triggers, TriggerSpec(type="event", eventType="PrMerged")],
        }
    )
    assert store.db.write_sync(lambda c: seed_template(c, Loaded(changed, []))) == "updated"
    row = _definition(store, "pr_review")
    assert (row.version, row.is_enabled) == (2, False)
    assert row.definition["description"] == "a new text"
    assert row.definition["enabled"] is False
    assert set(_triggers(store, "pr_review")) == {("manual", ""), ("event", "PrMerged")}
    kept = store.db.read_sync(lambda c: q.get_run(c, run.run_id))
    assert kept is not None and kept.definition_version == 1
    assert kept.definition["description"] != "a new text"

    # Shipping the original text again is one more version, and drops the trigger.
    assert store.db.write_sync(lambda c: seed_template(c, _shipped("pr_review"))) == "updated"
    assert _definition(store, "pr_review").version == 3
    assert set(_triggers(store, "pr_review")) == {("manual", "")}


def test_a_users_own_template_of_a_builtin_key_is_left_alone(store: Store) -> None:
    mine = load_definition(
        {
            "key": "pr_digest",
            "name": "My digest",
            "enabled": True,
            "nodes": [{"id": "t", "kind": "trigger"}, {"id": "end", "kind": "terminal"}],
            "edges": [{"from": "t", "to": "end"}],
            "triggers": [{"type": "manual"}],
        }
    )
    store.db.write_sync(lambda c: templates.create(c, mine, actor="admin"))
    outcomes = run_async(lambda: seed_builtins(store))
    assert outcomes["pr_digest"] == "skipped"
    row = _definition(store, "pr_digest")
    assert (row.name, row.built_in, row.is_enabled) == ("My digest", False, True)


@pytest.mark.postgres
def test_two_processes_seeding_at_once_on_postgresql(pg_url: str) -> None:
    stores = [Store(pg_url) for _ in range(3)]
    try:

        async def together() -> list[dict[str, str]]:
            return list(await asyncio.gather(*(seed_builtins(s) for s in stores)))

        results = run_async(together)
        for key in results[0]:
            outcomes = sorted(r[key] for r in results)
            assert outcomes == ["created", "unchanged", "unchanged"], (key, outcomes)
        rows = stores[0].db.read_sync(tpl.list_definitions)
        assert len(rows) == 13 and {r.revision for r in rows} == {1}
        triggers = stores[0].db.read_sync(tpl.list_triggers)
        idents = [(r.template_key, r.trigger_type, r.event_type) for r in triggers]
        assert len(idents) == len(set(idents))
        assert len(idents) == sum(len(x.definition.triggers) for x in load_builtins())
    finally:
        for s in stores:
            s.close()
