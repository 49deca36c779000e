"""Identifiers and idempotency keys.

Every key is derived from data Gitea gives us, so the same delivery always maps to
the same key and a replay can never mint a new task.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from enum import StrEnum

INSTANCE_ID = "default"
TASK_ID_PREFIX = "gitea-task-"
TASK_ID_HASH_CHARS = 24

# Gitea allows [A-Za-z0-9_.-] in owner and repository names (models/user/user.go
# IsUsableUsername, models/repo/repo.go IsUsableRepoName); we keep the same alphabet and
# refuse anything that could become a path trick.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


class InvalidName(ValueError):
    """An owner or repository name that must not become a key or a path."""

    code = "invalid_name"


class ResourceKind(StrEnum):
    ISSUE = "issue"
    PULL_REQUEST = "pull_request"


def validate_name(value: str, what: str) -> str:
    """Return ``value`` if it is a safe Gitea owner/repository name, else raise."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise InvalidName(f"{what} {value!r} is not a valid Gitea name")
    if value in {".", ".."} or value.endswith(".git") or ".." in value:
        raise InvalidName(f"{what} {value!r} is not a valid Gitea name")
    return value


@dataclass(frozen=True, slots=True)
class RepoRef:
    owner: str
    name: str

    def __post_init__(self) -> None:
        validate_name(self.owner, "owner")
        validate_name(self.name, "repository")

    @property
    def key(self) -> str:
        return repo_key(self.owner, self.name)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass(frozen=True, slots=True)
class ResourceRef:
    repo: RepoRef
    kind: ResourceKind
    number: int

    @property
    def key(self) -> str:
        return resource_key(self.repo.key, self.kind, self.number)

    @property
    def session_key(self) -> str:
        return self.key


def repo_key(owner: str, name: str) -> str:
    return f"{INSTANCE_ID}:{owner}/{name}"


def resource_key(repo_key_: str, kind: ResourceKind | str, number: int) -> str:
    return f"{repo_key_}:{ResourceKind(kind).value}:{int(number)}"


def parse_repo_key(key: str) -> RepoRef:
    """Inverse of :func:`repo_key`; raises ``InvalidName`` for anything else."""
    instance, sep, full = key.partition(":")
    owner, slash, name = full.partition("/")
    if instance != INSTANCE_ID or not sep or not slash:
        raise InvalidName(f"repoKey {key!r} is not of the form default:<owner>/<repo>")
    return RepoRef(owner, name)


def delivery_key(delivery_id: str) -> str:
    return f"{INSTANCE_ID}:{delivery_id}"


def task_id_for(delivery_key_: str) -> str:
    digest = hashlib.sha256(delivery_key_.encode("utf-8")).hexdigest()
    return TASK_ID_PREFIX + digest[:TASK_ID_HASH_CHARS]


def turn_key(task_id: str, n: int) -> str:
    return f"{task_id}:{n}"


def new_lease_id() -> str:
    return str(uuid.uuid4())


def new_event_id() -> str:
    return f"audit-{uuid.uuid4()}"


def sha256_ref(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def parse_resource_key(key: str) -> ResourceRef:
    """Inverse of :func:`resource_key`."""
    repo_part, _, rest = key.rpartition(":")
    repo_key_, _, kind = repo_part.rpartition(":")
    try:
        number = int(rest)
        return ResourceRef(parse_repo_key(repo_key_), ResourceKind(kind), number)
    except ValueError:
        raise InvalidName(f"resourceKey {key!r} is not of the form <repoKey>:<kind>:<n>") from None
