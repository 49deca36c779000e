"""What the egress proxy refused in a task's turns (audit rows ``egress.blocked``, one
per turn, written by the runtime's event stream): summed for the task page and the
answer's line."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.store import audit

_SHOWN = 5  # targets the answer's line names; the task page shows all of them


@dataclass(frozen=True, slots=True)
class Refused:
    host: str
    port: int
    count: int


def refused(conn: Connection, task_id: str) -> list[Refused]:
    """A task's refused requests by (host, port), most frequent first."""
    rows = audit.query(conn, audit.AuditQuery(task_id=task_id, action="egress.blocked"))
    counts: dict[tuple[str, int], int] = {}
    for row in rows:
        for item in _requests(row.metadata):
            key = (str(item.get("host", ""))[:253], _int(item.get("port")))
            counts[key] = counts.get(key, 0) + _int(item.get("count"))
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [Refused(h, p, n) for (h, p), n in ordered]


def _requests(metadata: JsonObject) -> list[JsonObject]:
    items = metadata.get("requests")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _int(value: JsonValue) -> int:
    return value if isinstance(value, int) else 0


def note(found: list[Refused]) -> str | None:
    """The line added to the answer, beside the publish note; None when nothing."""
    if not found:
        return None
    names = ", ".join(f"`{r.host}:{r.port}` ×{r.count}" for r in found[:_SHOWN])
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return (
        f"forgeflow: the sandbox's network policy refused {names}{more} "
        "(an operator can allow a host: FORGEFLOW_EGRESS_ALLOW)."
    )
