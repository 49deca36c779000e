"""Webhook payloads read as gitea/models.py's models: what a comment delivery is refused
for, and what an odd optional field costs (nothing)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from forgeflow.gitea.webhook import (
    InvalidPayload,
    event_type_of,
    normalise_comment,
    payload_delivery_fallback,
)

COMMENT: dict[str, Any] = {
    "action": "created",
    "repository": {
        "name": "widget",
        "owner": {"login": "acme"},
        "clone_url": "http://gitea/acme/widget.git",
        "default_branch": "trunk",
    },
    "issue": {"number": 3, "pull_request": None},
    "comment": {"id": 9, "body": "@bot hi", "user": {"login": "alice"}, "html_url": "u"},
    "is_pull": False,
}


def _with(path: str, value: Any) -> dict[str, Any]:
    payload = copy.deepcopy(COMMENT)
    *head, leaf = path.split(".")
    node = payload
    for part in head:
        node = node[part]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return payload


def _refusal(payload: dict[str, Any]) -> str:
    with pytest.raises(InvalidPayload) as caught:
        normalise_comment("d1", "issue_comment", payload)
    return str(caught.value)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("repository", KeyError, "missing field repository.owner.login"),
        ("repository", "acme/widget", "missing field repository.owner.login"),
        ("repository.owner", None, "missing field repository.owner.login"),
        ("issue", KeyError, "missing field issue.number"),
        ("issue.number", "3", "field issue.number has the wrong type"),
        ("issue.number", True, "field issue.number has the wrong type"),
        ("comment.user", {}, "missing field comment.user.login"),
        ("comment.body", None, "field comment.body has the wrong type"),
        ("comment.body", "a\x00b", "field comment.body contains a NUL character"),
        ("comment.id", 0, "issue.number and comment.id must be positive"),
        ("action", 1, "field action has the wrong type"),
    ],
)
def test_a_comment_payload_is_refused_naming_the_field(path: str, value: Any, message: str) -> None:
    assert _refusal(_with(path, value)) == message


def test_the_first_broken_field_in_the_payload_s_order_is_named() -> None:
    payload = _with("comment.id", -1)  # named only when nothing else is wrong
    payload["comment"]["body"] = None
    del payload["repository"]["name"]
    assert _refusal(payload) == "missing field repository.name"


def test_odd_optional_fields_read_as_absent() -> None:
    payload = _with("repository.clone_url", 5)
    payload["repository"]["default_branch"] = None
    payload["comment"]["html_url"] = {"x": 1}
    payload["is_pull"] = "yes"
    event = normalise_comment("d1", "issue_comment", payload)
    assert (event.clone_url, event.default_branch, event.html_url) == ("", "main", "")
    assert event.resource.key == "default:acme/widget:issue:3" and event.refs is None
    read = normalise_comment("d1", "issue_comment", COMMENT)
    assert (read.clone_url, read.default_branch, read.comment_body) == (
        "http://gitea/acme/widget.git",
        "trunk",
        "@bot hi",
    )


def test_the_event_name_and_the_fallback_key_read_the_payload_s_shape() -> None:
    headers = {"X-Gitea-Event": "issue_comment"}
    lower = {k.lower(): v for k, v in headers.items()}
    assert event_type_of(lower, COMMENT) == "issue_comment"
    assert event_type_of(lower, _with("issue.pull_request", {"merged": False})) == (
        "pull_request_comment"
    )
    review = {"action": "reviewed", "review": {"content": "x"}, "pull_request": {"number": 1}}
    assert event_type_of(lower, review) == "pull_request_review_comment"
    # Without a comment and without a review's marks: a comment payload that lacks it.
    assert event_type_of(lower, {"action": "created"}) == "issue_comment"
    assert payload_delivery_fallback("issue_comment", COMMENT) == "payload:issue_comment:9:created"
    assert payload_delivery_fallback("issue_comment", _with("comment.id", "9")) is None
