"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection

from forgeflow.api.schemas import Health, Readiness, answer, error
from forgeflow.config_warnings import sandbox_warning
from forgeflow.services import Services
from forgeflow.store import StoreUnavailable, deliveries, task_reads
from forgeflow.tasks.dispatch import Dispatcher

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=None,
    responses={
        200: answer(Readiness, "ready"),
        503: answer(Readiness, "database unreachable or not migrated"),
    },
)
async def readyz(request: Request) -> JSONResponse:
    """The database is reachable and its migrations are current."""
    services: Services = request.app.state.services
    try:
        await services.store.ping()
        current = await services.store.read(lambda _c: services.store.is_current())
    except StoreUnavailable:
        return JSONResponse({"status": "unavailable", "database": False}, status_code=503)
    if not current:
        return JSONResponse(
            {"status": "unavailable", "database": True, "migrations": False}, status_code=503
        )
    body: dict[str, Any] = {
        "status": "ready",
        "database": True,
        "migrations": True,
        "sandbox": services.settings.sandbox,
    }
    warning = sandbox_warning(services.settings)
    if warning is not None:
        body["warnings"] = [warning]
    return JSONResponse(body)


class _PreparationsCollector(Collector):
    """This process's preparations (the bound of FORGEFLOW_MAX_PREPARATIONS): how many
    do their git work now, how many wait for a place, and the bound itself."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._counts = {"working": dispatcher.working, "waiting": dispatcher.waiting}
        self._limit = dispatcher.limit

    def collect(self) -> Any:
        now = GaugeMetricFamily(
            "forgeflow_preparations",
            "Task preparations of this process: working (clone, fetch, worktree) or "
            "waiting for a place.",
            labels=["state"],
        )
        for state, n in self._counts.items():
            now.add_metric([state], n)
        yield now
        yield GaugeMetricFamily(
            "forgeflow_preparations_limit",
            "How many preparations may do their git work at once.",
            value=self._limit,
        )


class _StoreCollector(Collector):
    """Task and delivery counts read from the store at scrape time."""

    def __init__(self, snapshot: dict[str, dict[str, int]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Any:
        by_state = GaugeMetricFamily("forgeflow_tasks", "Tasks by state.", labels=["state"])
        for state, n in sorted(self._snapshot["tasks"].items()):
            by_state.add_metric([state], n)
        yield by_state
        stored = GaugeMetricFamily(
            "forgeflow_deliveries_stored",
            "Recorded webhook deliveries by status.",
            labels=["status"],
        )
        for status, n in sorted(self._snapshot["deliveries"].items()):
            stored.add_metric([status], n)
        yield stored


@router.get(
    "/metrics",
    # Prometheus text exposition, declared as such (not FastAPI's default JSON).
    response_class=PlainTextResponse,
    responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
        503: error("store_unavailable: the database is unavailable; retry"),
    },
)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    services: Services = request.app.state.services

    def _snapshot(conn: Connection) -> dict[str, dict[str, int]]:
        return {
            "tasks": task_reads.counts_by_state(conn),
            "deliveries": deliveries.counts_by_status(conn),
        }

    snapshot = await services.store.read(_snapshot)
    from prometheus_client import CollectorRegistry

    scrape = CollectorRegistry()
    scrape.register(_StoreCollector(snapshot))
    if services.scheduler is not None:  # only a process that runs tasks prepares them
        scrape.register(_PreparationsCollector(services.scheduler.dispatcher))
    body = generate_latest(services.metrics.registry) + generate_latest(scrape)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
