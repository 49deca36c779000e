"""Bearer-token authentication of the control API."""

from __future__ import annotations

import hmac

from fastapi import Request

from forgeflow.api.errors import ApiError


def require_admin(request: Request) -> None:
    expected: str = request.app.state.services.admin_token
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), expected):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' is required")
