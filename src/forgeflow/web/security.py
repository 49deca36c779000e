"""Sign-in sessions, CSRF tokens and the checks every admin page goes through.

The session is a signed cookie (HMAC-SHA256 over a small JSON payload) naming a row of
``ui_sessions``: the signature is checked first (no database read for a forged
cookie), then the row, so signing out or an operator ending the session stops a copied
cookie on every process. The key is derived from the admin token, so changing the token
signs everyone out. Hand-written because starlette's SessionMiddleware would need
``itsdangerous`` for twenty lines and keeps no server-side record to end.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.guard import same_secret
from forgeflow.store import gitea_logins, ui_sessions
from forgeflow.store.types import utcnow

SESSION_COOKIE = "ff_session"
LOGIN_COOKIE = "ff_login"
FLASH_COOKIE = "ff_flash"
COOKIE_PATH = "/ui"
SESSION_SECONDS = 12 * 3600
LOGIN_SECONDS = 3600
FLASH_SECONDS = 120
MAX_FORM_BYTES = 64 * 1024
OPERATOR_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,100}$")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class UiError(Exception):
    """Raised by a page or a check; the web routes turn it into a response."""


class SignInRequired(UiError):
    """A page was asked for without a valid session: go to the sign-in page."""

    def __init__(self, next_url: str) -> None:
        super().__init__("sign in first")
        self.next_url = next_url


class Forbidden(UiError):
    """A state-changing request without a session, a CSRF token or from another site."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class BadRequest(UiError):
    """Input no page can use (a NUL character, a number out of range)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class NotFound(UiError):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Unavailable(UiError):
    """Gitea, which decides what a signed-in Gitea user may see, cannot be asked now."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class UiSession:
    """A signed-in person: an operator with the admin token (``operator`` is the name
    they gave), or a Gitea user (``gitea``: ``operator`` is their login), who is an
    operator too only when the operator's settings say so (``operator_rights``)."""

    operator: str
    csrf: str
    session_id: str = ""
    gitea: bool = False
    operator_rights: bool = True

    @property
    def actor(self) -> str:
        return f"gitea:{self.operator}" if self.gitea else f"admin:{self.operator}"


@dataclass(frozen=True, slots=True)
class GiteaSignIn:
    """What a Gitea user's new session keeps: operator or not, and the sealed tokens."""

    operator: bool
    sealed: str

    def __repr__(self) -> str:
        return f"GiteaSignIn(operator={self.operator})"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_key(admin_token: str) -> bytes:
    return hmac.new(admin_token.encode(), b"forgeflow.web.cookie.v1", hashlib.sha256).digest()


def sign(key: bytes, kind: str, payload: Mapping[str, str | bool]) -> str:
    """A cookie value: the payload (a few words and flags) with its kind, time and MAC."""
    body = _b64(json.dumps({**payload, "typ": kind, "iat": int(time.time())}).encode())
    mac = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(key: bytes, kind: str, value: str | None, max_age: int) -> JsonObject | None:
    """The payload of a cookie we signed, of this kind and not older than ``max_age``
    (JSON: each reader checks the type of what it takes out)."""
    if not value or value.count(".") != 1:
        return None
    body, mac = value.split(".")
    expected = hmac.new(key, body.encode("ascii", "replace"), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), expected):
            return None
        payload = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("typ") != kind:
        return None
    issued = payload.get("iat")
    if not isinstance(issued, int) or not 0 <= time.time() - issued <= max_age:
        return None
    found: JsonObject = payload
    return found


def _key(request: Request) -> bytes:
    token: str = request.app.state.services.admin_token
    return signing_key(token)


def cookie_key(request: Request) -> bytes:
    """The key every cookie of the pages is signed with."""
    return _key(request)


def read_session(request: Request) -> UiSession | None:
    payload = unsign(_key(request), "s", request.cookies.get(SESSION_COOKIE), SESSION_SECONDS)
    if payload is None:
        return None
    operator, csrf = payload.get("op"), payload.get("csrf")
    if not isinstance(operator, str) or not OPERATOR_RE.match(operator):
        return None
    if not isinstance(csrf, str) or len(csrf) < 32:
        return None
    sid = payload.get("sid")
    if not isinstance(sid, str) or not 16 <= len(sid) <= 64:
        return None
    gitea = payload.get("g") is True
    rights = payload.get("opr") is True or not gitea
    return UiSession(operator, csrf, sid, gitea, rights)


async def live_session(request: Request) -> UiSession | None:
    """The session of a validly signed cookie whose row is neither ended nor expired."""
    session = read_session(request)
    if session is None:
        return None
    store = request.app.state.services.store
    sid = session.session_id
    alive = await store.read(lambda c: ui_sessions.is_live(c, sid, utcnow()))
    return session if alive else None


async def require_session(request: Request) -> UiSession:
    """Dependency of every page: the session, or off to the sign-in page."""
    session = await live_session(request)
    if session is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInRequired(target)
    return session


def _set_cookie(request: Request, response: Response, name: str, value: str, age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _clear_cookie(request: Request, response: Response, name: str) -> None:
    _set_cookie(request, response, name, "", 0)


async def start_session(
    request: Request,
    response: Response,
    operator: str,
    *,
    gitea: GiteaSignIn | None = None,
) -> None:
    """A new session row (and, for a Gitea user, the sealed tokens beside it, in the
    same transaction) and its cookie."""
    sid = secrets.token_urlsafe(24)
    address = request.client.host if request.client else "unknown"
    store = request.app.state.services.store

    def _start(conn: Connection) -> None:
        ui_sessions.start(conn, sid, operator, address, SESSION_SECONDS)
        if gitea is not None:
            gitea_logins.put(conn, sid, operator, gitea.operator, gitea.sealed)

    await store.write(_start)
    payload: dict[str, str | bool] = {"op": operator, "csrf": secrets.token_urlsafe(32), "sid": sid}
    if gitea is not None:
        payload.update({"g": True, "opr": gitea.operator})
    _set_cookie(
        request, response, SESSION_COOKIE, sign(_key(request), "s", payload), SESSION_SECONDS
    )
    _clear_cookie(request, response, LOGIN_COOKIE)


async def end_session(request: Request, response: Response, session: UiSession) -> None:
    """Sign out: the row is ended (a copy of the cookie stops working) and the cookie
    cleared."""
    store = request.app.state.services.store
    sid = session.session_id
    await store.write(lambda c: ui_sessions.end(c, sid, session.actor))
    _clear_cookie(request, response, SESSION_COOKIE)


def login_nonce(request: Request) -> str:
    """The CSRF token of the sign-in form: the one in its cookie, or a new one."""
    old = unsign(_key(request), "l", request.cookies.get(LOGIN_COOKIE), LOGIN_SECONDS)
    nonce = old.get("n") if old else None
    return nonce if isinstance(nonce, str) else secrets.token_urlsafe(32)


def remember_login_nonce(request: Request, response: Response, nonce: str) -> None:
    value = sign(_key(request), "l", {"n": nonce})
    _set_cookie(request, response, LOGIN_COOKIE, value, LOGIN_SECONDS)


def check_login_nonce(request: Request, submitted: str) -> None:
    payload = unsign(_key(request), "l", request.cookies.get(LOGIN_COOKIE), LOGIN_SECONDS)
    nonce = payload.get("n") if payload else None
    if not isinstance(nonce, str) or not same_secret(submitted, nonce):
        raise Forbidden("the sign-in form expired; load it again")


def set_flash(request: Request, response: Response, ok: bool, text: str) -> None:
    value = sign(_key(request), "f", {"ok": ok, "text": text[:500]})
    _set_cookie(request, response, FLASH_COOKIE, value, FLASH_SECONDS)


@dataclass(frozen=True, slots=True)
class Flash:
    """The one-time message an action leaves for the page it redirects to."""

    ok: bool
    text: str


def read_flash(request: Request) -> Flash | None:
    """The message left by the last action; :func:`clear_flash` makes it show once."""
    payload = unsign(_key(request), "f", request.cookies.get(FLASH_COOKIE), FLASH_SECONDS)
    if payload is None:
        return None
    ok, text = payload.get("ok"), payload.get("text")
    if not isinstance(ok, bool) or not isinstance(text, str):
        return None
    return Flash(ok, text)


def clear_flash(request: Request, response: Response) -> None:
    if FLASH_COOKIE in request.cookies:
        _clear_cookie(request, response, FLASH_COOKIE)


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (our forms send nothing else); the first value of each name."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return {}
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Forbidden("form too large")
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    form = {k: v[0] for k, v in parsed.items() if v}
    if any("\x00" in k or "\x00" in v for k, v in form.items()):
        raise BadRequest("a form field holds a NUL character")
    return form


def check_same_site(request: Request) -> None:
    """Browsers say where a request came from; refuse one sent by another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Forbidden("cross-site request refused")


@dataclass(frozen=True, slots=True)
class Posted:
    session: UiSession
    form: dict[str, str]


async def require_post(request: Request) -> Posted:
    """Dependency of every state-changing route: session, same site and CSRF token."""
    session = await live_session(request)
    if session is None:
        raise Forbidden("not signed in")
    check_same_site(request)
    form = await read_form(request)
    if not same_secret(form.get("csrf", ""), session.csrf):
        raise Forbidden("missing or wrong CSRF token")
    return Posted(session, form)


def safe_next(value: str | None) -> str:
    """A redirect target inside the admin pages, never another site."""
    if not value or not value.startswith("/ui/") or "//" in value or "\\" in value:
        return "/ui/"
    return value


async def require_operator(request: Request) -> UiSession:
    """Dependency of the operators' pages (overview counts aside: pipelines, settings,
    deliveries, audit): a Gitea user without operator rights finds nothing there."""
    session = await require_session(request)
    if not session.operator_rights:
        raise NotFound("no page has this address")
    return session


async def require_operator_post(request: Request) -> Posted:
    """:func:`require_post` for the global and pipeline controls: operators only."""
    posted = await require_post(request)
    if not posted.session.operator_rights:
        raise NotFound("no page has this address")
    return posted
