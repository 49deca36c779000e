"""Sign-in, sign-out and every operator control of the admin pages.

Controls run through :func:`forgeflow.tasks.controls.run`, exactly like the JSON API: one
transaction with their ``requestId`` record, so a form submitted twice acts once.
Each answer is a redirect back (post/redirect/get) with a one-time message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.guard import TokenGuard
from forgeflow.store import repos, tasks
from forgeflow.tasks import controls
from forgeflow.web import access
from forgeflow.web.render import UiRoute, render, services
from forgeflow.web.security import (
    OPERATOR_RE,
    NotFound,
    Posted,
    check_login_nonce,
    check_same_site,
    end_session,
    live_session,
    login_nonce,
    read_form,
    remember_login_nonce,
    require_operator_post,
    require_post,
    safe_next,
    set_flash,
    start_session,
)

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
Post = Annotated[Posted, Depends(require_post)]
OperatorPost = Annotated[Posted, Depends(require_operator_post)]
ControlFn = Callable[[Connection, controls.ControlRequest], controls.Outcome]


def _login_page(
    request: Request, next_url: str, operator: str, error: str | None, status: int
) -> Response:
    nonce = login_nonce(request)
    context = {
        "next": next_url,
        "operator": operator,
        "error": error,
        "csrf": nonce,
        "gitea_sign_in": services(request).oauth is not None,
    }
    response = render(request, "login.html", context, session=None, status=status)
    remember_login_nonce(request, response, nonce)
    return response


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    if await live_session(request) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return _login_page(request, safe_next(next), "admin", None, 200)


@router.post("/login")
async def login(request: Request) -> Response:
    check_same_site(request)
    form = await read_form(request)
    check_login_nonce(request, form.get("csrf", ""))
    next_url = safe_next(form.get("next"))
    operator = (form.get("operator") or "admin").strip()
    if not OPERATOR_RE.match(operator):
        message = "operator: letters, digits and _ . @ - only (at most 100)"
        return _login_page(request, next_url, "admin", message, 400)
    guard: TokenGuard = request.app.state.guard
    address = request.client.host if request.client else "unknown"
    wait = await guard.refuse_throttled(address, "ui.signin.reject")
    if wait is not None:
        message = f"Too many wrong tokens from your address; try again in {int(wait) + 1} s."
        page = _login_page(request, next_url, operator, message, 429)
        page.headers["Retry-After"] = str(int(wait) + 1)
        return page
    if not await guard.check(form.get("token", ""), address, "ui.signin.reject"):
        return _login_page(request, next_url, operator, "That is not the admin token.", 401)
    response = RedirectResponse(next_url, status_code=303)
    await start_session(request, response, operator)
    return response


@router.post("/logout")
async def logout(request: Request, posted: Post) -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    await end_session(request, response, posted.session)
    return response


def _message(action: str, body: JsonObject) -> str:
    if action in ("pause", "resume"):
        return "Paused: no new task is claimed." if body.get("globalPaused") else "Resumed."
    if action.startswith("repo."):
        return f"{body.get('repoKey')} is {body.get('status')}."
    verb = action.removeprefix("task.")
    changed = "" if body.get("changed", True) else " (it already was)"
    return f"{verb}: task {body.get('taskId')} is {body.get('state')}{changed}."


async def run_control(
    request: Request,
    posted: Posted,
    action: str,
    target: str,
    fn: ControlFn,
    *,
    describe: Callable[[JsonObject], str] | None = None,
    goto: Callable[[JsonObject], str | None] | None = None,
) -> Response:
    """Run one control through :func:`controls.run` and redirect with its message.

    ``describe`` words the answer (default: the task and repository controls);
    ``goto`` may pick the page to land on from a successful answer.
    """
    request_id = posted.form.get("requestId", "").strip()
    reason = (posted.form.get("reason") or "").strip()[:2000] or None
    if not 1 <= len(request_id) <= 200:
        response = RedirectResponse(safe_next(posted.form.get("next")), status_code=303)
        set_flash(request, response, False, "invalid_request: the form had no requestId")
        return response
    kind = "gitea" if posted.session.gitea else "admin"
    req = controls.ControlRequest(request_id, posted.session.operator, reason, kind)
    status, body = await services(request).store.write(
        lambda c: controls.run(c, req, action, target, fn)
    )
    engine = services(request).pipelines
    if engine is not None:
        engine.wake()
    landing = goto(body) if goto is not None and status < 300 else None
    response = RedirectResponse(safe_next(landing or posted.form.get("next")), status_code=303)
    if status >= 300:
        text = f"{body.get('error', 'error')}: {body.get('message', '')}".strip()
    else:
        text = describe(body) if describe is not None else _message(action, body)
    if body.get("replayed"):
        text += " Repeated request: nothing was done again."
    set_flash(request, response, status < 300, text)
    return response


async def _may_control(request: Request, posted: Posted, task_id: str) -> None:
    """A Gitea user controls a task only with write permission on its repository (and
    finds no task of a repository they cannot read)."""
    if posted.session.operator_rights:
        return
    task = await services(request).store.read(lambda c: tasks.get(c, task_id))
    if task is None:
        raise NotFound(f"no task {task_id}")
    await access.require_write(request, posted.session, task.repo_key, f"no task {task_id}")


async def _control(
    request: Request, posted: Posted, action: str, target: str, fn: ControlFn
) -> Response:
    return await run_control(request, posted, action, target, fn)


@router.post("/control/pause")
async def pause(request: Request, posted: OperatorPost) -> Response:
    return await _control(request, posted, "pause", "global", controls.pause)


@router.post("/control/resume")
async def resume(request: Request, posted: OperatorPost) -> Response:
    return await _control(request, posted, "resume", "global", controls.resume)


@router.post("/repos/{repo_key:path}/disable")
async def disable_repo(request: Request, posted: OperatorPost, repo_key: str) -> Response:
    fn = controls.set_repo_status(repos.DISABLED, repo_key)
    return await _control(request, posted, "repo.disable", repo_key, fn)


@router.post("/repos/{repo_key:path}/enable")
async def enable_repo(request: Request, posted: OperatorPost, repo_key: str) -> Response:
    fn = controls.set_repo_status(repos.ACTIVE, repo_key)
    return await _control(request, posted, "repo.enable", repo_key, fn)


@router.post("/tasks/{task_id}/cancel")
async def cancel_task(request: Request, posted: Post, task_id: str) -> Response:
    await _may_control(request, posted, task_id)
    return await _control(request, posted, "task.cancel", task_id, controls.cancel(task_id))


@router.post("/tasks/{task_id}/abort")
async def abort_task(request: Request, posted: Post, task_id: str) -> Response:
    await _may_control(request, posted, task_id)
    return await _control(request, posted, "task.abort", task_id, controls.abort(task_id))


@router.post("/tasks/{task_id}/release")
async def release_task(request: Request, posted: Post, task_id: str) -> Response:
    await _may_control(request, posted, task_id)
    return await _control(request, posted, "task.release", task_id, controls.release(task_id))
