"""Gitea repository access levels, and who may start a task with a mention."""

from __future__ import annotations

from enum import StrEnum


class Permission(StrEnum):
    """Gitea repository access levels, weakest first."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def allows(self, required: Permission) -> bool:
        """Whether this level is at least ``required`` (the trigger permission)."""
        return self.rank >= required.rank


_RANK = {p: i for i, p in enumerate(Permission)}  # every mention compares two ranks
