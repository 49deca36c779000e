"""A pull request review asked for by a pipeline step (``conversation.reviewPullRequest``):
what the step asks, who counts as asking, and what it is answered (pure, no I/O).

The review is an ordinary review task, admitted by the webhook intake's one step
(``tasks/intake.WebhookIngress.ask_review``): the permission rule of a mention applies
to whoever started the run. A run started by a Gitea event (``event.sender``) asks as
that Gitea user; a run started by forgeflow's operator (a manual run through the API or
the command line, a schedule, a signed pipeline webhook without a sender) asks as the
operator, who holds forgeflow's admin token and so may already do more than a review.

A step's execution is keyed (run, step, item, attempt): the same key is the same
delivery, so a body called again after a crash admits nothing new; a later attempt
adopts an earlier attempt's review task that is still running or that succeeded, so no
attempt makes a second review of the pull request while another can still post one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forgeflow.domain.ids import ResourceRef, delivery_key, task_id_for

# The delivery id (and event type) a step's review request is recorded under.
ASK_PREFIX = "pipeline-review:"
ASK_EVENT = "pipeline_review"
# What a focus may hold at most (it is inlined, untrusted, in the review's prompt).
MAX_FOCUS = 8000
# Gitea logins: [A-Za-z0-9_.-], at most 40 characters (models/user IsUsableUsername).
_LOGIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,39}$")


@dataclass(frozen=True, slots=True)
class Asker:
    """Who asks for the review: a Gitea ``login`` (checked like a mention's commenter),
    or none, the operator (``label`` names them: ``admin:<operator>``, ``cli``, a
    trigger)."""

    login: str | None
    label: str

    @property
    def name(self) -> str:
        """The task's author."""
        return self.login or self.label


@dataclass(frozen=True, slots=True)
class ReviewAsk:
    """One execution's request: ``key`` its idempotency key, ``earlier`` the keys of the
    step's earlier attempts (newest first), ``focus`` what the review should look at."""

    key: str
    run_id: str
    resource: ResourceRef
    focus: str = ""
    earlier: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReviewAsked:
    """The answer: the review task (new, the same delivery's, or an earlier attempt's),
    or why there is none (``code``: the refusal's, as a mention's)."""

    task_id: str | None
    code: str | None = None
    message: str = ""
    retryable: bool = False
    adopted: bool = False  # an earlier attempt's task


@dataclass(frozen=True, slots=True)
class ReviewProgress:
    """A review task as a step polls it; ``review_id``: its Gitea review once posted."""

    task_id: str
    state: str
    terminal: bool
    succeeded: bool
    review_id: int | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


def ask_delivery_id(key: str) -> str:
    return ASK_PREFIX + key


def ask_task_id(key: str) -> str:
    """The task a step execution's request makes (the intake's ids of its delivery)."""
    return task_id_for(delivery_key(ask_delivery_id(key)))


def asker(event: Mapping[str, Any], created_by: str) -> Asker:
    """Who started the run (its root run's ``event`` and ``created_by``): the Gitea user
    of the event's ``sender`` (a login, or an object with one), else the operator.
    Raises ``ValueError`` on a sender that is not a Gitea login."""
    sender = event.get("sender")
    if isinstance(sender, Mapping):
        sender = sender.get("login")
    if sender is None or sender == "":
        return Asker(None, created_by or "operator")
    if not isinstance(sender, str) or not _LOGIN.match(sender):
        raise ValueError(f"the run's event names a sender that is not a Gitea login: {sender!r}")
    return Asker(sender, created_by)


def bounded_focus(value: Any) -> str:
    """The step's ``inputs.focus`` as text, at most :data:`MAX_FOCUS` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    return text.strip()[:MAX_FOCUS]
