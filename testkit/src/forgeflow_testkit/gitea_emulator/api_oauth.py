"""The OAuth2 applications API: ``/user/applications/oauth2`` (Gitea 1.22
routers/api/v1/user/app.go; services/convert ToOAuth2Application)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from .apibase import ApiError, Call, RouteSpec, empty, json_response, not_found, paginate
from .gojson import rfc3339
from .oauth_state import OAuthApp, new_secret


def _json(app: OAuthApp, *, secret: bool) -> dict[str, Any]:
    """structs.OAuth2Application; the secret only right after it was made."""
    return {
        "id": app.id,
        "name": app.name,
        "client_id": app.client_id,
        "client_secret": app.client_secret if secret else "",
        "confidential_client": app.confidential_client,
        "skip_secondary_authorization": app.skip_secondary_authorization,
        "redirect_uris": list(app.redirect_uris),
        "created": rfc3339(app.created),
    }


def _options(call: Call) -> tuple[str, list[str], bool, bool]:
    """structs.CreateOAuth2ApplicationOptions; ``name`` and ``redirect_uris`` carry
    binding:"Required" (422 without them)."""
    form = call.form()
    name = form.get("name")
    uris = form.get("redirect_uris")
    if not isinstance(name, str) or not name:
        raise ApiError(422, "[Name]: Required")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise ApiError(422, "[RedirectURIs]: Required")
    confidential = bool(form.get("confidential_client", False))
    skip = bool(form.get("skip_secondary_authorization", False))
    return name, list(uris), confidential, skip


def _own(call: Call) -> OAuthApp:
    doer = call.token_user()
    app = call.state.oauth.apps.get(call.int_param("id"))
    if app is None or app.uid != doer.id:
        raise not_found()
    return app


def list_apps(call: Call) -> Response:
    doer = call.token_user()
    apps = [a for a in call.state.oauth.apps.values() if a.uid == doer.id]
    page, headers = paginate(call, [_json(a, secret=False) for a in apps])
    return json_response(page, headers=headers)


def create_app(call: Call) -> Response:
    doer = call.token_user()
    name, uris, confidential, skip = _options(call)
    app = call.state.oauth.create_app(doer.id, name, uris, confidential, skip, call.state.now())
    return json_response(_json(app, secret=True), 201)


def get_app(call: Call) -> Response:
    return json_response(_json(_own(call), secret=False))


def update_app(call: Call) -> Response:
    """PATCH: "update an OAuth2 Application, this includes regenerating the client
    secret" (the answer carries the new one)."""
    app = _own(call)
    app.name, app.redirect_uris, app.confidential_client, app.skip_secondary_authorization = (
        _options(call)
    )
    app.client_secret = new_secret()
    return json_response(_json(app, secret=True))


def delete_app(call: Call) -> Response:
    app = _own(call)
    store = call.state.oauth
    del store.apps[app.id]
    for grant_id in [g.id for g in store.grants.values() if g.app_id == app.id]:
        del store.grants[grant_id]
    return empty(204)


ROUTES: list[RouteSpec] = [
    ("GET", "/user/applications/oauth2", list_apps),
    ("POST", "/user/applications/oauth2", create_app),
    ("GET", "/user/applications/oauth2/{id}", get_app),
    ("PATCH", "/user/applications/oauth2/{id}", update_app),
    ("DELETE", "/user/applications/oauth2/{id}", delete_app),
]
