"""Prometheus metrics, one registry per application instance (tests run many)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.deliveries = Counter(
            "forgeflow_webhook_deliveries_total",
            "Webhook deliveries by outcome.",
            ["status"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "forgeflow_http_request_duration_seconds",
            "HTTP request latency by route.",
            ["method", "route", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
