"""The bare baseline of bench/ingest.py: uvicorn + one SQLite insert per request.

A minimal Starlette app on the same route as forgeflow's webhook. Each request stores
(delivery id, SHA-256 of the body) in one SQLite transaction, committed before the 202
is sent. The database gets forgeflow's PRAGMAs (WAL, synchronous=NORMAL; see
src/forgeflow/store/db.py) and uvicorn gets the options ``forgeflow serve`` passes
(src/forgeflow/cli.py). The insert runs inline on the event loop: the cheapest correct
way to do it, so the baseline is an upper bound for any app that commits before answering.

Usage: baseline_app.py --port PORT --db PATH
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS deliveries (delivery_id TEXT PRIMARY KEY, body_hash TEXT NOT NULL)"
)


def open_db(path: Path) -> sqlite3.Connection:
    """forgeflow's SQLite settings (src/forgeflow/store/db.py) on a raw connection."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def connect(path: Path) -> sqlite3.Connection:
    conn = open_db(path)
    conn.execute(SCHEMA)
    return conn


def create_app(db_path: Path) -> Starlette:
    conn = connect(db_path)

    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        delivery_id = request.headers.get("x-gitea-delivery", "")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO deliveries (delivery_id, body_hash) VALUES (?, ?)",
                (delivery_id, digest),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return JSONResponse({"deliveryId": delivery_id}, status_code=202)

    return app_for(webhook)


def app_for(webhook: Callable[[Request], Awaitable[JSONResponse]]) -> Starlette:
    """The webhook route and ``/healthz`` (bench/floor_app.py serves its own webhook in
    the same shell)."""

    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/api/gitea/webhook", webhook, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def run(app: Starlette, port: int) -> None:
    # The same options as `forgeflow serve` (src/forgeflow/cli.py).
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="asyncio"
    )


def main() -> None:
    p = argparse.ArgumentParser(description="forgeflow ingest benchmark baseline")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--db", type=Path, required=True)
    args = p.parse_args()
    run(create_app(args.db), args.port)


if __name__ == "__main__":
    main()
