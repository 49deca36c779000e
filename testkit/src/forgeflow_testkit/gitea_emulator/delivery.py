"""Webhook matching, signing and HTTP delivery, as Gitea's services/webhook does it."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import http.client
import json
import queue
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from .gojson import go_json
from .poster import Poster
from .state import Hook, Repo, State

# Gitea modules/webhook/type.go HookEventType.Event(): the X-Gitea-Event value of each type.
EVENT_OF_TYPE: dict[str, str] = {
    "create": "create",
    "delete": "delete",
    "fork": "fork",
    "push": "push",
    "issues": "issues",
    "issue_assign": "issues",
    "issue_label": "issues",
    "issue_milestone": "issues",
    "issue_comment": "issue_comment",
    "pull_request": "pull_request",
    "pull_request_assign": "pull_request",
    "pull_request_label": "pull_request",
    "pull_request_milestone": "pull_request",
    "pull_request_sync": "pull_request",
    "pull_request_review_request": "pull_request",
    "pull_request_comment": "issue_comment",
    "pull_request_review_approved": "pull_request_approved",
    "pull_request_review_rejected": "pull_request_rejected",
    "pull_request_review_comment": "pull_request_comment",
    "wiki": "wiki",
    "repository": "repository",
    "release": "release",
}
_PLAIN = ("create", "delete", "fork", "push", "wiki", "repository", "release")
_ISSUE_SUB = ("issue_assign", "issue_label", "issue_milestone", "issue_comment")
_PULL_SUB = (
    "pull_request_assign",
    "pull_request_label",
    "pull_request_milestone",
    "pull_request_comment",
    "pull_request_review",
    "pull_request_review_request",
    "pull_request_sync",
)
_REVIEW_TYPES = (
    "pull_request_review_approved",
    "pull_request_review_rejected",
    "pull_request_review_comment",
)
HOOK_TYPES = (
    "gitea",
    "gogs",
    "forgejo",
    "slack",
    "discord",
    "dingtalk",
    "telegram",
    "msteams",
    "feishu",
    "matrix",
    "wechatwork",
    "packagist",
)


def hook_events(events: list[str]) -> set[str]:
    """Gitea routers/api/v1/utils/hook.go addHook/editHook: no events means ["push"];
    "issues"/"pull_request" switch on every issue/pull sub-event, "issues_only"/
    "pull_request_only" the plain one; names compare case-insensitively."""
    names = {e.lower() for e in (events or ["push"])}
    enabled = {e for e in _PLAIN if e in names}
    if names & {"issues", "issues_only"}:
        enabled.add("issues")
    if names & {"pull_request", "pull_request_only"}:
        enabled.add("pull_request")
    enabled.update(e for e in _ISSUE_SUB if e in names or "issues" in names)
    enabled.update(e for e in _PULL_SUB if e in names or "pull_request" in names)
    return enabled


def events_array(hook: Hook) -> list[str]:
    """Gitea models/webhook Webhook.EventsArray()."""
    if hook.send_everything:
        return [*_PLAIN[:4], "issues", *_ISSUE_SUB, "pull_request", *_PULL_SUB, *_PLAIN[4:]]
    return sorted(hook.events)


def hook_has_event(hook: Hook, event_type: str) -> bool:
    """Gitea models/webhook Webhook.HasEvent: review kinds share "pull_request_review"."""
    if hook.send_everything:
        return True
    check = "pull_request_review" if event_type in _REVIEW_TYPES else event_type
    return check in hook.events


def branch_matches(pattern: str, branch: str) -> bool:
    """Gitea checkBranch: empty or "*" matches all, otherwise a glob with {a,b} groups."""
    if pattern in ("", "*"):
        return True
    alternatives = [pattern]
    while any("{" in p for p in alternatives):
        expanded: list[str] = []
        for p in alternatives:
            m = re.search(r"\{([^{}]*)\}", p)
            if m is None:
                expanded.append(p)
                continue
            expanded += [p[: m.start()] + part + p[m.end() :] for part in m.group(1).split(",")]
        alternatives = expanded
    return any(fnmatch.fnmatchcase(branch, p) for p in alternatives)


def signature_headers(
    event_type: str, delivery_id: str, secret: str, content: bytes, flavour: str = "gitea"
) -> dict[str, str]:
    """Gitea services/webhook/deliver.go addDefaultHeaders (Forgejo adds X-Forgejo-*).
    Both signatures are HMACs of the payload content; empty when the hook has no secret."""
    sig1 = sig256 = ""
    if secret:
        sig1 = hmac.new(secret.encode(), content, hashlib.sha1).hexdigest()
        sig256 = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest()
    event = EVENT_OF_TYPE.get(event_type, "")
    headers: dict[str, str] = {}
    if flavour == "forgejo":
        headers.update(
            {
                "X-Forgejo-Delivery": delivery_id,
                "X-Forgejo-Event": event,
                "X-Forgejo-Event-Type": event_type,
                "X-Forgejo-Signature": sig256,
            }
        )
    elif flavour != "gitea":
        raise ValueError(f"unknown flavour {flavour!r}")
    headers.update(
        {
            "X-Gitea-Delivery": delivery_id,
            "X-Gitea-Event": event,
            "X-Gitea-Event-Type": event_type,
            "X-Gitea-Signature": sig256,
            "X-Gogs-Delivery": delivery_id,
            "X-Gogs-Event": event,
            "X-Gogs-Event-Type": event_type,
            "X-Gogs-Signature": sig256,
            "X-Hub-Signature": f"sha1={sig1}",
            "X-Hub-Signature-256": f"sha256={sig256}",
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Event": event,
            "X-GitHub-Event-Type": event_type,
        }
    )
    return headers


@dataclass
class Delivery:
    """One attempt to deliver a hook task (Gitea HookTask with its request/response)."""

    delivery_id: str
    hook_id: int
    url: str
    event: str
    event_type: str
    headers: dict[str, str]
    body: bytes
    content: bytes  # the payload JSON, which the signatures cover
    status_code: int | None = None  # None: no HTTP response (connection error, timeout)
    response: str = ""

    @property
    def payload(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.content)
        return parsed

    @property
    def comment_id(self) -> int | None:
        """The id of the comment an issue_comment payload is about, else None."""
        comment = self.payload.get("comment")
        found = comment.get("id") if isinstance(comment, dict) else None
        return found if isinstance(found, int) else None

    @property
    def ok(self) -> bool:
        # deliver.go: "Status code is 20x can be seen as succeed."
        return self.status_code is not None and self.status_code // 100 == 2


@dataclass
class HookTask:
    hook_id: int
    event_type: str
    content: bytes
    delivery_id: str = field(default_factory=lambda: str(uuid.uuid4()))


class Deliverer:
    """Prepares hook tasks under the state lock and sends them outside it, either at once
    (calls from the test) or from one background worker (calls through the API, which
    Gitea answers before its hook queue delivers)."""

    def __init__(self, state: State, flavour: str = "gitea", timeout: float = 10.0) -> None:
        self.state = state
        self.flavour = flavour
        self.deliveries: list[Delivery] = []
        self._poster = Poster(timeout)
        self._queue: queue.Queue[HookTask | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    def prepare(
        self, repo: Repo, event_type: str, payload: dict[str, Any], branch: str | None = None
    ) -> list[HookTask]:
        """Gitea PrepareWebhooks: one task per active hook of the repo or its owner that has
        the event; a branch filter only applies to payloads that name a branch."""
        content = go_json(payload, indent=True)
        tasks = []
        for hook in self.state.hooks_for(repo):
            if not hook_has_event(hook, event_type):
                continue
            if branch is not None and not branch_matches(hook.branch_filter, branch):
                continue
            tasks.append(HookTask(hook.id, event_type, content))
        return tasks

    def send(self, task: HookTask) -> Delivery | None:
        """Gitea services/webhook/deliver.go Deliver, with the hook's current settings."""
        with self.state.lock:
            hook = self.state.hooks.get(task.hook_id)
            if hook is None:
                return None
            url, secret, content_type = hook.url, hook.secret, hook.content_type
            authorization = hook.authorization_header
        headers = {"User-Agent": "Go-http-client/1.1"}
        body = task.content
        if content_type == "form":
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urlencode({"payload": task.content.decode()}).encode()
        else:
            headers["Content-Type"] = "application/json"
        headers.update(
            signature_headers(task.event_type, task.delivery_id, secret, task.content, self.flavour)
        )
        if authorization:
            headers["Authorization"] = authorization
        delivery = Delivery(
            delivery_id=task.delivery_id,
            hook_id=task.hook_id,
            url=url,
            event=EVENT_OF_TYPE.get(task.event_type, ""),
            event_type=task.event_type,
            headers=headers,
            body=body,
            content=task.content,
        )
        try:
            delivery.status_code, delivery.response = self._poster.post(url, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            delivery.response = f"Delivery: {exc}"
        with self.state.lock:
            self.deliveries.append(delivery)
        return delivery

    def deliver_now(self, tasks: list[HookTask]) -> list[Delivery]:
        return [d for d in (self.send(t) for t in tasks) if d is not None]

    def enqueue(self, tasks: list[HookTask]) -> None:
        if not tasks:
            return
        with self.state.lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="gitea-emulator-hooks", daemon=True
                )
                self._worker.start()
        for task in tasks:
            self._queue.put(task)

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                self.send(task)
            finally:
                self._queue.task_done()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued delivery has been attempted."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        if not done.wait(timeout):
            raise TimeoutError("webhook deliveries still pending")

    def close(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=15)
            self._worker = None
        self._poster.close()
