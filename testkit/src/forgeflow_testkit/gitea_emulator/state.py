"""In-memory model of one Gitea instance: users, tokens, repositories, issues and pull
requests, comments, labels, hooks, collaborators. Every read and write holds `lock`."""

from __future__ import annotations

import itertools
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any

from .gojson import utcnow
from .oauth_state import OAuthStore


class Access(IntEnum):
    """Gitea models/perm/access_mode.go AccessMode, in the same order."""

    NONE = 0
    READ = 1
    WRITE = 2
    ADMIN = 3
    OWNER = 4

    @property
    def label(self) -> str:
        # Gitea AccessMode.String(): "none", "read", "write", "admin", "owner".
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Access:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown permission {text!r}") from None


@dataclass
class User:
    id: int
    login: str
    full_name: str
    email: str
    is_admin: bool
    created: datetime
    is_org: bool = False
    keep_email_private: bool = False
    org_owner_ids: set[int] = field(default_factory=set)


@dataclass
class Repo:
    id: int
    owner_id: int
    name: str
    private: bool
    default_branch: str
    path: Path
    created: datetime
    updated: datetime
    parent_id: int | None = None
    description: str = ""
    collaborators: dict[int, Access] = field(default_factory=dict)
    next_index: int = 1


@dataclass
class Pull:
    id: int
    head_repo_id: int
    head_branch: str
    base_branch: str
    merged: bool = False
    merged_at: datetime | None = None
    merge_commit_sha: str | None = None
    merged_by_id: int | None = None
    requested_reviewer_ids: list[int] = field(default_factory=list)


@dataclass
class Issue:
    id: int
    repo_id: int
    index: int
    poster_id: int
    title: str
    body: str
    created: datetime
    updated: datetime
    state: str = "open"
    closed_at: datetime | None = None
    is_locked: bool = False
    label_ids: list[int] = field(default_factory=list)
    assignee_ids: list[int] = field(default_factory=list)
    pull: Pull | None = None

    @property
    def is_pull(self) -> bool:
        return self.pull is not None


@dataclass
class Comment:
    id: int
    issue_id: int
    poster_id: int
    body: str
    created: datetime
    updated: datetime
    # Earlier bodies with the time each was replaced (Gitea's content history,
    # models/issues/content_history.go; shown in its web UI, not in API v1).
    history: list[tuple[datetime, str]] = field(default_factory=list)


@dataclass
class Reaction:
    """models/issues/reaction.go: one user's reaction on an issue (comment_id 0) or a
    comment; unique per (type, issue, comment, user)."""

    issue_id: int
    comment_id: int
    user_id: int
    content: str
    created: datetime


@dataclass
class Attachment:
    """models/repo/attachment.go: a file attached to an issue (comment_id 0) or to one
    of its comments, served at ``/attachments/{uuid}`` to whoever may read the repo."""

    id: int
    uuid: str
    repo_id: int
    issue_id: int
    comment_id: int
    uploader_id: int
    name: str
    data: bytes
    created: datetime
    download_count: int = 0


# setting.UI.Reactions' default (modules/setting/ui.go).
DEFAULT_REACTIONS = ("+1", "-1", "laugh", "hooray", "confused", "heart", "rocket", "eyes")


@dataclass
class Label:
    id: int
    repo_id: int
    name: str
    color: str
    description: str = ""
    exclusive: bool = False
    is_archived: bool = False


@dataclass
class Release:
    id: int
    repo_id: int
    tag_name: str
    target: str
    name: str
    body: str
    author_id: int
    created: datetime
    draft: bool = False
    prerelease: bool = False


@dataclass
class Hook:
    id: int
    repo_id: int  # 0 for an owner-level (user or organization) hook
    owner_id: int  # 0 for a repository hook
    url: str
    secret: str
    events: set[str]
    send_everything: bool
    active: bool
    created: datetime
    updated: datetime
    type: str = "gitea"
    content_type: str = "json"
    branch_filter: str = ""
    authorization_header: str = ""


@dataclass
class Fault:
    method: str
    pattern: re.Pattern[str]
    status: int
    remaining: int
    delay: float
    # Handle the request, then hold its answer for `delay`: the effect happened, the
    # client has not heard (a kill in that wait is a crash between effect and record).
    after: bool = False


class NotFound(LookupError):
    """Something a lookup names does not exist (maps to HTTP 404)."""


class State:
    """The data of the emulated instance. Callers hold `lock` around every access."""

    def __init__(self, git_root: Path) -> None:
        self.git_root = git_root
        self.lock = threading.RLock()
        self.users: dict[int, User] = {}
        self.tokens: dict[str, int] = {}
        self.repos: dict[int, Repo] = {}
        self.issues: dict[int, Issue] = {}
        self.comments: dict[int, Comment] = {}
        self.labels: dict[int, Label] = {}
        self.releases: dict[int, Release] = {}
        self.hooks: dict[int, Hook] = {}
        self.reactions: list[Reaction] = []
        self.attachments: dict[int, Attachment] = {}
        self.allowed_reactions: tuple[str, ...] = DEFAULT_REACTIONS
        self.commit_statuses: list[Any] = []  # api_code.Status, in creation order
        self.reviews: dict[int, Any] = {}  # api_reviews.Review by id
        self.oauth = OAuthStore()  # Gitea as an OAuth2 provider (oauth_state.py)
        self.review_comments: dict[int, Any] = {}  # api_reviews.CodeComment by id
        # Gitea 1.27's reply endpoint for review threads (api_threads.py); off: older.
        self.reply_api = False
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, int]] = []
        self.clock_offset = timedelta()
        # Every table has its own auto-increment id, global to the instance (xorm pk autoincr).
        self._ids: dict[str, Iterator[int]] = {}

    def next_id(self, table: str) -> int:
        return next(self._ids.setdefault(table, itertools.count(1)))

    def now(self) -> datetime:
        return utcnow() + self.clock_offset

    # -- users and tokens ---------------------------------------------------------------

    def user_by_login(self, login: str) -> User:
        # Gitea user names are unique case-insensitively (LowerName).
        lowered = login.lower()
        for user in self.users.values():
            if user.login.lower() == lowered:
                return user
        raise NotFound(f"user {login!r} does not exist")

    def find_user(self, login: str) -> User | None:
        try:
            return self.user_by_login(login)
        except NotFound:
            return None

    def create_user(
        self,
        login: str,
        *,
        is_admin: bool = False,
        full_name: str = "",
        email: str | None = None,
        is_org: bool = False,
    ) -> User:
        if self.find_user(login) is not None:
            raise ValueError(f"user {login!r} already exists")
        user = User(
            id=self.next_id("user"),
            login=login,
            full_name=full_name,
            email=email or f"{login.lower()}@example.com",
            is_admin=is_admin,
            created=self.now(),
            is_org=is_org,
        )
        self.users[user.id] = user
        return user

    def issue_token(self, user: User) -> str:
        # Gitea personal access tokens are 40 hex characters (sha1 size).
        token = secrets.token_hex(20)
        self.tokens[token] = user.id
        return token

    def user_for_token(self, token: str) -> User | None:
        user_id = self.tokens.get(token)
        if self.oauth.expired(token, self.now()):
            return None
        return None if user_id is None else self.users.get(user_id)

    # -- repositories ---------------------------------------------------------------

    def repo_by_name(self, owner: str, name: str) -> Repo:
        owner_user = self.user_by_login(owner)
        lowered = name.lower()
        for repo in self.repos.values():
            if repo.owner_id == owner_user.id and repo.name.lower() == lowered:
                return repo
        raise NotFound(f"repository {owner}/{name} does not exist")

    def owner_of(self, repo: Repo) -> User:
        return self.users[repo.owner_id]

    def full_name(self, repo: Repo) -> str:
        return f"{self.owner_of(repo).login}/{repo.name}"

    def access(self, repo: Repo, user: User | None) -> Access:
        """Gitea models/perm/access/repo_permission.go GetUserRepoPermission."""
        if user is None:
            # Anonymous: nothing on a private repository, read on a public one.
            return Access.NONE if repo.private else Access.READ
        owner = self.owner_of(repo)
        # "Admin or the owner has super access to the repository."
        if user.is_admin or user.id == owner.id:
            return Access.OWNER
        # Members of an organization's Owners team have owner access to its repositories.
        if owner.is_org and user.id in owner.org_owner_ids:
            return Access.OWNER
        # access.go accessLevel: collaboration mode, at least read when the repo is public.
        mode = self.repos[repo.id].collaborators.get(user.id, Access.NONE)
        if not repo.private:
            mode = max(mode, Access.READ)
        return Access(mode)

    # -- issues, comments, labels, hooks ------------------------------------------------

    def issue_by_index(self, repo: Repo, index: int) -> Issue:
        for issue in self.issues.values():
            if issue.repo_id == repo.id and issue.index == index:
                return issue
        raise NotFound(f"issue {self.full_name(repo)}#{index} does not exist")

    def repo_issues(self, repo: Repo) -> list[Issue]:
        return sorted(
            (i for i in self.issues.values() if i.repo_id == repo.id), key=lambda i: i.index
        )

    def comments_of(self, issue: Issue) -> list[Comment]:
        # Gitea FindComments orders by created_unix, then id.
        return sorted(
            (c for c in self.comments.values() if c.issue_id == issue.id),
            key=lambda c: (c.created, c.id),
        )

    def attachments_of(self, issue_id: int, comment_id: int = 0) -> list[Attachment]:
        return [
            a
            for a in self.attachments.values()
            if a.issue_id == issue_id and a.comment_id == comment_id
        ]

    def comment(self, comment_id: int) -> Comment:
        try:
            return self.comments[comment_id]
        except KeyError:
            raise NotFound(f"comment {comment_id} does not exist") from None

    def label_of(self, repo: Repo, ref: int | str) -> Label:
        for label in self.labels.values():
            if label.repo_id != repo.id:
                continue
            if (isinstance(ref, int) and label.id == ref) or label.name == ref:
                return label
        raise NotFound(f"label {ref!r} does not exist")

    def repo_labels(self, repo: Repo) -> list[Label]:
        return sorted(
            (label for label in self.labels.values() if label.repo_id == repo.id),
            key=lambda label: label.name,
        )

    def hooks_for(self, repo: Repo) -> list[Hook]:
        """Gitea services/webhook/webhook.go PrepareWebhooks: the repository's active hooks,
        then the active hooks of its owner (user or organization)."""
        repo_hooks = [h for h in self.hooks.values() if h.repo_id == repo.id and h.active]
        owner_hooks = [
            h
            for h in self.hooks.values()
            if h.repo_id == 0 and h.owner_id == repo.owner_id and h.active
        ]
        return sorted(repo_hooks, key=lambda h: h.id) + sorted(owner_hooks, key=lambda h: h.id)
