from __future__ import annotations

import os

import pytest

from forgeflow.domain.ids import (
    InvalidName,
    RepoRef,
    ResourceKind,
    ResourceRef,
    delivery_key,
    parse_repo_key,
    task_id_for,
)
from forgeflow.domain.paths import repo_workspace, session_branch, session_worktree


def test_keys_follow_architecture_section_3() -> None:
    res = ResourceRef(RepoRef("acme", "widget"), ResourceKind.ISSUE, 42)
    assert res.repo.key == "default:acme/widget"
    assert res.key == res.session_key == "default:acme/widget:issue:42"
    assert delivery_key("8f7e") == "default:8f7e"
    tid = task_id_for("default:8f7e")
    assert tid.startswith("gitea-task-") and tid == task_id_for("default:8f7e")
    assert tid != task_id_for("default:8f7f")
    assert parse_repo_key("default:acme/widget") == RepoRef("acme", "widget")


@pytest.mark.parametrize(
    "name", ["..", ".", "a/b", "-rf", "a\x00b", "x" * 101, "", "a..b", "repo.git", " a", "a b"]
)
def test_hostile_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidName):
        RepoRef("acme", name)
    with pytest.raises(InvalidName):
        RepoRef(name, "widget")


@pytest.mark.parametrize("key", ["acme/widget", "other:acme/widget", "default:acme", "default:/x"])
def test_bad_repo_keys(key: str) -> None:
    with pytest.raises(InvalidName):
        parse_repo_key(key)


def test_paths_stay_under_the_root(tmp_path: os.PathLike[str]) -> None:
    root = str(tmp_path)
    res = ResourceRef(RepoRef("acme", "widget.js"), ResourceKind.PULL_REQUEST, 7)
    assert repo_workspace(root, res.repo) == os.path.join(root, "default", "acme", "widget.js")
    assert session_worktree(root, res) == os.path.join(
        root, ".sessions", "default", "acme", "widget.js", "pull_request-7"
    )
    assert session_branch(res) == "ccweb/pull_request-7"
