"""The checks on what a model may name in a Gitea tool call (paths, refs, names), and
the external server's scope rule, as pure functions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from forgeflow.agent.broker import Grant
from forgeflow.agent.gitea_tools import args as a
from forgeflow.agent.gitea_tools.external import refusal
from forgeflow.agent.gitea_tools.handlers import resource_of

ESCAPES = [
    "../../other/repo",
    "a/../../b",
    "..%2F..%2Fother",
    "a%2Fb",
    "/etc/passwd",
    "http://127.0.0.1/api/v1/repos/acme/other",
    "..\\..\\other",
    "./x",
    "a//b",
    "a\nb",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_path_that_climbs_out_is_refused(path: str) -> None:
    with pytest.raises(ValidationError):
        a.ReadFileArgs(path=path)


@pytest.mark.parametrize("ref", ["main..x", "a/../b", "x@{1}", "-x", "a b", "a:b", "%2e%2e", "/x"])
def test_a_ref_that_is_not_a_git_ref_is_refused(ref: str) -> None:
    with pytest.raises(ValidationError):
        a.ReadFileArgs(path="README.md", ref=ref)


def test_good_paths_and_refs_pass() -> None:
    ok = a.ReadFileArgs(path="src/app/main.py", ref="ccweb/issue-3")
    assert (ok.path, ok.ref) == ("src/app/main.py", "ccweb/issue-3")
    assert a.ReadFileArgs(path=".github/workflows/ci.yml", ref="0" * 40).ref == "0" * 40


@pytest.mark.parametrize("model", [a.AddCommentArgs, a.NoArgs, a.IssueRef, a.CreatePullArgs])
def test_no_tool_takes_an_owner_or_a_repository(model: type[a.Args]) -> None:
    fields = set(model.model_fields)
    assert not fields & {"owner", "repo", "repository", "head"}
    with pytest.raises(ValidationError, match="Extra inputs"):
        model.model_validate({"body": "x", "title": "t", "owner": "acme", "repo": "other"})


GRANT = Grant("acme/widget", "acme", "widget", session_key="default:acme/widget:issue:1")


@pytest.mark.parametrize(
    "arguments",
    [
        {"owner": "acme", "repo": "other", "index": 1},
        {"owner": "acme", "repo": "widget/../other", "index": 1},
        {"owner": "acme", "repo": "widget", "index": "../../other/issues/1"},
        {"owner": "acme", "repo": "widget", "index": "1%2F..%2F..%2Fother"},
        {"owner": "acme", "repo": "widget", "ref": "http://evil/x"},
        {"owner": "acme", "repo": "widget", "path": "../../../acme/other/issues/1"},
        {"owner": "acme", "repo": "widget", "labels": ["..\\x"]},
    ],
)
def test_the_external_servers_calls_stay_in_the_repository(arguments: dict[str, object]) -> None:
    assert refusal(GRANT, arguments) is not None


def test_the_external_servers_own_repository_calls_pass() -> None:
    body = {"owner": "ACME", "repo": "Widget", "index": 1, "body": "a/../b %2F text is free"}
    assert refusal(GRANT, body) is None
    assert refusal(GRANT, {"owner": "acme", "repo": "widget", "path": "src/a.py"}) is None


def test_a_spaces_session_is_its_resources() -> None:
    resource = resource_of("default:acme/widget:pull_request:4:space-0123456789ab")
    assert (resource.repo.full_name, resource.kind.value, resource.number) == (
        "acme/widget",
        "pull_request",
        4,
    )
