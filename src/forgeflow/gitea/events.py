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
from typing import Any, TypeVar

from pydantic import ValidationError

from forgeflow.domain.events import DomainEvent, repo_added
from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, resource_key
from forgeflow.domain.json import JsonObject
from forgeflow.domain.markers import parse_marker
from forgeflow.domain.mentions import find_mention
from forgeflow.gitea.payloads import (
    HookPayload,
    HookThread,
    HookUser,
    IssueCommentPayload,
    IssuePayload,
    PullRequestPayload,
    ReleasePayload,
)
from forgeflow.gitea.webhook import CommentEvent, InvalidPayload, comment_event

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


def domain_events(
    event_type: str,
    payload: Mapping[str, Any],
    *,
    delivery_id: str,
    body: bytes,
    bot_login: str,
) -> list[DomainEvent]:
    """The domain events of one verified delivery (often none)."""
    found = _BUILDERS.get(event_type)
    if found is None:
        return []
    model, build = found
    try:
        hook = model.model_validate(payload)
        return build(_Delivery(event_type, hook, delivery_id, body, bot_login))
    except (ValidationError, InvalidName, InvalidPayload):
        return []  # a payload without what the event needs gives no event


P = TypeVar("P", bound=HookPayload)


class _Delivery:
    def __init__(
        self, event_type: str, hook: HookPayload, delivery_id: str, body: bytes, bot: str
    ) -> None:
        self.event_type = event_type
        self.hook = hook
        self.delivery_id = delivery_id
        self.body = body
        self.bot = bot
        self.action = hook.action
        self.repo = RepoRef(hook.repository.owner.login, hook.repository.name)

    def base(self) -> JsonObject:
        sender = self.hook.sender
        return {
            "repoKey": self.repo.key,
            "owner": self.repo.owner,
            "repo": self.repo.name,
            "sender": sender.login if sender else None,
            "deliveryId": self.delivery_id,
        }

    def read_as(self, model: type[P]) -> P:
        """The payload as the model its event type was read with (_BUILDERS)."""
        assert isinstance(self.hook, model)
        return self.hook

    def content_key(self) -> str:
        """Identity of a delivery's content: Gitea replays a hook byte for byte."""
        return hashlib.sha256(self.body).hexdigest()[:32]

    def event(self, event_type: str, key: str, payload: JsonObject) -> DomainEvent:
        return DomainEvent(event_type, key, payload, self.repo.key)


def _login(user: HookUser | None) -> str | None:
    return user.login if user is not None else None


# -- issues -----------------------------------------------------------------------------


def _issues(d: _Delivery) -> list[DomainEvent]:
    issue = d.read_as(IssuePayload).issue
    if d.action == "assigned":
        return _assigned(d, issue, is_pull=False)
    if d.action != "opened":
        return []
    resource = resource_key(d.repo.key, ResourceKind.ISSUE, issue.number)
    payload: JsonObject = {
        **d.base(),
        "number": issue.number,
        "resourceKey": resource,
        "title": issue.title,
        "body": issue.body,
        "author": _login(issue.user),
        "url": issue.html_url,
        "labels": [*issue.label_names()],
    }
    return [d.event("IssueOpened", resource, payload)]


def _assigned(d: _Delivery, thread: HookThread, *, is_pull: bool) -> list[DomainEvent]:
    """Gitea sends one ``assigned`` delivery per added assignee without naming it; the
    issue's ``assignees`` after the change tell whether the bot is one of them."""
    assignees = thread.assignee_logins()
    if d.bot.lower() not in (a.lower() for a in assignees):
        return []
    kind = ResourceKind.PULL_REQUEST if is_pull else ResourceKind.ISSUE
    resource = resource_key(d.repo.key, kind, thread.number)
    payload: JsonObject = {
        **d.base(),
        "number": thread.number,
        "resourceKey": resource,
        "isPull": is_pull,
        "title": thread.title,
        "author": _login(thread.user),
        "url": thread.html_url,
        "assignees": [*assignees],
    }
    return [d.event("IssueAssigned", f"{resource}:{d.content_key()}", payload)]


# -- pull requests ------------------------------------------------------------------------


def _pulls(d: _Delivery) -> list[DomainEvent]:
    pull = d.read_as(PullRequestPayload).pull_request
    if d.action == "assigned":
        return _assigned(d, pull, is_pull=True)
    if d.action != "opened" and d.action not in _STATUS_ACTIONS:
        return []
    resource = resource_key(d.repo.key, ResourceKind.PULL_REQUEST, pull.number)
    common = {
        **d.base(),
        "number": pull.number,
        "resourceKey": resource,
        "title": pull.title,
        "author": _login(pull.user),
        "url": pull.html_url,
    }
    if d.action == "opened":
        return _pull_published(d, resource, common)
    return _pull_status_changed(d, resource, common)


def _pull_published(d: _Delivery, resource: str, common: JsonObject) -> list[DomainEvent]:
    """PullRequestPublished, and ExternalPrDetected when the head lives in a fork."""
    pull = d.read_as(PullRequestPayload).pull_request
    head, base = pull.head, pull.base
    head_repo_id = head.repo_id if head else None
    payload = {
        **common,
        "body": pull.body,
        "draft": pull.draft is True,
        "base": base.ref if base else None,
        "head": head.ref if head else None,
        "headSha": head.sha if head else None,
        "headRepo": head.repo.full_name if head and head.repo else None,
        "baseRepo": base.repo.full_name if base and base.repo else None,
        "fork": head_repo_id is not None and head_repo_id != (base.repo_id if base else None),
    }
    found = [d.event("PullRequestPublished", resource, payload)]
    if payload["fork"]:
        found.append(d.event("ExternalPrDetected", resource, payload))
    return found


def _pull_status_changed(d: _Delivery, resource: str, common: JsonObject) -> list[DomainEvent]:
    """PullRequestStatusChanged on reopen, push and close; PrMerged too on a merge."""
    pull = d.read_as(PullRequestPayload).pull_request
    merged = d.action == "closed" and pull.merged is True
    head_sha = pull.head.sha if pull.head else None
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
            "base": pull.base.ref if pull.base else None,
            "head": pull.head.ref if pull.head else None,
            "headSha": head_sha,
            "mergedBy": _login(pull.merged_by) or _login(d.hook.sender),
            "mergeCommitSha": pull.merge_commit_sha,
        }
        found.append(d.event("PrMerged", resource, payload))
    return found


# -- comments, releases, repositories -----------------------------------------------------


def comment_created(event: CommentEvent, *, mentions_bot: bool) -> DomainEvent:
    """CommentCreated from the comment the ingress already normalised (its hot path
    reads the payload once); the caller has ruled out the bot's own comments."""
    repo, resource = event.repo, event.resource
    payload: JsonObject = {
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
    event = comment_event(d.delivery_id, d.event_type, d.read_as(IssueCommentPayload))
    if event.actor_login.lower() == d.bot.lower() or parse_marker(event.comment_body):
        return []  # the bot's own comment: the ingress ignores it too (bot_comment)
    mentions = find_mention(event.comment_body, d.bot) is not None
    return [comment_created(event, mentions_bot=mentions)]


def _releases(d: _Delivery) -> list[DomainEvent]:
    release = d.read_as(ReleasePayload).release
    if d.action != "published" or release.draft is True:
        return []
    payload: JsonObject = {
        **d.base(),
        "releaseId": release.id,
        "tag": release.tag_name,
        "name": release.name,
        "body": release.body,
        "target": release.target_commitish,
        "prerelease": release.prerelease is True,
        "author": _login(release.author),
        "url": release.html_url,
    }
    return [d.event("ReleasePublished", f"{d.repo.key}:release:{release.id}", payload)]


def _repository(d: _Delivery) -> list[DomainEvent]:
    if d.action != "created":
        return []
    repository = d.hook.repository
    event = repo_added(
        d.repo.key,
        d.repo.owner,
        d.repo.name,
        repository.clone_url or "",
        repository.default_branch or "main",
        "gitea",
    )
    return [event]


# Each event's payload model (hook.go) and what builds its events.
_Builder = tuple[type[HookPayload], Callable[[_Delivery], list[DomainEvent]]]
_BUILDERS: dict[str, _Builder] = {
    **dict.fromkeys(_ISSUE_FAMILY, (IssuePayload, _issues)),
    **dict.fromkeys(_PULL_FAMILY, (PullRequestPayload, _pulls)),
    **dict.fromkeys(_COMMENTS, (IssueCommentPayload, _comments)),
    "release": (ReleasePayload, _releases),
    "repository": (HookPayload, _repository),
}
