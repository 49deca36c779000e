"""The delivery log of pipeline webhook triggers, as units of work: every call of
``POST /webhooks/{token}`` that names a trigger is recorded as ``accepted`` (it
started a run), ``duplicate`` (a repeated call: the first call's run) or ``refused``
(with the reason code), and an accepted one can be replayed as a new run.

What a row never holds: the signature, the token, or any part of a refused call's body
(not even its hash). An accepted call's body is kept, redacted, when it is at most
:data:`BODY_KEPT` bytes, so it can be replayed; a larger one is logged without it.
Rows expire after ``delivery_retention_days`` (the setting of Gitea's deliveries) and
are pruned, a batch at a time, by the calls that follow.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import ArmedTrigger, HookCall, HookDelivery
from forgeflow.pipelines import firing, templates, views
from forgeflow.pipelines.runs import PipelineError, Started
from forgeflow.redaction import redact
from forgeflow.store import audit
from forgeflow.store import hook_deliveries as dq
from forgeflow.store import pipelines as q
from forgeflow.store import triggers as tq
from forgeflow.store.types import iso, utcnow

BODY_KEPT = 256 * 1024
Status = Literal["accepted", "duplicate", "refused"]
STATUSES: tuple[Status, ...] = ("accepted", "duplicate", "refused")


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a trigger as the endpoint saw it (never its signature or token)."""

    trigger: ArmedTrigger
    retention: timedelta
    body_bytes: int
    call_key: str | None = None
    # A verified call's content digest, and how long an accepted one blocks its replay.
    body_digest: str | None = None
    replay_window: timedelta = timedelta(days=1)


def record(
    conn: Connection,
    call: Call,
    status: Status,
    response_code: int,
    *,
    reason: str | None = None,
    run_id: str | None = None,
    body: JsonObject | None = None,
) -> str:
    """Log one call (pruning expired rows first); returns the delivery id."""
    now = utcnow()
    dq.prune(conn, now)
    kept = body if status == "accepted" and call.body_bytes <= BODY_KEPT else None
    return dq.insert_delivery(
        conn,
        {
            "trigger_id": call.trigger.trigger_id,
            "template_key": call.trigger.template_key,
            "status": status,
            "reason": reason,
            "response_code": response_code,
            "call_key": call.call_key[:300] if call.call_key else None,
            "body_digest": call.body_digest if status == "accepted" else None,
            "run_id": run_id,
            "body": redact(kept) if kept is not None else None,
            "body_bytes": call.body_bytes,
        },
        expires_at=now + call.retention,
    )


def fire(conn: Connection, call: Call, payload: JsonObject) -> tuple[Started, str]:
    """Start the run of a verified call and log it in the same transaction; raises
    :class:`PipelineError` as :func:`firing.fire_webhook` does (the caller logs the
    refusal in a transaction of its own, since this one rolls back)."""
    assert call.call_key is not None
    trigger_id = call.trigger.trigger_id
    # A repeat of the same delivery is the usual duplicate; only a new identity with
    # already-accepted content is a replay.
    known = q.run_by_dedupe(conn, firing.webhook_dedupe_key(trigger_id, call.call_key))
    replayed = None if known is not None else _replayed_body(conn, call)
    if replayed is not None:
        delivery_id = record(
            conn, call, "duplicate", 200, reason="replayed_body", run_id=replayed.run.run_id
        )
        return replayed, delivery_id
    started = firing.fire_webhook(conn, trigger_id, payload, call.call_key)
    status: Status = "accepted" if started.created else "duplicate"
    delivery_id = record(
        conn,
        call,
        status,
        202 if started.created else 200,
        reason=None if started.created else "duplicate_delivery",
        run_id=started.run.run_id,
        body=payload,
    )
    return started, delivery_id


def _replayed_body(conn: Connection, call: Call) -> Started | None:
    """The run of an accepted call with the same signed content within the replay
    window: the same body and signature sent again under new delivery headers starts
    nothing (the headers are not signed, so anyone who saw one call could change them)."""
    if call.body_digest is None:
        return None
    since = utcnow() - call.replay_window
    earlier = dq.accepted_with_digest(conn, call.trigger.trigger_id, call.body_digest, since)
    run = q.get_run(conn, earlier) if earlier else None
    return Started(run, False) if run is not None else None


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:40]


def webhook_trigger(conn: Connection, trigger_id: str) -> ArmedTrigger:
    trigger = tq.get(conn, trigger_id)
    if trigger is None or trigger.trigger_type != "webhook":
        raise PipelineError("trigger_not_found", f"no webhook trigger {trigger_id}", status=404)
    return trigger


def get_delivery(conn: Connection, trigger_id: str, delivery_id: str) -> HookDelivery:
    row = dq.get(conn, trigger_id, delivery_id)
    if row is None:
        raise PipelineError(
            "delivery_not_found", f"trigger {trigger_id} has no delivery {delivery_id}", status=404
        )
    return row


def _replayable(
    conn: Connection, trigger_id: str, delivery_id: str
) -> tuple[HookDelivery, ArmedTrigger]:
    """The delivery and its trigger, if the delivery can be replayed now."""
    trigger = webhook_trigger(conn, trigger_id)
    row = get_delivery(conn, trigger_id, delivery_id)
    if row.status != "accepted":
        raise PipelineError(
            "delivery_not_replayable",
            f"delivery {delivery_id} was {row.status}: only an accepted one is replayed",
        )
    if row.body is None:
        raise PipelineError(
            "delivery_body_not_kept",
            f"delivery {delivery_id} was larger than {BODY_KEPT} bytes: its body was not kept",
        )
    if not trigger.is_enabled:
        raise PipelineError(
            "trigger_disabled", f"the webhook trigger of {trigger.template_key} is disabled"
        )
    return row, trigger


def replay(
    conn: Connection, trigger_id: str, delivery_id: str, *, actor: str, request_id: str
) -> Started:
    """Start a new run from an accepted delivery's body (audited
    ``pipeline.webhook.replay``); one run per ``request_id``."""
    row, trigger = _replayable(conn, trigger_id, delivery_id)
    key = trigger.template_key
    body = row.body
    assert body is not None  # _replayable refused a delivery whose body was not kept
    started = templates.start(
        conn,
        key,
        trigger_type="webhook",
        inputs=firing.inputs_from(conn, key, body),
        event=body,
        dedupe_key=f"replay:{delivery_id}:{_digest(request_id)}",
        actor=actor,
    )
    if started.created:
        audit.append(
            conn,
            audit.AuditEvent(
                action="pipeline.webhook.replay",
                actor=actor,
                metadata={
                    "templateKey": key,
                    "triggerId": trigger_id,
                    "deliveryId": delivery_id,
                    "runId": started.run.run_id,
                },
            ),
        )
    return started


def delivery_json(row: HookCall) -> JsonObject:
    """A call as the log answers it; a whole delivery's also carries its kept body."""
    out: JsonObject = {
        "deliveryId": row.delivery_id,
        "triggerId": row.trigger_id,
        "templateKey": row.template_key,
        "receivedAt": iso(row.received_at),
        "status": row.status,
        "reason": row.reason,
        "responseCode": row.response_code,
        "callKey": row.call_key,
        "runId": row.run_id,
        "bodyBytes": row.body_bytes,
        "replayable": row.status == "accepted" and row.body_bytes <= BODY_KEPT,
        "expiresAt": iso(row.expires_at),
    }
    if isinstance(row, HookDelivery):
        out["body"] = row.body
    return redact(out)  # type: ignore[no-any-return]


def _trigger_summary(trigger: ArmedTrigger) -> JsonObject:
    """The trigger a log belongs to, without its URL: the token is its secret."""
    out = {**views.trigger_json(trigger), "templateKey": trigger.template_key}
    out.pop("webhookPath", None)
    return out


def page_json(
    conn: Connection, trigger_id: str, status: str | None, limit: int, offset: int
) -> JsonObject:
    """A page of a webhook trigger's deliveries, newest first, with the trigger."""
    trigger = webhook_trigger(conn, trigger_id)
    rows, total = dq.page(conn, trigger_id, status, limit, offset)
    return {
        "trigger": _trigger_summary(trigger),
        "items": [delivery_json(r) for r in rows],
        "total": total,
        "limit": limit,
        "offset": offset,
        "nextOffset": offset + len(rows) if offset + len(rows) < total else None,
    }
