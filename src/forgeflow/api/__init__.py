"""HTTP surface: webhook, control/audit API and operations endpoints."""

from forgeflow.api.app import create_app

__all__ = ["create_app"]
