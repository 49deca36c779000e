"""forgeflow: drive a coding agent from Gitea comments, durably and audited."""

from __future__ import annotations

__version__ = "0.1.0"
