"""Gitea's OAuth2 provider pages and endpoints (Gitea 1.22 routers/web/auth/
oauth2_provider.go, the sign-in form of routers/web/auth/auth.go):

- ``GET /user/login`` and ``POST /user/login``: the sign-in form (user name, password);
- ``GET /login/oauth/authorize``: the grant page a signed-in user answers (a real HTML
  form); ``POST /login/oauth/grant`` sends the answer back to the client's redirect URI;
- ``POST /login/oauth/access_token``: authorization_code (client secret, redirect URI,
  one-use code, PKCE verifier) and refresh_token grants;
- ``GET /login/oauth/userinfo``: who an OAuth2 access token belongs to.
"""

from __future__ import annotations

import base64
import html
import secrets
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .apibase import Core, json_response
from .oauth_state import Grant, OAuthApp
from .state import State, User
from .web_oauth_token import exchange

COOKIE = "i_like_gitea"  # Gitea's session cookie name


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)} - Gitea</title></head><body>{body}</body></html>"
    )
    return HTMLResponse(doc, status)


def _error_page(description: str) -> HTMLResponse:
    # templates/user/auth/grant_error.tmpl, answered 400 without a redirect URI to use.
    return _page("Authorization failed", f"<p class='error'>{html.escape(description)}</p>", 400)


def _with_query(uri: str, params: dict[str, str]) -> str:
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def _redirect_error(uri: str, code: str, description: str, state: str) -> Response:
    """handleAuthorizeError with a redirect URI: error, error_description and state."""
    target = _with_query(uri, {"error": code, "error_description": description, "state": state})
    return RedirectResponse(target, status_code=303)


class OAuthWeb:
    def __init__(self, core: Core) -> None:
        self.core = core
        # the authorize request a web session is answering (Gitea keeps it in the session)
        self.pending: dict[str, dict[str, str]] = {}

    @property
    def state(self) -> State:
        return self.core.state

    def _user(self, request: Request) -> tuple[str, User] | None:
        sid = request.cookies.get(COOKIE, "")
        with self.state.lock:
            uid = self.state.oauth.web_sessions.get(sid)
            return (sid, self.state.users[uid]) if uid is not None else None

    # -- sign-in ---------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        target = html.escape(request.query_params.get("redirect_to", "/"))
        return _page(
            "Sign In",
            "<h1>Sign In</h1><form method='post' action='/user/login'>"
            f"<input type='hidden' name='redirect_to' value='{target}'>"
            "<label>Username or Email Address <input name='user_name' id='user_name'></label>"
            "<label>Password <input type='password' name='password' id='password'></label>"
            "<button type='submit'>Sign In</button></form>",
        )

    async def login(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))
        name, password = form.get("user_name", ""), form.get("password", "")
        with self.state.lock:
            user = self.state.find_user(name)
            known = self.state.oauth.passwords.get(user.id) if user else None
            if user is None or known is None or not secrets.compare_digest(known, password):
                return _page("Sign In", "<p class='error'>Username or password is incorrect.</p>")
            sid = secrets.token_hex(16)
            self.state.oauth.web_sessions[sid] = user.id
        target = form.get("redirect_to", "/")
        response = RedirectResponse(target if target.startswith("/") else "/", status_code=303)
        response.set_cookie(COOKIE, sid, httponly=True, samesite="lax", path="/")
        return response

    # -- authorize and grant -----------------------------------------------------------

    async def authorize(self, request: Request) -> Response:
        q = dict(request.query_params)
        state = q.get("state", "")
        with self.state.lock:
            app = self.state.oauth.app_by_client_id(q.get("client_id", ""))
        if app is None:
            return _error_page("Client ID not registered")
        uri = q.get("redirect_uri", "")
        if uri not in app.redirect_uris:
            return _error_page("Unregistered Redirect URI")
        if q.get("response_type") != "code":
            return _redirect_error(
                uri, "unsupported_response_type", "Only code response type is supported.", state
            )
        method = q.get("code_challenge_method", "")
        if method not in ("S256", "plain", ""):
            return _redirect_error(
                uri, "invalid_request", "unsupported code challenge method", state
            )
        if method == "" and not app.confidential_client:
            return _redirect_error(
                uri, "invalid_request", "PKCE is required for public clients", state
            )
        signed_in = self._user(request)
        if signed_in is None:  # reqSignIn: off to the sign-in form, then back here
            back = request.url.path + "?" + request.url.query
            return RedirectResponse("/user/login?" + urlencode({"redirect_to": back}), 303)
        sid, user = signed_in
        with self.state.lock:
            grant = self.state.oauth.grant_of(app, user.id)
            if grant is not None and (app.confidential_client or app.skip_secondary_authorization):
                grant.scope = q.get("scope", "")
                code = self.state.oauth.new_code(
                    grant, uri, q.get("code_challenge", ""), method, self.state.now()
                )
                return RedirectResponse(_code_redirect(uri, code, state), 303)
        csrf = secrets.token_urlsafe(16)
        self.pending[sid] = {
            "client_id": app.client_id,
            "redirect_uri": uri,
            "state": state,
            "challenge": q.get("code_challenge", ""),
            "method": method,
            "csrf": csrf,
        }
        return _grant_page(app, user, uri, state, q.get("scope", ""), csrf)

    async def grant(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))
        signed_in = self._user(request)
        if signed_in is None:
            return PlainTextResponse("Unauthorized", 401)
        sid, user = signed_in
        pending = self.pending.pop(sid, None)
        if (
            pending is None
            or any(form.get(k, "") != pending[k] for k in ("client_id", "state", "redirect_uri"))
            or not secrets.compare_digest(form.get("_csrf", ""), pending["csrf"])
        ):
            return PlainTextResponse("Bad Request", 400)
        uri, state = pending["redirect_uri"], pending["state"]
        if form.get("granted") != "true":
            return _redirect_error(uri, "access_denied", "the request is denied", state)
        with self.state.lock:
            store = self.state.oauth
            app = store.app_by_client_id(pending["client_id"])
            if app is None:
                return _error_page("Client ID not registered")
            grant = store.grant_of(app, user.id)
            if grant is None:
                grant = Grant(store.new_id(), app.id, user.id, form.get("scope", ""))
                store.grants[grant.id] = grant
            grant.scope = form.get("scope", "")
            code = store.new_code(
                grant, uri, pending["challenge"], pending["method"], self.state.now()
            )
        return RedirectResponse(_code_redirect(uri, code, state), 303)

    # -- tokens ------------------------------------------------------------------------

    async def access_token(self, request: Request) -> Response:
        body = (await request.body()).decode("utf-8", "replace")
        form = dict(parse_qsl(body))
        header = request.headers.get("authorization", "")
        if (not form.get("client_id") or not form.get("client_secret")) and header:
            basic = _basic(header)
            if basic is None:
                return _token_error("invalid_request", "cannot parse basic auth header")
            form.setdefault("client_id", basic[0])
            form.setdefault("client_secret", basic[1])
        with self.state.lock:
            status, answer = exchange(self.state, form)
        return json_response(answer, status)

    async def userinfo(self, request: Request) -> Response:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        with self.state.lock:
            now = self.state.now()
            found = (
                self.state.oauth.access.get(token.strip()) if scheme.lower() == "bearer" else None
            )
            if found is None or found[1] <= now:
                return PlainTextResponse(
                    "no valid authorization",
                    401,
                    headers={"WWW-Authenticate": 'Bearer realm="Gitea OAuth2"'},
                )
            grant = self.state.oauth.grants[found[0]]
            user = self.state.users[grant.user_id]
            info = {
                "sub": str(user.id),
                "name": user.full_name or user.login,
                "preferred_username": user.login,
                "email": user.email,
                "picture": f"{self.core.convert.app_url}avatars/{user.id}",
                "groups": None,
            }
        return json_response(info)

    def routes(self) -> list[Route]:
        return [
            Route("/user/login", self.login_form, methods=["GET"]),
            Route("/user/login", self.login, methods=["POST"]),
            Route("/login/oauth/authorize", self.authorize, methods=["GET"]),
            Route("/login/oauth/grant", self.grant, methods=["POST"]),
            Route("/login/oauth/access_token", self.access_token, methods=["POST"]),
            Route("/login/oauth/userinfo", self.userinfo, methods=["GET", "POST"]),
        ]


def _code_redirect(uri: str, code: str, state: str) -> str:
    """OAuth2AuthorizationCode.GenerateRedirectURI: code, and state when there is one."""
    params = {"code": code}
    if state:
        params["state"] = state
    return _with_query(uri, params)


def _grant_page(app: OAuthApp, user: User, uri: str, state: str, scope: str, csrf: str) -> Response:
    """templates/user/auth/grant.tmpl: who asks, where the answer goes, two buttons."""
    e = html.escape
    hidden = "".join(
        f"<input type='hidden' name='{k}' value='{e(v)}'>"
        for k, v in (
            ("_csrf", csrf),
            ("client_id", app.client_id),
            ("state", state),
            ("scope", scope),
            ("nonce", ""),
            ("redirect_uri", uri),
        )
    )
    return _page(
        "Authorize Application",
        f"<h1>Authorize {e(app.name)}</h1><p>Signed in as <strong>{e(user.login)}</strong></p>"
        f"<p>The application will be redirected to <strong>{e(uri)}</strong></p>"
        f"<form method='post' action='/login/oauth/grant'>{hidden}"
        "<button type='submit' name='granted' value='true' id='authorize'>Authorize Application"
        "</button><button type='submit' name='granted' value='false' id='cancel'>Cancel</button>"
        "</form>",
    )


def _basic(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name, _, password = base64.b64decode(value.strip()).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return name, password


def _token_error(code: str, description: str) -> Response:
    answer: dict[str, Any] = {"error": code, "error_description": description}
    return json_response(answer, 400)
