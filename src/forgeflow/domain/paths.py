"""Workspace paths (DESIGN "Workspaces"), computed without touching the disk.

Names are validated by :class:`RepoRef`; this module adds the final guarantee that a
resolved path stays under the root, whatever the names were.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from forgeflow.domain.ids import INSTANCE_ID, InvalidName, RepoRef, ResourceRef

SESSIONS_DIR = ".sessions"
HOMES_DIR = ".homes"
READ_ONLY_HOMES_DIR = ".homes-read-only"
# A repository's environment folder (issue #26): written by its setup, read-only to its
# turns; and the setup's own home and working tree, which no turn's jail binds.
ENVIRONMENTS_DIR = ".environments"
SETUP_HOMES_DIR = ".setup-homes"
SETUP_EXPORTS_DIR = ".setup-exports"


def _under(root: str, *parts: str) -> str:
    base = os.path.normpath(root)
    path = os.path.normpath(os.path.join(base, *parts))
    if os.path.commonpath([base, path]) != base or path == base:
        raise InvalidName(f"path {PurePosixPath(*parts)} escapes the workspace root")
    return path


def repo_workspace(root: str, repo: RepoRef) -> str:
    """The persistent clone: ``<root>/default/<owner>/<repo>``."""
    return _under(root, INSTANCE_ID, repo.owner, repo.name)


def repo_sessions(root: str, repo: RepoRef) -> str:
    """The folder of a repository's session worktrees."""
    return _under(root, SESSIONS_DIR, INSTANCE_ID, repo.owner, repo.name)


def agent_home(root: str, repo: RepoRef, *, read_only: bool = False) -> str:
    """The private home of a repository's jail, kept between its app-servers; its draft
    spaces' read-only jail has a home of its own."""
    homes = READ_ONLY_HOMES_DIR if read_only else HOMES_DIR
    return _under(root, homes, INSTANCE_ID, repo.owner, repo.name)


def environment_dir(root: str, repo: RepoRef) -> str:
    """What a repository's setup leaves for its turns (bound read-only into them)."""
    return _under(root, ENVIRONMENTS_DIR, INSTANCE_ID, repo.owner, repo.name)


def setup_home(root: str, repo: RepoRef) -> str:
    """The home of a repository's setup runs, kept between them; no turn binds it."""
    return _under(root, SETUP_HOMES_DIR, INSTANCE_ID, repo.owner, repo.name)


def setup_export(root: str, repo: RepoRef) -> str:
    """The default branch's tree the setup runs in, made anew for each run."""
    return _under(root, SETUP_EXPORTS_DIR, INSTANCE_ID, repo.owner, repo.name)


def session_worktree(root: str, resource: ResourceRef) -> str:
    """The session's worktree: ``<root>/.sessions/default/<owner>/<repo>/<kind>-<n>``."""
    repo = resource.repo
    leaf = f"{resource.kind.value}-{int(resource.number)}"
    return _under(root, SESSIONS_DIR, INSTANCE_ID, repo.owner, repo.name, leaf)


def session_branch(resource: ResourceRef) -> str:
    return f"ccweb/{resource.kind.value}-{int(resource.number)}"
