"""What every REST handler shares: authentication, repository lookup, errors, JSON."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from .convert import Converter
from .delivery import Deliverer
from .gojson import go_json
from .service import Outcome, Service
from .state import Access, NotFound, Repo, State, User


@dataclass
class Core:
    """The emulated instance: its data and the services that act on it."""

    state: State
    convert: Converter
    service: Service
    deliverer: Deliverer
    version: str

    @property
    def swagger_url(self) -> str:
        return f"{self.convert.app_url}api/swagger"


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.not_found = not_found


def not_found(message: str = "") -> ApiError:
    return ApiError(404, message, not_found=True)


def error_body(core: Core, error: ApiError) -> dict[str, Any]:
    """Gitea services/context/api.go: APIError writes {message, url};
    APIErrorNotFound writes {errors, message: "The target couldn't be found.", url}."""
    if error.not_found:
        return {
            "errors": [error.message] if error.message else [],
            "message": "The target couldn't be found.",
            "url": core.swagger_url,
        }
    return {"message": error.message, "url": core.swagger_url}


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(go_json(data), status, headers, media_type="application/json;charset=utf-8")


def empty(status: int = 204) -> Response:
    return Response(b"", status)


def parse_basic(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value.strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user, password


def authenticate(state: State, header: str, query: Mapping[str, str]) -> User | None:
    """Gitea services/auth: a token from `Authorization: token|bearer`, `?token=`,
    `?access_token=`, or Basic auth. An unknown token leaves the caller anonymous (OAuth2
    Verify returns no user); Basic credentials that match nothing are an error (401)."""
    with state.lock:
        scheme, _, value = header.partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return state.user_for_token(value.strip())
        basic = parse_basic(header) if header else None
        if basic is not None:
            name, password = basic
            # services/auth/basic.go: the username is the token when the password is empty
            # or "x-oauth-basic", else the password is tried as a token (user name unchecked).
            token = name if password in ("", "x-oauth-basic") else password
            user = state.user_for_token(token)
            if user is None:
                raise ApiError(401, "invalid username, password or token")
            return user
        for key in ("token", "access_token"):
            if query.get(key):
                return state.user_for_token(query[key])
    return None


@dataclass
class Call:
    """One API request as a handler sees it (handlers run in a worker thread)."""

    core: Core
    method: str
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: bytes
    doer: User | None

    @property
    def state(self) -> State:
        return self.core.state

    @property
    def convert(self) -> Converter:
        return self.core.convert

    @property
    def service(self) -> Service:
        return self.core.service

    def json(self) -> Any:
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise ApiError(422, f"invalid JSON: {exc}") from None

    def form(self) -> dict[str, Any]:
        data = self.json()
        if not isinstance(data, dict):
            raise ApiError(422, "expected a JSON object")
        return data

    def token_user(self) -> User:
        """Gitea api.go reqToken(): 401 "token is required" without a signed-in user."""
        if self.doer is None:
            raise ApiError(401, "token is required")
        return self.doer

    def int_param(self, name: str) -> int:
        try:
            return int(self.params[name])
        except ValueError:
            raise not_found() from None

    def repo(self) -> tuple[Repo, Access]:
        """Gitea api.go repoAssignment: 404 when the repository is missing or the doer
        has no access to it (a private repository is not revealed)."""
        try:
            repo = self.state.repo_by_name(self.params["owner"], self.params["repo"])
        except NotFound:
            raise not_found() from None
        mode = self.state.access(repo, self.doer)
        if mode < Access.READ:
            raise not_found()
        return repo, mode

    def repo_admin(self) -> tuple[Repo, User]:
        """Gitea api.go reqToken() + reqAdmin(): 403 below admin access to the repository."""
        repo, mode = self.repo()  # repoAssignment() runs before reqToken()
        doer = self.token_user()
        if mode < Access.ADMIN:
            raise ApiError(
                403, "user should be an owner or a collaborator with admin write of a repository"
            )
        return repo, doer

    def user_param(self, name: str, status: int = 404) -> User:
        try:
            return self.state.user_by_login(self.params[name])
        except NotFound as exc:
            raise ApiError(status, str(exc), not_found=status == 404) from None

    def page(self) -> tuple[int, int]:
        """Gitea utils.GetListOptions: page from 1, limit default 30, at most 50."""
        try:
            page = max(int(self.query.get("page", "1") or 1), 1)
            limit = int(self.query.get("limit", "30") or 30)
        except ValueError:
            raise ApiError(422, "invalid page or limit") from None
        limit = 30 if limit <= 0 else min(limit, 50)
        return page, limit

    def deliver(self, outcome: Outcome) -> None:
        # Gitea answers the request, then its hook queue delivers.
        self.core.deliverer.enqueue(outcome.tasks)


Handler = Callable[[Call], Response]
RouteSpec = tuple[str, str, Handler]


def paginate(call: Call, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
    page, limit = call.page()
    start = (page - 1) * limit
    return items[start : start + limit], {"X-Total-Count": str(len(items))}
