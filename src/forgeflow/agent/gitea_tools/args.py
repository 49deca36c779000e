"""The arguments of forgeflow's Gitea tools: strict pydantic models (unknown keys are
refused), and the checks for every value that reaches a Gitea URL path.

No tool takes an owner or a repository: the session's capability fixes both. What a
model may still name (a file path, a ref, a label) is checked here so that it cannot
leave the repository: no ``..`` segment, no absolute path or URL, no backslash, no
percent sign (a ``%2F`` would be decoded by Gitea after our check).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_BODY = 65_536  # Gitea's own limit on a comment is larger; a model's answer is not


def _no_escape(value: str, what: str) -> str:
    if "\\" in value or "%" in value or "://" in value or value.startswith("/"):
        raise ValueError(f"{what} {value!r} may not contain '\\', '%', '://' or start with '/'")
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise ValueError(f"{what} may not contain control characters")
    return value


def check_path(value: str) -> str:
    """A file path inside the repository, relative, without ``.``/``..`` segments."""
    _no_escape(value, "path")
    parts = value.split("/")
    if not value or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {value!r} must be relative, without empty, '.' or '..' parts")
    return value


_REF_BAD = re.compile(r"\.\.|@\{|[\s~^:?*\[]|//|/\.|\.lock$|^-|/$|\.$")


def check_ref(value: str) -> str:
    """A branch, tag or commit name by git's check-ref-format rules (and no escape)."""
    _no_escape(value, "ref")
    if not value or _REF_BAD.search(value):
        raise ValueError(f"ref {value!r} is not a valid branch, tag or commit name")
    return value


def check_name(value: str) -> str:
    """One URL path segment taken from a model (no ``/`` at all)."""
    _no_escape(value, "name")
    if "/" in value or value in ("", ".", ".."):
        raise ValueError(f"{value!r} is not a single name")
    return value


Path = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(check_path)]
Ref = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(check_ref)]
Body = Annotated[str, Field(min_length=1, max_length=MAX_BODY)]
Title = Annotated[str, Field(min_length=1, max_length=255)]
LabelName = Annotated[str, Field(min_length=1, max_length=255)]
Number = Annotated[int, Field(ge=1, le=2**31 - 1)]
Page = Annotated[int, Field(ge=1, le=1000)]
Limit = Annotated[int, Field(ge=1, le=50)]


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(Args):
    pass


class IssueRef(Args):
    number: Number | None = Field(
        default=None, description="another issue or pull request of this repository"
    )


class CommentsArgs(IssueRef):
    page: Page = 1
    limit: Limit = 20


class AddCommentArgs(Args):
    body: Body = Field(description="Markdown text of the comment")


class EditCommentArgs(Args):
    comment_id: Number = Field(description="a comment you posted in this session")
    body: Body


class SearchArgs(Args):
    query: str = Field(default="", max_length=255, description="keywords")
    state: Literal["open", "closed", "all"] = "open"
    kind: Literal["issues", "pulls", "all"] = "all"
    page: Page = 1
    limit: Limit = 20


class DiffArgs(IssueRef):
    max_bytes: int = Field(default=100_000, ge=1_000, le=400_000)


class ReadFileArgs(Args):
    path: Path = Field(description="relative path in the repository, e.g. src/app.py")
    ref: Ref | None = Field(default=None, description="branch, tag or commit (default branch)")
    max_bytes: int = Field(default=100_000, ge=1_000, le=400_000)


class CreatePullArgs(Args):
    title: Title
    body: str = Field(default="", max_length=MAX_BODY)
    base: Ref | None = Field(default=None, description="target branch (default branch)")


class UpdatePullArgs(Args):
    title: Title | None = None
    body: str | None = Field(default=None, max_length=MAX_BODY)


class LabelsArgs(Args):
    labels: list[LabelName] = Field(min_length=1, max_length=20)
