"""Triggers firing, as units of work: domain events, due schedules, webhook calls.

Each function takes the caller's ``Connection``; starting a run happens in the same
transaction as whatever consumes the cause (marking the event dispatched, moving the
schedule on), and every start carries a dedupe key derived from its cause — so even
if the consumption were lost and the cause handled again, the run starts once.

A trigger of a disabled template does not fire into nothing: the skip is audited
(``pipeline.trigger.skip``, error ``template_disabled``). A start that fails for
another reason (``invalid_inputs``, ``no_start_node``) is audited as
``pipeline.trigger.fail`` and the cause is consumed all the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import Connection

from forgeflow.domain.bookkeeping import StoredEvent
from forgeflow.domain.events import matches
from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import ArmedTrigger
from forgeflow.pipelines import templates
from forgeflow.pipelines.runs import PipelineError, Started
from forgeflow.pipelines.schedules import InvalidSchedule, next_fire
from forgeflow.store import audit, events
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q
from forgeflow.store import triggers as tq
from forgeflow.store.types import iso

log = structlog.get_logger("forgeflow.pipelines.triggers")


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:40]


@dataclass
class Fired:
    """What a unit of work did: runs it created, and causes it consumed."""

    runs: list[str] = field(default_factory=list)
    consumed: int = 0
    skipped: int = 0


def _audit(
    conn: Connection, action: str, trigger: ArmedTrigger, code: str, message: str, **meta: Any
) -> None:
    audit.append(
        conn,
        audit.AuditEvent(
            action=action,
            actor=f"trigger:{trigger.trigger_type}",
            error_code=code,
            metadata={
                "templateKey": trigger.template_key,
                "triggerId": trigger.trigger_id,
                "triggerType": trigger.trigger_type,
                "message": message,
                **meta,
            },
        ),
    )


def inputs_from(conn: Connection, template_key: str, source: JsonObject) -> JsonObject:
    """A triggered run's inputs: an ``inputs`` object in the event/body when it has one,
    else the top-level values named like the template's declared inputs."""
    given = source.get("inputs")
    if isinstance(given, dict):
        return given
    row = tpl.get_definition(conn, template_key)
    if row is None:
        return {}
    names = [i.name for i in templates.definition(row).inputs]
    return {name: source[name] for name in names if name in source}


def start(
    conn: Connection,
    trigger: ArmedTrigger,
    *,
    dedupe_key: str,
    event: JsonObject,
    event_type: str | None = None,
    fired: Fired,
    at: datetime | None = None,
    **meta: Any,
) -> Started | None:
    """Start one run for a trigger inside a savepoint; a refusal is audited, not raised."""
    key = trigger.template_key
    try:
        with conn.begin_nested():
            started = templates.start(
                conn,
                key,
                trigger_type=trigger.trigger_type,
                event_type=event_type,
                inputs=inputs_from(conn, key, event),
                event=event,
                dedupe_key=dedupe_key,
                actor=f"trigger:{trigger.trigger_id}",
            )
            tq.mark_fired(conn, trigger.trigger_id, at)
    except PipelineError as exc:
        action = (
            "pipeline.trigger.skip" if exc.code == "template_disabled" else "pipeline.trigger.fail"
        )
        _audit(conn, action, trigger, exc.code, exc.message, **meta)
        log.info(action, template_key=key, trigger_id=trigger.trigger_id, code=exc.code)
        fired.skipped += 1
        return None
    if started.created:
        fired.runs.append(str(started.run.run_id))
    return started


# -- domain events ------------------------------------------------------------------------


def event_of(row: StoredEvent) -> JsonObject:
    """What a run sees as ``event``: the payload, with ``repoKey`` from the event row
    when the payload has none, and the event's type and sequence number."""
    payload = dict(row.payload or {})
    if payload.get("repoKey") is None and row.repo_key is not None:
        payload["repoKey"] = row.repo_key
    payload.setdefault("eventType", row.event_type)
    payload.setdefault("eventSeq", row.seq)
    return payload


def dispatch_events(conn: Connection, limit: int = 100) -> Fired:
    """Claim the oldest undispatched events, start the runs of the enabled triggers that
    listen to each (``match`` filters on the payload), and mark them dispatched."""
    fired = Fired()
    rows = events.claim(conn, limit)
    if not rows:
        return fired
    listening: dict[str, list[ArmedTrigger]] = {}
    for t in tq.event_triggers(conn, {r.event_type for r in rows}):
        listening.setdefault(t.event_type, []).append(t)
    for row in rows:
        event = event_of(row)
        for trigger in listening.get(row.event_type, ()):
            if not matches(trigger.match, event):
                continue
            start(
                conn,
                trigger,
                # The template and the event's own dedupe key (unique per event).
                dedupe_key=f"event:{trigger.template_key}:{_digest(row.dedupe_key)}",
                event=event,
                event_type=row.event_type,
                fired=fired,
                eventType=row.event_type,
                eventSeq=row.seq,
            )
    events.mark_dispatched(conn, [r.seq for r in rows])
    fired.consumed = len(rows)
    return fired


def give_up_oldest(conn: Connection) -> list[int]:
    """Consume the oldest undispatched event without starting anything (audited): what
    the dispatcher does after its batch failed again and again."""
    rows = events.claim(conn, 1)
    for r in rows:
        audit.append(
            conn,
            audit.AuditEvent(
                action="pipeline.trigger.fail",
                error_code="dispatch_failed",
                repo_key=r.repo_key,
                metadata={"eventType": r.event_type, "eventSeq": r.seq},
            ),
        )
    seqs = [r.seq for r in rows]
    events.mark_dispatched(conn, seqs)
    return seqs


# -- schedules ------------------------------------------------------------------------------


def schedule_work(rows: list[ArmedTrigger], now: datetime) -> list[ArmedTrigger]:
    """The schedule rows a round must write: due, not yet planned, or disabled with a
    plan to forget. Read first so an idle round takes no write lock."""
    return [
        r
        for r in rows
        if (r.is_enabled and (r.next_fire_at is None or r.next_fire_at <= now))
        or (not r.is_enabled and r.next_fire_at is not None)
    ]


def fire_schedules(conn: Connection, seen: list[ArmedTrigger], now: datetime) -> Fired:
    """Plan, forget or fire the schedule rows ``seen`` (from :func:`schedule_work`); each
    change is a compare-and-swap on the ``next_fire_at`` that was read, so another
    process that got there first wins and this one does nothing."""
    fired = Fired()
    for row in seen:
        expected = row.next_fire_at
        if not row.is_enabled:
            tq.move_schedule(conn, row.trigger_id, expected=expected, next_at=None)
            continue
        try:
            following = next_fire(row.schedule or "", now=now, due=expected)
        except InvalidSchedule as exc:
            log.warning("pipeline.schedule_invalid", trigger_id=row.trigger_id, error=str(exc))
            continue
        if expected is None:
            tq.move_schedule(conn, row.trigger_id, expected=None, next_at=following)
            continue
        if not tq.move_schedule(
            conn, row.trigger_id, expected=expected, next_at=following, fired_at=now
        ):
            continue
        due = iso(expected)
        start(
            conn,
            row,
            dedupe_key=f"schedule:{row.trigger_id}:{due}",
            event={"schedule": row.schedule, "dueAt": due, "firedAt": iso(now)},
            fired=fired,
            at=now,
            dueAt=due,
        )
        fired.consumed += 1
    return fired


# -- webhooks ----------------------------------------------------------------------------------


def webhook_dedupe_key(trigger_id: str, delivery: str) -> str:
    return f"webhook:{trigger_id}:{_digest(delivery)}"


def fire_webhook(conn: Connection, trigger_id: str, body: JsonObject, delivery: str) -> Started:
    """Start the run of a verified webhook call; a repeated ``delivery`` returns the
    first run. Raises :class:`PipelineError` (``trigger_disabled``,
    ``template_disabled``, ``invalid_inputs``, …) — the caller answers with it."""
    dedupe_key = webhook_dedupe_key(trigger_id, delivery)
    existing = q.run_by_dedupe(conn, dedupe_key)
    if existing is not None:
        return Started(existing, False)
    trigger = tq.get(conn, trigger_id)
    if trigger is None:
        raise PipelineError("trigger_not_found", "the webhook trigger no longer exists", status=404)
    if not trigger.is_enabled:
        raise PipelineError(
            "trigger_disabled", f"the webhook trigger of {trigger.template_key} is disabled"
        )
    key = trigger.template_key
    started = templates.start(
        conn,
        key,
        trigger_type="webhook",
        inputs=inputs_from(conn, key, body),
        event=body,
        dedupe_key=dedupe_key,
        actor=f"trigger:{trigger_id}",
    )
    tq.mark_fired(conn, trigger_id)
    return started
