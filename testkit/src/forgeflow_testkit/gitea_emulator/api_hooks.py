"""REST routes of repository and organization webhooks (routers/api/v1/utils/hook.go)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from .apibase import ApiError, Call, RouteSpec, empty, json_response, not_found, paginate
from .delivery import HOOK_TYPES, events_array, hook_events
from .state import Hook, NotFound, User


def _hook_scope(call: Call) -> tuple[int, int, User]:
    """(repo_id, owner_id) of the hooks a route manages, after Gitea's permission checks."""
    if "org" not in call.params:
        repo, doer = call.repo_admin()
        return repo.id, 0, doer
    try:  # orgAssignment() runs before reqToken()
        org = call.state.user_by_login(call.params["org"])
    except NotFound:
        raise not_found() from None
    if not org.is_org:
        raise not_found()
    doer = call.token_user()
    if not doer.is_admin and doer.id not in org.org_owner_ids:  # api.go reqOrgOwnership()
        raise ApiError(403, "Must be an organization owner")
    return 0, org.id, doer


def _find_hook(call: Call) -> Hook:
    repo_id, owner_id, _ = _hook_scope(call)
    hook = call.state.hooks.get(call.int_param("id"))
    if hook is None or (hook.repo_id, hook.owner_id) != (repo_id, owner_id):
        raise not_found()
    return hook


def _hook_json(call: Call, hook: Hook) -> dict[str, Any]:
    return call.convert.hook(hook, events_array(hook))


def list_hooks(call: Call) -> Response:
    repo_id, owner_id, _ = _hook_scope(call)
    hooks = [
        _hook_json(call, h)
        for h in sorted(call.state.hooks.values(), key=lambda h: h.id)
        if (h.repo_id, h.owner_id) == (repo_id, owner_id)
    ]
    page, headers = paginate(call, hooks)
    return json_response(page, headers=headers)


def create_hook(call: Call) -> Response:
    """Gitea addHook: 422 on a bad type or config; active defaults to false; 201."""
    repo_id, owner_id, _ = _hook_scope(call)
    form = call.form()
    config = form.get("config") or {}
    if form.get("type") not in HOOK_TYPES:
        raise ApiError(422, f"Invalid hook type: {form.get('type')}")
    for name in ("url", "content_type"):
        if name not in config:
            raise ApiError(422, f"Missing config option: {name}")
    if config["content_type"] not in ("json", "form"):
        raise ApiError(422, "Invalid content type")
    now = call.state.now()
    hook = Hook(
        id=call.state.next_id("webhook"),
        repo_id=repo_id,
        owner_id=owner_id,
        url=str(config["url"]),
        secret=str(config.get("secret", "")),
        events=hook_events(list(form.get("events") or [])),
        send_everything=False,
        active=bool(form.get("active", False)),
        created=now,
        updated=now,
        type=str(form["type"]),
        content_type=str(config["content_type"]),
        branch_filter=str(form.get("branch_filter") or ""),
        authorization_header=str(form.get("authorization_header") or ""),
    )
    call.state.hooks[hook.id] = hook
    return json_response(_hook_json(call, hook), 201)


def get_hook(call: Call) -> Response:
    return json_response(_hook_json(call, _find_hook(call)))


def edit_hook(call: Call) -> Response:
    """Gitea editHook: config keys update what they name; events are always rewritten
    (none given means ["push"]); active only when present."""
    hook = _find_hook(call)
    form = call.form()
    config = form.get("config") or {}
    if "content_type" in config and config["content_type"] not in ("json", "form"):
        raise ApiError(422, "Invalid content type")
    hook.url = str(config.get("url", hook.url))
    hook.content_type = str(config.get("content_type", hook.content_type))
    hook.secret = str(config.get("secret", hook.secret))
    hook.events, hook.send_everything = hook_events(list(form.get("events") or [])), False
    hook.branch_filter = str(form.get("branch_filter") or "")
    hook.authorization_header = str(form.get("authorization_header") or "")
    if form.get("active") is not None:
        hook.active = bool(form["active"])
    hook.updated = call.state.now()
    return json_response(_hook_json(call, hook))


def delete_hook(call: Call) -> Response:
    hook = _find_hook(call)
    del call.state.hooks[hook.id]
    return empty(204)


ROUTES: list[RouteSpec] = [
    ("GET", "/repos/{owner}/{repo}/hooks", list_hooks),
    ("POST", "/repos/{owner}/{repo}/hooks", create_hook),
    ("GET", "/repos/{owner}/{repo}/hooks/{id}", get_hook),
    ("PATCH", "/repos/{owner}/{repo}/hooks/{id}", edit_hook),
    ("DELETE", "/repos/{owner}/{repo}/hooks/{id}", delete_hook),
    ("GET", "/orgs/{org}/hooks", list_hooks),
    ("POST", "/orgs/{org}/hooks", create_hook),
    ("GET", "/orgs/{org}/hooks/{id}", get_hook),
    ("PATCH", "/orgs/{org}/hooks/{id}", edit_hook),
    ("DELETE", "/orgs/{org}/hooks/{id}", delete_hook),
]
