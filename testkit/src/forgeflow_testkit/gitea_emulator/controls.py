"""Hooks, deliveries and fault injection of GiteaEmulator (a mixin of its class)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from .delivery import Deliverer, Delivery, HookTask, hook_events, signature_headers
from .gojson import go_json
from .state import Fault, Hook, Reaction, State


class EmulatorControls:
    _state: State
    _deliverer: Deliverer

    def add_org(self, name: str, *, owners: tuple[str, ...] | list[str] = ()) -> None:
        """An organization; members of `owners` get owner access to its repositories."""
        with self._state.lock:
            org = self._state.find_user(name) or self._state.create_user(name, is_org=True)
            org.is_org = True
            org.org_owner_ids.update(self._state.user_by_login(o).id for o in owners)

    # -- OAuth2 (Gitea as a provider: oauth_state.py, web_oauth.py) ---------------------

    def set_password(self, login: str, password: str) -> None:
        """The password the user signs in with on the emulator's web pages."""
        with self._state.lock:
            self._state.oauth.passwords[self._state.user_by_login(login).id] = password

    def oauth_apps(self, owner: str) -> list[dict[str, Any]]:
        """The OAuth2 applications of ``owner`` (with their secrets: for assertions)."""
        with self._state.lock:
            uid = self._state.user_by_login(owner).id
            return [vars(a).copy() for a in self._state.oauth.apps.values() if a.uid == uid]

    def oauth_tokens(self) -> list[str]:
        """Every OAuth2 access and refresh token issued so far (tests look for leaks)."""
        with self._state.lock:
            return [*self._state.oauth.access, *self._state.oauth.refresh]

    def oauth_access_seconds(self, seconds: int) -> None:
        """setting.OAuth2.AccessTokenExpirationTime for tokens issued from now on."""
        with self._state.lock:
            self._state.oauth.access_seconds = seconds

    # -- reactions and comment edits ----------------------------------------------------

    def allow_reactions(self, *allowed: str) -> None:
        """setting.UI.Reactions: a reaction not listed is refused with 403."""
        with self._state.lock:
            self._state.allowed_reactions = tuple(allowed)

    def reactions_on(
        self, *, comment_id: int | None = None, issue_id: int | None = None
    ) -> list[Reaction]:
        """The reactions on a comment, or on an issue's own body (by the issue's id)."""
        with self._state.lock:
            if comment_id is not None:
                return [r for r in self._state.reactions if r.comment_id == comment_id]
            return [
                r for r in self._state.reactions if r.issue_id == issue_id and r.comment_id == 0
            ]

    def comment_history(self, comment_id: int) -> list[str]:
        """Every body the comment had, oldest first, its current one last."""
        with self._state.lock:
            comment = self._state.comment(comment_id)
            return [body for _, body in comment.history] + [comment.body]

    # -- hooks and deliveries -----------------------------------------------------------

    def add_hook(
        self,
        owner: str,
        repo: str,
        *,
        url: str,
        secret: str,
        events: list[str] | None = None,
        active: bool = True,
        org: str | None = None,
        content_type: str = "json",
        branch_filter: str = "",
    ) -> int:
        """A "gitea" hook on the repository, or on organization `org` when given.
        `events=None` is the UI's "all events" (send_everything); a list is read like
        CreateHookOption.events ("issues" and "pull_request" include their sub-events)."""
        with self._state.lock:
            if org is not None:
                owner_user = self._state.find_user(org)
                if owner_user is None:
                    self.add_org(org)
                    owner_user = self._state.user_by_login(org)
                repo_id, owner_id = 0, owner_user.id
            else:
                repo_id, owner_id = self._state.repo_by_name(owner, repo).id, 0
            now = self._state.now()
            hook = Hook(
                id=self._state.next_id("webhook"),
                repo_id=repo_id,
                owner_id=owner_id,
                url=url,
                secret=secret,
                events=hook_events(events or []),
                send_everything=events is None,
                active=active,
                created=now,
                updated=now,
                content_type=content_type,
                branch_filter=branch_filter,
            )
            self._state.hooks[hook.id] = hook
            return hook.id

    def set_hook_url(self, hook_id: int, url: str) -> None:
        """Point a hook elsewhere, as an admin editing it would (EditHook): deliveries
        made meanwhile fail and can be sent again with :meth:`redeliver`."""
        with self._state.lock:
            self._state.hooks[hook_id].url = url

    def hook_secret(self, hook_id: int) -> str:
        """The secret a hook signs with (Gitea's API never shows it; tests may look)."""
        with self._state.lock:
            return self._state.hooks[hook_id].secret

    @property
    def deliveries(self) -> list[Delivery]:
        with self._state.lock:
            return list(self._deliverer.deliveries)

    def delivery_of_comment(self, comment_id: int, *, action: str = "created") -> Delivery:
        """The first delivery about comment `comment_id` with payload action `action`. A
        test that posts a comment reads its answer here, never as "the last delivery": the
        hook worker delivers the bot's own comments at the same time."""
        with self._state.lock:
            for delivery in self._deliverer.deliveries:
                if delivery.comment_id == comment_id and delivery.payload.get("action") == action:
                    return delivery
        raise LookupError(f"no {action!r} delivery of comment {comment_id}")

    def flush_deliveries(self, timeout: float = 10.0) -> None:
        """Wait for the deliveries of changes made through the REST API or git pushes."""
        self._deliverer.flush(timeout)

    def redeliver(self, delivery: Delivery, *, new_id: bool = True) -> Delivery:
        """Gitea's "Replay" (ReplayHookTask): the same payload under a new delivery UUID,
        signed with the hook's current secret. new_id=False repeats the same UUID, as a
        network-level duplicate would."""
        task = HookTask(delivery.hook_id, delivery.event_type, delivery.content)
        if not new_id:
            task.delivery_id = delivery.delivery_id
        result = self._deliverer.send(task)
        if result is None:
            raise LookupError(f"hook {delivery.hook_id} no longer exists")
        return result

    def build_delivery(
        self,
        owner: str,
        repo: str,
        event: str,
        payload: dict[str, Any],
        *,
        secret: str,
        delivery_id: str | None = None,
        flavour: str = "gitea",
    ) -> tuple[dict[str, str], bytes]:
        """Headers and raw body of a delivery, without sending it. `event` is the hook event
        type; "issue_comment" on a pull request becomes "pull_request_comment" as in Gitea."""
        event_type = event
        if event == "issue_comment" and payload.get("is_pull"):
            event_type = "pull_request_comment"
        content = go_json(payload, indent=True)
        task = HookTask(0, event_type, content)
        headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}
        headers.update(
            signature_headers(event_type, delivery_id or task.delivery_id, secret, content, flavour)
        )
        return headers, content

    # -- test controls --------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        path_regex: str,
        *,
        status: int = 500,
        count: int = 1,
        delay: float = 0.0,
        after: bool = False,
    ) -> None:
        """The next `count` requests whose method matches (or "*") and whose path matches
        `path_regex` (re.search) wait `delay` seconds, then get `status` instead of their
        answer; status=0 only delays them. ``after``: each is handled first and its
        answer (whatever the status) held for `delay`."""
        with self._state.lock:
            self._state.faults.append(
                Fault(method.upper(), re.compile(path_regex), status, count, delay, after)
            )

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        with self._state.lock:
            return list(self._state.requests)

    def advance_clock(self, seconds: float) -> None:
        """Move the emulator's clock (timestamps have one-second resolution, as in Gitea)."""
        with self._state.lock:
            self._state.clock_offset += timedelta(seconds=seconds)
