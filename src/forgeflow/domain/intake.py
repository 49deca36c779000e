"""What the webhook intake decided about a delivery: its outcome, before any HTTP.

``api/webhook.py`` turns an outcome into the status code and body Gitea is answered
with (and the metrics label); the intake (tasks/intake.py) never builds either.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class DeliveryStatus(StrEnum):
    """A recorded delivery's ``status``, the filters of the delivery log."""

    ACCEPTED = "accepted"
    IGNORED = "ignored"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"


# What a replay of a comment (its id under a new delivery id) is answered from.
ANSWERED_STATUSES = frozenset({DeliveryStatus.ACCEPTED, DeliveryStatus.REJECTED})


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """What happened to a delivery: enough to answer a repeat with the original result.
    ``response_code``: the answer recorded with it (a repeat is answered the same)."""

    delivery_id: str
    status: str
    response_code: int
    task_id: str | None = None
    task_state: str | None = None
    reason: str | None = None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class NoSecret:
    """FORGEFLOW_WEBHOOK_SECRET is not set: nothing can be verified."""


@dataclass(frozen=True, slots=True)
class BadSignature:
    """The signature is missing or wrong (audited as a security event, not recorded)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A verified delivery forgeflow cannot take now: ``invalid`` (a payload it cannot
    read), ``not_configured`` or ``unavailable`` (Gitea could not say who commented, and
    Gitea redelivers). Recorded with its code, never with its body."""

    kind: Literal["invalid", "not_configured", "unavailable"]
    code: str
    message: str
    delivery_id: str | None
    event_type: str
    payload_hash: str
    repo_key: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The delivery's record: accepted, a command, ignored, rejected or a repeat."""

    record: DeliveryRecord

    @property
    def is_command(self) -> bool:
        r = self.record
        return r.status == "accepted" and (r.reason or "").startswith("command_")


Outcome = NoSecret | BadSignature | Refused | Recorded
