"""Sign in with Gitea: forgeflow as a Gitea OAuth2 application (authorization code with
PKCE S256 and state; the flow's rules are in domain/oauth.py).

``/ui/oauth/start`` keeps the flow's state, verifier and return address in a signed
cookie (SameSite=Lax: Gitea's redirect back is a navigation from another site, which a
Strict cookie would not follow) and sends the browser to Gitea's authorize page.
``/ui/oauth/callback`` refuses an answer whose state is not the cookie's before it asks
Gitea anything, exchanges the code with the verifier, asks who the user is, and starts a
session whose tokens stay sealed on the server. The tokens never reach a page, a URL,
a log line or the cookie.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from forgeflow.domain import oauth
from forgeflow.gitea.oauth import OAuthClient, TokenInvalid, TokenRefused
from forgeflow.gitea.transport import GiteaError
from forgeflow.redaction import register_secrets
from forgeflow.rejections import Rejection
from forgeflow.web.render import UiRoute, error_page, render, services
from forgeflow.web.sealing import seal
from forgeflow.web.security import (
    OPERATOR_RE,
    GiteaSignIn,
    NotFound,
    cookie_key,
    safe_next,
    sign,
    start_session,
    unsign,
)

router = APIRouter(prefix="/ui/oauth", route_class=UiRoute, include_in_schema=False)
FLOW_COOKIE = "ff_oauth"
FLOW_PATH = "/ui/oauth"
FLOW_SECONDS = 600


def _client(request: Request) -> OAuthClient:
    client = services(request).oauth
    if client is None:
        raise NotFound("Sign in with Gitea is not set up here (forgeflow gitea connect --oauth)")
    return client


@router.get("/start")
async def start(request: Request, next: str | None = None) -> Response:
    client = _client(request)
    s = services(request).settings
    assert s.gitea_url is not None and s.public_url is not None  # a client needs both
    pending = oauth.start(safe_next(next))
    target = oauth.authorize_url(s.gitea_url, client.client_id, s.public_url, pending)
    response = RedirectResponse(target, status_code=303)
    value = sign(
        cookie_key(request),
        "o",
        {"s": pending.state, "v": pending.verifier, "n": pending.next_url},
    )
    response.set_cookie(
        FLOW_COOKIE,
        value,
        max_age=FLOW_SECONDS,
        path=FLOW_PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


def _pending(request: Request) -> oauth.Pending | None:
    found = unsign(cookie_key(request), "o", request.cookies.get(FLOW_COOKIE), FLOW_SECONDS)
    if found is None:
        return None
    state, verifier, next_url = found.get("s"), found.get("v"), found.get("n")
    if not (isinstance(state, str) and isinstance(verifier, str) and isinstance(next_url, str)):
        return None
    return oauth.Pending(state, verifier, safe_next(next_url))


async def _user(client: OAuthClient, tokens: oauth.Tokens, request: Request) -> oauth.GiteaUser:
    s = services(request).settings
    login = await client.login_of(tokens.access_token)
    if not OPERATOR_RE.match(login):
        raise oauth.OAuthRefused("Gitea answered a login forgeflow cannot use")
    admin = False
    if s.oauth_admins_are_operators:
        admin = await client.is_site_admin(tokens.access_token)
    operator = oauth.is_operator(
        login, admin, s.oauth_operator_logins(), s.oauth_admins_are_operators
    )
    return oauth.GiteaUser(login, operator)


@router.get("/callback")
async def callback(
    request: Request,
    code: str | None = None,
    state: str | None = None,
    error: str | None = None,
) -> Response:
    client = _client(request)
    pending = _pending(request)
    public_url = services(request).settings.public_url or ""
    try:
        grant = oauth.check_callback(pending, state, code, error)
        assert pending is not None  # check_callback refused it otherwise
        tokens = await client.exchange(grant, pending.verifier, oauth.redirect_uri(public_url))
        register_secrets([tokens.access_token, tokens.refresh_token])
        user = await _user(client, tokens, request)
    except oauth.OAuthRefused as exc:
        return await _refused(request, str(exc), exc.code)
    except (TokenRefused, TokenInvalid):
        why = "Gitea refused the sign-in (code, verifier or client)"
        return await _refused(request, why, "oauth_token_refused")
    except GiteaError as exc:
        why = f"Gitea cannot be asked now ({exc.status or 'unreachable'})"
        return await _refused(request, why, "gitea_unavailable")
    sealed = seal(services(request).admin_token, tokens)
    # A page, not a redirect: the session cookie is SameSite=Strict, and a browser does
    # not send it on a redirect chain that started on Gitea's site.
    response = render(
        request,
        "signed_in.html",
        {"login": user.login, "next": pending.next_url, "nav": ""},
        session=None,
    )
    response.delete_cookie(FLOW_COOKIE, path=FLOW_PATH)
    await start_session(request, response, user.login, gitea=GiteaSignIn(user.operator, sealed))
    return response


async def _refused(request: Request, why: str, code: str) -> Response:
    """The failed sign-in's page; the refusal goes to the bounded audit of refusals."""
    address = request.client.host if request.client else "unknown"
    await services(request).rejections.record(Rejection("ui.signin.reject", code, address))
    response = error_page(request, 400, "Sign-in with Gitea failed", why)
    response.delete_cookie(FLOW_COOKIE, path=FLOW_PATH)
    return response
