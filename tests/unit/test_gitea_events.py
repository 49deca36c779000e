"""The pure mapping of Gitea deliveries to domain events (gitea/events.py)."""

from __future__ import annotations

import json
from typing import Any

from forgeflow.domain.events import EVENT_TYPES, matches
from forgeflow.gitea.events import domain_events

REPOSITORY = {
    "id": 1,
    "name": "widget",
    "full_name": "acme/widget",
    "owner": {"login": "acme"},
    "clone_url": "http://gitea/acme/widget.git",
    "default_branch": "main",
}


def _map(event_type: str, payload: dict[str, Any]) -> list[Any]:
    body = json.dumps(payload).encode()
    return domain_events(event_type, payload, delivery_id="d1", body=body, bot_login="ccweb-bot")


def test_repository_created_is_repo_added() -> None:
    payload = {"action": "created", "repository": REPOSITORY, "sender": {"login": "acme"}}
    (event,) = _map("repository", payload)
    assert (event.event_type, event.dedupe_key) == ("RepoAdded", "default:acme/widget")
    assert event.payload["source"] == "gitea" and event.payload["defaultBranch"] == "main"
    assert _map("repository", {**payload, "action": "deleted"}) == []


def test_assignment_counts_only_when_the_bot_is_assigned() -> None:
    issue = {"number": 3, "title": "t", "user": {"login": "alice"}, "assignees": None}
    payload = {"action": "assigned", "issue": issue, "repository": REPOSITORY}
    assert _map("issue_assign", payload) == []
    issue["assignees"] = [{"login": "bob"}, {"login": "CCWEB-bot"}]
    (event,) = _map("issue_assign", payload)
    assert event.event_type == "IssueAssigned" and event.payload["assignees"][1] == "CCWEB-bot"
    # Gitea's replay sends the same bytes under a new delivery id: the same dedupe key.
    assert _map("issue_assign", payload)[0].dedupe_key == event.dedupe_key


def test_bot_comments_drafts_and_unreadable_payloads_give_nothing() -> None:
    comment = {"id": 9, "body": "done", "user": {"login": "ccweb-bot"}}
    issue = {"number": 1}
    payload = {"action": "created", "comment": comment, "issue": issue, "repository": REPOSITORY}
    assert _map("issue_comment", payload) == []
    comment["user"] = {"login": "alice"}
    (event,) = _map("issue_comment", payload)
    assert event.dedupe_key == "default:acme/widget:comment:9"
    assert event.payload["mentionsBot"] is False and event.payload["isPull"] is False
    release = {"id": 4, "tag_name": "v1", "draft": True}
    assert (
        _map("release", {"action": "published", "release": release, "repository": REPOSITORY}) == []
    )
    assert _map("issues", {"action": "opened", "repository": {"name": "x"}}) == []
    assert (
        _map("issues", {"action": "opened", "issue": {"number": "1"}, "repository": REPOSITORY})
        == []
    )
    assert _map("push", {"ref": "refs/heads/main", "repository": REPOSITORY}) == []


def test_pull_request_closed_unmerged_is_a_status_change_only() -> None:
    pull = {
        "number": 5,
        "merged": False,
        "head": {"ref": "f", "sha": "abc", "repo_id": 1},
        "base": {"ref": "main", "repo_id": 1},
    }
    payload = {"action": "closed", "pull_request": pull, "repository": REPOSITORY}
    (event,) = _map("pull_request", payload)
    assert event.event_type == "PullRequestStatusChanged"
    assert (event.payload["status"], event.payload["merged"]) == ("closed", False)
    pull["merged"] = True
    assert [e.event_type for e in _map("pull_request", payload)] == [
        "PullRequestStatusChanged",
        "PrMerged",
    ]


def test_match_filters() -> None:
    payload = {"repoKey": "default:a/b", "draft": False, "count": 0, "nested": {"x": 1}}
    assert matches(None, payload) and matches({}, payload)
    assert matches({"repoKey": "default:a/b", "nested.x": 1}, payload)
    assert matches({"repoKey": ["default:c/d", "default:a/b"]}, payload)
    assert not matches({"draft": 0}, payload)  # a flag never equals a number
    assert not matches({"count": False}, payload)
    assert not matches({"missing": 1}, payload)
    assert len(EVENT_TYPES) == 16


def test_a_gitea_1_9_comment_on_a_pull_request_is_a_pull_request_comment() -> None:
    # Gitea 1.9 sent no is_pull: the issue's non-null pull_request is the only mark.
    comment = {"id": 9, "body": "hi", "user": {"login": "alice"}}
    pull_meta = {"merged": False, "merged_at": None}
    payload = {
        "action": "created",
        "comment": comment,
        "issue": {"number": 2, "pull_request": pull_meta},
        "repository": REPOSITORY,
    }
    (event,) = _map("issue_comment", payload)
    assert event.payload["isPull"] is True
    assert event.payload["resourceKey"] == "default:acme/widget:pull_request:2"
    payload["issue"] = {"number": 2, "pull_request": None}
    (event,) = _map("issue_comment", payload)
    assert event.payload["isPull"] is False
