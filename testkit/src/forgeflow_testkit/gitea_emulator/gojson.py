"""JSON and time encoding the way Gitea's Go code writes them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

# Go's zero time.Time, as encoding/json writes it (Gitea omits nothing for struct times).
ZERO_TIME = "0001-01-01T00:00:00Z"
# timeutil.TimeStamp(0).AsTime(): the Unix epoch.
EPOCH_TIME = "1970-01-01T00:00:00Z"

# Gitea modules/json is encoding/json-compatible: HTML-sensitive characters and the two
# JavaScript line separators are written as \u escapes inside strings.
_GO_ESCAPES = (
    ("&", "\\u0026"),
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def go_json(value: Any, *, indent: bool = False) -> bytes:
    """Encode like Gitea: webhook payloads with MarshalIndent(p, "", "  ") (no trailing
    newline), API responses with json.NewEncoder (compact, trailing newline)."""
    if indent:
        # Gitea modules/structs/hook.go JSONPayload: json.MarshalIndent(p, "", "  ").
        text = json.dumps(value, ensure_ascii=False, indent=2)
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"
    for raw, escaped in _GO_ESCAPES:
        text = text.replace(raw, escaped)
    return text.encode("utf-8")


def utcnow() -> datetime:
    """Now, in UTC, truncated to seconds: Gitea stores timeutil.TimeStamp (Unix seconds)."""
    return datetime.now(UTC).replace(microsecond=0)


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Go writes a UTC time.Time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def opt_rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else rfc3339(moment)


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 query value (Gitea context.GetQueryBeforeSince uses time.RFC3339)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone offset")
    return parsed.astimezone(UTC)
