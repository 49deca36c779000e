"""The hidden marker that ends every comment the bot writes (DESIGN "Contracts").

``<!-- ccweb taskId=<taskId> turnKey=<taskId>:<n> resourceKey=<resourceKey> kind=<kind> -->``

A final comment that asks the user something carries ``state=waiting_user`` after the
kind (a marker may carry the task's state): the task then waits for the next comment.

The marker is how the verifier finds a reply, how a retry finds an effect that already
happened, and how the webhook recognises the bot's own comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class MarkerKind(StrEnum):
    RECEIPT = "receipt"
    FINAL = "final"
    FALLBACK = "fallback"
    RESULT = "result"
    REVIEW = "review"  # a pull request review's body


_VALUE = r"[^\s>]+"
_MARKER_RE = re.compile(
    r"<!--\s*ccweb"
    rf"\s+taskId=(?P<task_id>{_VALUE})"
    rf"\s+turnKey=(?P<turn_key>{_VALUE})"
    rf"\s+resourceKey=(?P<resource_key>{_VALUE})"
    r"\s+kind=(?P<kind>receipt|final|fallback|result|review)"
    r"(?:\s+state=(?P<state>[a-z_]+))?"
    r"\s*-->"
)


@dataclass(frozen=True, slots=True)
class Marker:
    task_id: str
    turn_key: str
    resource_key: str
    kind: MarkerKind
    state: str | None = None

    def render(self) -> str:
        for name, value in (
            ("taskId", self.task_id),
            ("turnKey", self.turn_key),
            ("resourceKey", self.resource_key),
        ):
            if not value or re.search(r"[\s>]", value):
                raise ValueError(f"marker field {name} must be non-empty without spaces or '>'")
        state = f" state={self.state}" if self.state else ""
        return (
            f"<!-- ccweb taskId={self.task_id} turnKey={self.turn_key} "
            f"resourceKey={self.resource_key} kind={self.kind.value}{state} -->"
        )


def append_marker(body: str, marker: Marker) -> str:
    """Return ``body`` with the marker as its last line."""
    return body.rstrip("\n") + "\n\n" + marker.render()


def find_markers(body: str) -> list[Marker]:
    """Every well-formed marker in ``body``, in order of appearance."""
    return [
        Marker(
            task_id=m["task_id"],
            turn_key=m["turn_key"],
            resource_key=m["resource_key"],
            kind=MarkerKind(m["kind"]),
            state=m["state"],
        )
        for m in _MARKER_RE.finditer(body or "")
    ]


def quoted(text: str) -> str:
    """``text`` with every marker in it broken (``ccweb`` becomes ``ccweb:quoted``), for
    text of the agent's that forgeflow posts under a marker of its own: a marker copied
    from a receipt must not make that text another task's answer."""
    return _MARKER_RE.sub(lambda m: m.group(0).replace("ccweb", "ccweb:quoted", 1), text)


def parse_marker(body: str) -> Marker | None:
    """The marker on the last non-empty line of ``body``, or ``None``.

    Only the last line counts: a marker quoted in the middle of a user's comment must
    not make that comment look like one of ours.
    """
    lines = [line for line in (body or "").splitlines() if line.strip()]
    if not lines:
        return None
    found = find_markers(lines[-1])
    return found[-1] if found else None
