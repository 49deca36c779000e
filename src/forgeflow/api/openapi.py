"""``/openapi.json`` that tells the truth about the answers.

FastAPI documents a ``422`` with its ``HTTPValidationError`` body on every route that
takes parameters, but forgeflow answers invalid input with ``400`` and the common error
body (``errors.validation_error``). The document is post-processed once: each phantom
422 becomes that 400 (unless the route already declares its own 400), and the unused
validation schemas are dropped.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from forgeflow.api.schemas import ErrorBody

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def _truthful(document: dict[str, Any]) -> dict[str, Any]:
    for methods in document.get("paths", {}).values():
        for operation in methods.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None and "400" not in responses:
                responses["400"] = {
                    "description": "invalid_request: a parameter or body field is malformed",
                    "content": {"application/json": {"schema": _ERROR_REF}},
                }
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_VALIDATION:
        schemas.pop(name, None)
    schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
    return document


def install(app: FastAPI) -> None:
    """Serve the corrected document from ``app.openapi()`` (built once, then cached)."""

    def _openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _truthful(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                    tags=app.openapi_tags,
                    servers=app.servers,
                )
            )
        return app.openapi_schema

    app.openapi = _openapi  # type: ignore[method-assign]
