"""Input checks the API routes share, so bad input is a 400 and never a database error."""

from __future__ import annotations

from typing import Annotated

from fastapi import Request
from pydantic import AfterValidator

from forgeflow.api.errors import ApiError

# The largest integer both SQLite (INTEGER) and PostgreSQL (BIGINT) hold: offsets and
# sequence numbers above it would fail in the driver instead of matching nothing.
MAX_INT64 = 2**63 - 1
# Audit sequence numbers are INTEGER columns (32 bits on PostgreSQL).
MAX_INT32 = 2**31 - 1


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


# PostgreSQL text cannot hold NUL (0x00) characters; SQLite can, so refuse them for both.
Text = Annotated[str, AfterValidator(_no_nul)]


def no_nul_parameters(request: Request) -> None:
    """A router dependency: no NUL character in any path or query parameter."""
    for where, items in (
        ("path", list(request.path_params.items())),
        ("query", request.query_params.multi_items()),
    ):
        for name, value in items:
            if isinstance(value, str) and "\x00" in value:
                raise ApiError(
                    400, "invalid_request", f"{where} parameter {name} must not contain NUL"
                )
