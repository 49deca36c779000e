"""Deliveries shaped as older Gitea releases sent them (a mixin of GiteaEmulator).

The emulator speaks current Gitea. These builders take its payloads and change what an
older release sent differently, as that release's source shows:

- Gitea 1.9 and older (models/webhook.go ``deliver``, modules/structs/hook.go): the
  ``X-Gitea-Event`` header carried the hook event type itself, there was no
  ``X-Gitea-Event-Type`` and no ``X-Hub-Signature*``; every payload began with
  ``secret`` (the hook's own secret); an IssueCommentPayload had no ``is_pull`` and no
  ``pull_request``, and an issue's ``pull_request`` was PullRequestMeta ``{merged,
  merged_at}``, null on a plain issue. A comment on a pull request came as
  ``issue_comment``.
- Gitea 1.10 to 1.19.0 (webhook notifier ``NotifyPullRequestReview``): a review
  submitted as "Comment" was delivered as the hook event ``pull_request_comment`` with a
  PullRequestPayload: ``action: "reviewed"``, ``review: {type, content}``, no
  ``comment``. Releases with ``X-Gitea-Event-Type`` sent ``X-Gitea-Event: issue_comment``
  beside it; earlier ones sent ``X-Gitea-Event: pull_request_comment`` alone.

Nothing is sent: each builder returns the headers and raw body, for a test to post.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

from .convert import JSON
from .delivery import signature_headers
from .gojson import go_json
from .service import Service
from .state import Issue, State

Built = tuple[dict[str, str], bytes]


def old_headers(event_type: str, delivery_id: str, secret: str, content: bytes) -> dict[str, str]:
    """The headers of Gitea 1.9's ``HookTask.deliver``: the event type in every
    ``*-Event`` header, one SHA-256 signature (``t.Signature``)."""
    signature = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest() if secret else ""
    return {
        "Content-Type": "application/json",
        "User-Agent": "GiteaServer",
        "X-Gitea-Delivery": delivery_id,
        "X-Gitea-Event": event_type,
        "X-Gitea-Signature": signature,
        "X-Gogs-Delivery": delivery_id,
        "X-Gogs-Event": event_type,
        "X-Gogs-Signature": signature,
        "X-GitHub-Delivery": delivery_id,
        "X-GitHub-Event": event_type,
    }


class LegacyDeliveries:
    _state: State
    _service: Service

    def _find(self, owner: str, repo: str, index: int) -> Issue:
        return self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)

    def gitea_1_9_comment_delivery(
        self,
        owner: str,
        repo: str,
        index: int,
        comment: dict[str, Any],
        *,
        sender: str,
        secret: str,
    ) -> Built:
        """What Gitea 1.9 sent when `sender` created `comment` (shaped as
        ``post_comment`` returns it) on issue or pull request `index`, signed with
        `secret`."""
        with self._state.lock:
            issue = self._find(owner, repo, index)
            current = self._service.payloads.issue_comment_payload(
                "created", issue, comment, self._state.user_by_login(sender)
            )
        issue_json: JSON = dict(current["issue"])
        meta = issue_json.get("pull_request")
        if meta is not None:
            issue_json["pull_request"] = {"merged": meta["merged"], "merged_at": meta["merged_at"]}
        payload: JSON = {"secret": secret, "action": "created", "issue": issue_json}
        for key in ("comment", "changes", "repository", "sender"):
            if key in current:
                payload[key] = current[key]
        content = go_json(payload, indent=True)
        return old_headers("issue_comment", str(uuid.uuid4()), secret, content), content

    def review_comment_delivery(
        self,
        owner: str,
        repo: str,
        index: int,
        *,
        reviewer: str,
        content: str,
        secret: str,
        event_type_header: bool = True,
    ) -> Built:
        """What Gitea 1.10 to 1.19.0 sent when `reviewer` submitted a "Comment" review
        with text `content` on pull request `index`. `event_type_header=False` gives the
        headers of the releases before ``X-Gitea-Event-Type``."""
        with self._state.lock:
            issue = self._find(owner, repo, index)
            payload = self._service.payloads.pull_payload(
                "reviewed", issue, self._state.user_by_login(reviewer)
            )
        payload["review"] = {"type": "pull_request_comment", "content": content}
        body = go_json(payload, indent=True)
        delivery_id = str(uuid.uuid4())
        if not event_type_header:
            return old_headers("pull_request_comment", delivery_id, secret, body), body
        headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}
        headers.update(signature_headers("pull_request_comment", delivery_id, secret, body))
        return headers, body
