"""Domain events (spec PIPELINES "Sự kiện miền"): the closed set pipelines can listen to.

Pure: an event is a value — its type, a dedupe key, a JSON payload and the repository
it concerns. The store writes it in the same transaction as the change it reports
(``store/events.py``); the trigger dispatcher starts the runs of the templates that
listen to its type. Nothing outside :data:`EVENT_TYPES` can start a pipeline.

Every payload field is listed in :data:`PAYLOAD_FIELDS` (docs/pipelines.md shows the
same table); the Gitea-derived events are built in ``gitea/events.py``. The dispatcher
adds ``repoKey`` (from the event row) to a payload that lacks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forgeflow.domain.json import JsonObject

_GITEA = ("repoKey", "owner", "repo", "sender", "deliveryId")
_PULL = (
    *_GITEA,
    "number",
    "resourceKey",
    "title",
    "body",
    "author",
    "url",
    "draft",
    "base",
    "head",
    "headSha",
    "headRepo",
    "baseRepo",
    "fork",
)
_TASK = ("taskId", "repoKey", "resourceKey", "fromState", "toState", "errorCode", "author")

# The closed set, in the order the pickers show it, with each type's payload fields.
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "ExternalPrDetected": _PULL,
    "PullRequestPublished": _PULL,
    "PullRequestStatusChanged": (
        *_GITEA,
        "number",
        "resourceKey",
        "title",
        "author",
        "url",
        "action",
        "status",
        "merged",
        "headSha",
    ),
    "PrMerged": (
        *_GITEA,
        "number",
        "resourceKey",
        "title",
        "author",
        "url",
        "base",
        "head",
        "headSha",
        "mergedBy",
        "mergeCommitSha",
    ),
    "CommentCreated": (
        *_GITEA,
        "number",
        "resourceKey",
        "isPull",
        "commentId",
        "author",
        "body",
        "mentionsBot",
        "url",
    ),
    "IssueOpened": (
        *_GITEA,
        "number",
        "resourceKey",
        "title",
        "body",
        "author",
        "url",
        "labels",
    ),
    "IssueAssigned": (
        *_GITEA,
        "number",
        "resourceKey",
        "isPull",
        "title",
        "author",
        "url",
        "assignees",
    ),
    "TaskCreated": _TASK,
    "TaskCompleted": _TASK,
    "TaskFailed": _TASK,
    "TaskCancelled": _TASK,
    "TaskStatusChanged": _TASK,
    "BudgetThresholdCrossed": ("repoKey", "period", "limit", "used", "threshold"),
    "RepoAdded": ("repoKey", "owner", "repo", "cloneUrl", "defaultBranch", "source"),
    "ReleasePublished": (
        *_GITEA,
        "releaseId",
        "tag",
        "name",
        "body",
        "target",
        "prerelease",
        "author",
        "url",
    ),
    "SessionClosed": ("sessionKey", "threadId", "actor", "repoKey"),
}

EVENT_TYPES: tuple[str, ...] = tuple(PAYLOAD_FIELDS)
KNOWN_EVENT_TYPES = frozenset(EVENT_TYPES)


@dataclass(frozen=True, slots=True)
class DomainEvent:
    """One event; ``dedupe_key`` is unique within its type (the store prefixes the type)."""

    event_type: str
    dedupe_key: str
    payload: JsonObject
    repo_key: str | None = None

    def __post_init__(self) -> None:
        if self.event_type not in KNOWN_EVENT_TYPES:
            raise ValueError(f"unknown domain event type {self.event_type!r}")


# -- the events forgeflow's own state changes produce ---------------------------------
# Task events are built by ``store/tasks.py`` (dedupe ``<taskId>:<stateVersion>``),
# SessionClosed by ``store/sessions.py`` (``<sessionKey>:<version>``) and
# BudgetThresholdCrossed by ``store/usage.py`` (``<repoKey>:<period>:<periodStart>``),
# each inside the transaction of its change.


def repo_added(
    repo_key: str, owner: str, name: str, clone_url: str, default_branch: str, source: str
) -> DomainEvent:
    """Dedupe key ``<repoKey>``: once per repository, whether forgeflow learnt of it from
    its first registration (``source: registration``) or from Gitea's repository
    ``created`` webhook (``source: gitea``), whichever came first."""
    payload: JsonObject = {
        "repoKey": repo_key,
        "owner": owner,
        "repo": name,
        "cloneUrl": clone_url,
        "defaultBranch": default_branch,
        "source": source,
    }
    return DomainEvent("RepoAdded", repo_key, payload, repo_key)


# -- trigger filters --------------------------------------------------------------------


def lookup(payload: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path of a payload (``None`` when any part is missing)."""
    node: Any = payload
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def matches(match: Mapping[str, Any] | None, payload: Mapping[str, Any]) -> bool:
    """A trigger's ``match`` filter: every key (a dotted payload path) must hold its value;
    a list value is a choice (any of them). No filter matches everything."""
    for path, wanted in (match or {}).items():
        value = lookup(payload, path)
        choices = wanted if isinstance(wanted, list) else [wanted]
        if not any(_same(value, w) for w in choices):
            return False
    return True


def _same(value: Any, wanted: Any) -> bool:
    # ``True == 1`` in Python; a filter on a flag must not match a count.
    if isinstance(value, bool) or isinstance(wanted, bool):
        return isinstance(value, bool) and isinstance(wanted, bool) and value is wanted
    return bool(value == wanted)
