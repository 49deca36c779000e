"""Gitea webhook deliveries → domain events (pure; docs/pipelines.md "Domain events").

:func:`domain_events` reads the payloads Gitea documents in modules/structs/hook.go
(IssuePayload, PullRequestPayload, IssueCommentPayload, ReleasePayload,
RepositoryPayload) as services/webhook/notifier.go fills them in, and never raises: a
payload it cannot read gives no event. The ingress records the events in the same
transaction as the delivery row, so a redelivered delivery (same delivery id) emits
nothing; Gitea's *replay* of a hook (new delivery id, byte-identical payload) is caught
by the dedupe keys, which use what Gitea gives a stable identity — the resource, the
comment or release id, the head commit — or else a hash of the payload itself.

Which delivery gives which event:

==========================================  ======================================
Gitea event (X-Gitea-Event-Type) / action    domain event(s)
==========================================  ======================================
issues / opened                              IssueOpened
issue_assign, pull_request_assign / assigned IssueAssigned, when the bot is an assignee
pull_request / opened                        PullRequestPublished, and
                                             ExternalPrDetected when the head is a fork
pull_request / reopened, synchronized,       PullRequestStatusChanged
closed
pull_request / closed with merged: true      PrMerged and PullRequestStatusChanged
issue_comment, pull_request_comment /        CommentCreated (not the bot's own, nor a
created                                      comment carrying the bot's marker)
release / published                          ReleasePublished
repository / created                         RepoAdded
==========================================  ======================================

"External" is decided from the payload alone: the pull request's head repository is
not its base repository (``pull_request.head.repo_id != base.repo_id``). A branch of the
base repository can only be pushed by someone with write access, so a same-repository
pull request comes from a collaborator; one from a fork may come from anyone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from forgeflow.domain.events import DomainEvent, repo_added
from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, resource_key
from forgeflow.domain.markers import parse_marker
from forgeflow.domain.mentions import find_mention
from forgeflow.gitea.webhook import CommentEvent, normalise_comment

_ISSUE_FAMILY = frozenset({"issues", "issue_assign", "issue_label", "issue_milestone"})
_PULL_FAMILY = frozenset(
    {
        "pull_request",
        "pull_request_assign",
        "pull_request_label",
        "pull_request_milestone",
        "pull_request_sync",
        "pull_request_review_request",
    }
)
_COMMENTS = frozenset({"issue_comment", "pull_request_comment"})
_STATUS_ACTIONS = frozenset({"reopened", "closed", "synchronized"})


class _Unreadable(Exception):
    """A field the event needs is missing or has the wrong type."""


def domain_events(
    event_type: str,
    payload: Mapping[str, Any],
    *,
    delivery_id: str,
    body: bytes,
    bot_login: str,
) -> list[DomainEvent]:
    """The domain events of one verified delivery (often none)."""
    build = _BUILDERS.get(event_type)
    if build is None:
        return []
    try:
        return build(_Delivery(event_type, payload, delivery_id, body, bot_login))
    except (_Unreadable, InvalidName, KeyError, TypeError, ValueError):
        return []


class _Delivery:
    def __init__(
        self, event_type: str, payload: Mapping[str, Any], delivery_id: str, body: bytes, bot: str
    ) -> None:
        self.event_type = event_type
        self.payload = payload
        self.delivery_id = delivery_id
        self.body = body
        self.bot = bot
        self.action = _str(payload, "action")
        self.repo = RepoRef(
            _str(payload, "repository.owner.login"), _str(payload, "repository.name")
        )

    def base(self) -> dict[str, Any]:
        return {
            "repoKey": self.repo.key,
            "owner": self.repo.owner,
            "repo": self.repo.name,
            "sender": _opt(self.payload, "sender.login"),
            "deliveryId": self.delivery_id,
        }

    def content_key(self) -> str:
        """Identity of a delivery's content: Gitea replays a hook byte for byte."""
        return hashlib.sha256(self.body).hexdigest()[:32]

    def event(self, event_type: str, key: str, payload: dict[str, Any]) -> DomainEvent:
        return DomainEvent(event_type, key, payload, self.repo.key)


def _get(payload: Mapping[str, Any], path: str) -> Any:
    node: Any = payload
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise _Unreadable(path)
        node = node[part]
    return node


def _opt(payload: Mapping[str, Any], path: str) -> Any:
    try:
        return _get(payload, path)
    except _Unreadable:
        return None


def _str(payload: Mapping[str, Any], path: str) -> str:
    value = _get(payload, path)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _Unreadable(path)
    return value


def _int(payload: Mapping[str, Any], path: str) -> int:
    value = _get(payload, path)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _Unreadable(path)
    return value


def _logins(users: Any) -> list[str]:
    if not isinstance(users, list):
        return []
    return [u["login"] for u in users if isinstance(u, Mapping) and isinstance(u.get("login"), str)]


# -- issues -----------------------------------------------------------------------------


def _issues(d: _Delivery) -> list[DomainEvent]:
    if d.action == "assigned":
        return _assigned(d, "issue", is_pull=False)
    if d.action != "opened":
        return []
    number = _int(d.payload, "issue.number")
    resource = resource_key(d.repo.key, ResourceKind.ISSUE, number)
    labels = _opt(d.payload, "issue.labels")
    payload = {
        **d.base(),
        "number": number,
        "resourceKey": resource,
        "title": _opt(d.payload, "issue.title"),
        "body": _opt(d.payload, "issue.body"),
        "author": _opt(d.payload, "issue.user.login"),
        "url": _opt(d.payload, "issue.html_url"),
        "labels": [
            label["name"]
            for label in labels or []
            if isinstance(label, Mapping) and isinstance(label.get("name"), str)
        ],
    }
    return [d.event("IssueOpened", resource, payload)]


def _assigned(d: _Delivery, field: str, *, is_pull: bool) -> list[DomainEvent]:
    """Gitea sends one ``assigned`` delivery per added assignee without naming it; the
    issue's ``assignees`` after the change tell whether the bot is one of them."""
    assignees = _logins(_opt(d.payload, f"{field}.assignees"))
    if d.bot.lower() not in (a.lower() for a in assignees):
        return []
    number = _int(d.payload, f"{field}.number")
    kind = ResourceKind.PULL_REQUEST if is_pull else ResourceKind.ISSUE
    resource = resource_key(d.repo.key, kind, number)
    payload = {
        **d.base(),
        "number": number,
        "resourceKey": resource,
        "isPull": is_pull,
        "title": _opt(d.payload, f"{field}.title"),
        "author": _opt(d.payload, f"{field}.user.login"),
        "url": _opt(d.payload, f"{field}.html_url"),
        "assignees": assignees,
    }
    return [d.event("IssueAssigned", f"{resource}:{d.content_key()}", payload)]


# -- pull requests ------------------------------------------------------------------------


def _pulls(d: _Delivery) -> list[DomainEvent]:
    if d.action == "assigned":
        return _assigned(d, "pull_request", is_pull=True)
    if d.action != "opened" and d.action not in _STATUS_ACTIONS:
        return []
    number = _int(d.payload, "pull_request.number")
    resource = resource_key(d.repo.key, ResourceKind.PULL_REQUEST, number)
    p = d.payload
    common = {
        **d.base(),
        "number": number,
        "resourceKey": resource,
        "title": _opt(p, "pull_request.title"),
        "author": _opt(p, "pull_request.user.login"),
        "url": _opt(p, "pull_request.html_url"),
    }
    if d.action == "opened":
        return _pull_published(d, resource, common)
    return _pull_status_changed(d, resource, common)


def _pull_published(d: _Delivery, resource: str, common: dict[str, Any]) -> list[DomainEvent]:
    """PullRequestPublished, and ExternalPrDetected when the head lives in a fork."""
    p = d.payload
    head_repo_id = _opt(p, "pull_request.head.repo_id")
    payload = {
        **common,
        "body": _opt(p, "pull_request.body"),
        "draft": _opt(p, "pull_request.draft") is True,
        "base": _opt(p, "pull_request.base.ref"),
        "head": _opt(p, "pull_request.head.ref"),
        "headSha": _opt(p, "pull_request.head.sha"),
        "headRepo": _opt(p, "pull_request.head.repo.full_name"),
        "baseRepo": _opt(p, "pull_request.base.repo.full_name"),
        "fork": head_repo_id is not None and head_repo_id != _opt(p, "pull_request.base.repo_id"),
    }
    found = [d.event("PullRequestPublished", resource, payload)]
    if payload["fork"]:
        found.append(d.event("ExternalPrDetected", resource, payload))
    return found


def _pull_status_changed(d: _Delivery, resource: str, common: dict[str, Any]) -> list[DomainEvent]:
    """PullRequestStatusChanged on reopen, push and close; PrMerged too on a merge."""
    p = d.payload
    merged = d.action == "closed" and _opt(p, "pull_request.merged") is True
    head_sha = _opt(p, "pull_request.head.sha")
    status = "merged" if merged else ("closed" if d.action == "closed" else "open")
    changed = {
        **common,
        "action": d.action,
        "status": status,
        "merged": merged,
        "headSha": head_sha,
    }
    # A push moves the head: its commit names the change. Closing and reopening can
    # repeat, so they are named by the delivery's content.
    moment = head_sha if d.action == "synchronized" and head_sha else d.content_key()
    found = [d.event("PullRequestStatusChanged", f"{resource}:{d.action}:{moment}", changed)]
    if merged:
        payload = {
            **common,
            "base": _opt(p, "pull_request.base.ref"),
            "head": _opt(p, "pull_request.head.ref"),
            "headSha": head_sha,
            "mergedBy": _opt(p, "pull_request.merged_by.login") or _opt(p, "sender.login"),
            "mergeCommitSha": _opt(p, "pull_request.merge_commit_sha"),
        }
        found.append(d.event("PrMerged", resource, payload))
    return found


# -- comments, releases, repositories -----------------------------------------------------


def comment_created(event: CommentEvent, *, mentions_bot: bool) -> DomainEvent:
    """CommentCreated from the comment the ingress already normalised (its hot path
    reads the payload once); the caller has ruled out the bot's own comments."""
    repo, resource = event.repo, event.resource
    payload = {
        "repoKey": repo.key,
        "owner": repo.owner,
        "repo": repo.name,
        "sender": event.actor_login,
        "deliveryId": event.delivery_id,
        "number": resource.number,
        "resourceKey": resource.key,
        "isPull": resource.kind is ResourceKind.PULL_REQUEST,
        "commentId": event.comment_id,
        "author": event.actor_login,
        "body": event.comment_body,
        "mentionsBot": mentions_bot,
        "url": event.html_url or None,
    }
    return DomainEvent(
        "CommentCreated", f"{repo.key}:comment:{event.comment_id}", payload, repo.key
    )


def _comments(d: _Delivery) -> list[DomainEvent]:
    if d.action != "created":
        return []
    event = normalise_comment(d.delivery_id, d.event_type, d.payload)
    if event.actor_login.lower() == d.bot.lower() or parse_marker(event.comment_body):
        return []  # the bot's own comment: the ingress ignores it too (bot_comment)
    mentions = find_mention(event.comment_body, d.bot) is not None
    return [comment_created(event, mentions_bot=mentions)]


def _releases(d: _Delivery) -> list[DomainEvent]:
    if d.action != "published" or _opt(d.payload, "release.draft") is True:
        return []
    release_id = _int(d.payload, "release.id")
    payload = {
        **d.base(),
        "releaseId": release_id,
        "tag": _opt(d.payload, "release.tag_name"),
        "name": _opt(d.payload, "release.name"),
        "body": _opt(d.payload, "release.body"),
        "target": _opt(d.payload, "release.target_commitish"),
        "prerelease": _opt(d.payload, "release.prerelease") is True,
        "author": _opt(d.payload, "release.author.login"),
        "url": _opt(d.payload, "release.html_url"),
    }
    return [d.event("ReleasePublished", f"{d.repo.key}:release:{release_id}", payload)]


def _repository(d: _Delivery) -> list[DomainEvent]:
    if d.action != "created":
        return []
    clone_url = _opt(d.payload, "repository.clone_url")
    branch = _opt(d.payload, "repository.default_branch")
    event = repo_added(
        d.repo.key,
        d.repo.owner,
        d.repo.name,
        clone_url if isinstance(clone_url, str) else "",
        branch if isinstance(branch, str) and branch else "main",
        "gitea",
    )
    return [event]


_BUILDERS: dict[str, Callable[[_Delivery], list[DomainEvent]]] = {
    **dict.fromkeys(_ISSUE_FAMILY, _issues),
    **dict.fromkeys(_PULL_FAMILY, _pulls),
    **dict.fromkeys(_COMMENTS, _comments),
    "release": _releases,
    "repository": _repository,
}
