"""Bounded audit of requests refused at the door (bad signatures, wrong tokens, replays).

An outsider can send such requests as fast as the network allows; each one writing an
audit row would let them grow the database and wake every live page for free. So per
process, per (action, reason, source) and per interval, the first refusal is written at
once (``metadata.count`` 1) and the rest are only counted; the count of those is written
as one more row when the interval is over (at the next refusal or at shutdown). Values
taken from the request are cut to :data:`MAX_VALUE` characters. The rows carry the actor
:data:`ACTOR` and are deleted after ``rejection_retention_days``, so they are the one
kind of audit row that expires (docs/security.md "The HTTP surface").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import structlog
from sqlalchemy import Connection, delete, select

from forgeflow.domain.json import JsonObject
from forgeflow.store import Store, audit
from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.types import utcnow

log = structlog.get_logger("forgeflow.rejections")

ACTOR = "outsider"
MAX_VALUE = 120
# Distinct (action, reason, source) keys held at once; past it, new keys are counted in
# one overflow key, so an attacker rotating addresses cannot grow this map.
MAX_KEYS = 4096
PRUNE_BATCH = 500


def cut(value: str | None, limit: int = MAX_VALUE) -> str | None:
    """A request-supplied value, printable and at most ``limit`` characters."""
    if value is None:
        return None
    clean = "".join(c if c.isprintable() else "?" for c in value[: limit + 1])
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


@dataclass(slots=True)
class _Window:
    started: float
    count: int = 0
    delivery_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejection:
    action: str  # e.g. webhook.reject, api.auth.reject, ui.signin.reject
    reason: str  # the stable error code: invalid_signature, unauthorized, …
    source: str  # the client address, or a trigger id
    delivery_id: str | None = None
    repo_key: str | None = None


class RejectionLog:
    def __init__(self, store: Store, interval: float, retention_days: int) -> None:
        self._store = store
        self._interval = interval
        self._retention = timedelta(days=retention_days)
        self._open: dict[tuple[str, str, str], _Window] = {}
        self._last_prune = 0.0

    async def record(self, r: Rejection) -> None:
        """Count one refusal; writes at most one row now (never raises: the refusal's
        answer must not depend on its audit)."""
        now = time.monotonic()
        source = cut(r.source, 64) or "-"
        key = (r.action, r.reason, source)
        if key not in self._open and len(self._open) >= MAX_KEYS:
            key = (r.action, r.reason, "(many)")
        rows = [self._row(k, w) for k, w in self._due(now)]
        window = self._open.get(key)
        if window is None:
            # The first of its interval is written now; the rest are counted from here.
            self._open[key] = _Window(now, 0, cut(r.delivery_id))
            rows.append(self._event(key, 1, cut(r.delivery_id), r.repo_key))
        else:
            window.count += 1
        prune = now - self._last_prune >= self._interval
        if prune:
            self._last_prune = now
        if rows or prune:
            await self._write(rows, prune)

    async def flush(self) -> None:
        """Write every open count (at shutdown)."""
        rows = [self._row(k, w) for k, w in self._open.items() if w.count]
        self._open.clear()
        if rows:
            await self._write(rows, False)

    def _due(self, now: float) -> list[tuple[tuple[str, str, str], _Window]]:
        due = [(k, w) for k, w in self._open.items() if now - w.started >= self._interval]
        for k, _ in due:
            del self._open[k]
        return [(k, w) for k, w in due if w.count]

    def _row(self, key: tuple[str, str, str], w: _Window) -> audit.AuditEvent:
        return self._event(key, w.count, w.delivery_id, None, coalesced=True)

    def _event(
        self,
        key: tuple[str, str, str],
        count: int,
        delivery_id: str | None,
        repo_key: str | None,
        *,
        coalesced: bool = False,
    ) -> audit.AuditEvent:
        action, reason, source = key
        meta: JsonObject = {"source": source, "count": count}
        if coalesced:
            meta["intervalSeconds"] = self._interval
        return audit.AuditEvent(
            action=action,
            actor=ACTOR,
            error_code=reason,
            delivery_id=delivery_id,
            repo_key=repo_key,
            metadata=meta,
        )

    async def _write(self, rows: list[audit.AuditEvent], prune: bool) -> None:
        cutoff = utcnow() - self._retention

        def _apply(conn: Connection) -> None:
            for row in rows:
                audit.append(conn, row)
            if prune:
                old = (
                    select(audit_events.c.seq)
                    .where(audit_events.c.actor == ACTOR, audit_events.c.timestamp < cutoff)
                    .limit(PRUNE_BATCH)
                )
                seqs = [s for (s,) in conn.execute(old)]
                if seqs:
                    conn.execute(delete(audit_events).where(audit_events.c.seq.in_(seqs)))

        try:
            await self._store.write(_apply)
        except Exception:
            log.exception("rejections.audit_failed", rows=len(rows))
