"""A repository's environment (issue #26) under ``/api/gitea-workflow``: read it with
its root's and last setup's state, set it, set its setup secrets (values are never
answered back, audited or kept in a control's stored answer)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.agent.envroot import BASE_PACKAGES, host_suite
from forgeflow.api.auth import require_admin
from forgeflow.api.control import ControlBody
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import no_nul_parameters
from forgeflow.api.schemas import ADMIN_ERRORS, UNMATCHED, answer, error
from forgeflow.domain import environment as rules
from forgeflow.domain.environment import Environment, EnvironmentInvalid
from forgeflow.domain.ids import InvalidName, parse_repo_key
from forgeflow.domain.json import JsonObject
from forgeflow.redaction import register_secrets
from forgeflow.services import Services, forbidden_paths
from forgeflow.store import audit
from forgeflow.store import environments as q
from forgeflow.store.schema import environment_roots, environment_setups
from forgeflow.tasks import controls

router = APIRouter(
    prefix="/api/gitea-workflow",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["control"],
    responses=ADMIN_ERRORS,
)


class EnvironmentView(BaseModel):
    repoKey: str
    environment: dict[str, Any]
    setupSecrets: list[str] = Field(description="names only: values are never answered")
    root: dict[str, Any] | None = Field(description="the root of its package list, if any")
    setup: dict[str, Any] | None = Field(description="its last setup run, if any")


class EnvironmentBody(ControlBody):
    environment: dict[str, Any] = Field(
        description="packages, suite, binds, variables, setupScript, setupTimeoutSeconds"
    )


class SecretsBody(ControlBody):
    secrets: dict[str, str | None] = Field(description="name → value; null removes it")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _repo(repo_key: str) -> str:
    try:
        parse_repo_key(repo_key)
    except InvalidName as exc:
        raise ApiError(404, "repository_not_found", str(exc)) from None
    return repo_key


def _root_key(env: Environment) -> str | None:
    root = rules.root_key(env, host_suite(), BASE_PACKAGES)
    return root.key if root else None


def _view(conn: Connection, repo_key: str) -> JsonObject:
    return q.view_for(conn, repo_key, host_suite(), BASE_PACKAGES)


@router.get(
    "/repos/{repoKey:path}/environment",
    response_model=None,
    responses={
        200: answer(EnvironmentView, "the environment and its state"),
        404: error(f"repository_not_found, or {UNMATCHED}"),
    },
)
async def get_environment(request: Request, repoKey: str) -> JsonObject:
    """The repository's environment, its root's state (building, ready, failed; size,
    last use) and its last setup run with its log."""
    key = _repo(repoKey)
    return await _services(request).store.read(lambda c: _view(c, key))


def _parse(services: Services, raw: dict[str, Any]) -> Environment:
    try:
        env = rules.parse(raw, forbidden_paths(services.settings))
        for i, bind in enumerate(env.binds):
            # The path as the host resolves it (links followed) is checked too.
            real = os.path.realpath(bind)
            rules.check_not_forbidden(f"binds[{i}]", real, forbidden_paths(services.settings))
    except EnvironmentInvalid as exc:
        raise ApiError(400, "invalid_environment", str(exc), field=exc.field) from None
    return env


@router.put(
    "/repos/{repoKey:path}/environment",
    response_model=None,
    responses={
        200: answer(EnvironmentView, "set; a repeated requestId answers the first"),
        400: error("invalid_environment (field names what is wrong) or invalid_request"),
        404: error(f"repository_not_found, or {UNMATCHED}"),
        409: error("request_id_conflict: the requestId was used for another action"),
    },
)
async def put_environment(request: Request, repoKey: str, body: EnvironmentBody) -> JSONResponse:
    """Declare the repository's environment. Setting it again (even unchanged) lets a
    failed build or setup run again at the next mention."""
    key = _repo(repoKey)
    env = _parse(_services(request), body.environment)

    def apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        q.put(conn, key, env)
        # An operator's "try again": a failed root of this list and the last setup go.
        root = _root_key(env)
        if root is not None:
            conn.execute(
                environment_roots.delete().where(
                    environment_roots.c.root_key == root, environment_roots.c.state == "failed"
                )
            )
        conn.execute(environment_setups.delete().where(environment_setups.c.repo_key == key))
        event = audit.AuditEvent(
            action="environment.set",
            actor=req.actor,
            repo_key=key,
            metadata={"environment": env.json(), "reason": req.reason},
        )
        audit.append(conn, event)
        return 200, _view(conn, key)

    return await _control(request, body, "repo.environment", key, apply)


@router.put(
    "/repos/{repoKey:path}/environment/secrets",
    response_model=None,
    responses={
        200: answer(EnvironmentView, "set; a repeated requestId answers the first"),
        400: error("invalid_environment (field names the secret) or invalid_request"),
        404: error(f"repository_not_found, or {UNMATCHED}"),
        409: error("request_id_conflict: the requestId was used for another action"),
    },
)
async def put_secrets(request: Request, repoKey: str, body: SecretsBody) -> JSONResponse:
    """Set (or with null remove) setup secrets: given to the setup run only."""
    key = _repo(repoKey)
    if len(body.secrets) > rules.MAX_SECRETS:
        raise ApiError(400, "invalid_environment", "secrets: too many", field="secrets")
    try:
        values = {
            n: (None if v is None else rules.check_secret(n, v)) for n, v in body.secrets.items()
        }
    except EnvironmentInvalid as exc:
        raise ApiError(400, "invalid_environment", str(exc), field=exc.field) from None
    register_secrets([v for v in values.values() if v is not None])

    def apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        q.set_secrets(conn, key, values)
        event = audit.AuditEvent(
            action="environment.secrets",
            actor=req.actor,
            repo_key=key,
            metadata={
                "set": [n for n in sorted(values) if values[n] is not None],
                "removed": [n for n in sorted(values) if values[n] is None],
            },
        )
        audit.append(conn, event)
        return 200, _view(conn, key)

    return await _control(request, body, "repo.environment_secrets", key, apply)


async def _control(
    request: Request, body: ControlBody, action: str, target: str, fn: controls.Control
) -> JSONResponse:
    req = controls.ControlRequest(body.requestId, body.operator or "admin", body.reason)
    status, payload = await _services(request).store.write(
        lambda c: controls.run(c, req, action, target, fn)
    )
    return JSONResponse(payload, status_code=status)
