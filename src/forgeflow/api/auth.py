"""Bearer-token authentication of the control API."""

from __future__ import annotations

from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from forgeflow.api.errors import ApiError
from forgeflow.guard import same_secret

# Declares the ``bearerAuth`` scheme in /openapi.json (clients and schemathesis then know
# every control route needs the token). ``auto_error=False``: a missing or malformed
# header is answered by our own 401 body below, not FastAPI's 403.
bearer = HTTPBearer(
    scheme_name="bearerAuth",
    description="FORGEFLOW_ADMIN_TOKEN",
    auto_error=False,
)


def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> None:
    expected: str = request.app.state.services.admin_token
    token = credentials.credentials.strip() if credentials is not None else ""
    if not token or not same_secret(token, expected):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' is required")
