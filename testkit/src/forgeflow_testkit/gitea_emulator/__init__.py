"""A Gitea emulator for tests: Gitea's REST API, webhooks and git smart HTTP on a real
socket, over in-memory state and real bare repositories."""

from __future__ import annotations

from .delivery import Delivery
from .emulator import GiteaEmulator

__all__ = ["Delivery", "GiteaEmulator"]
