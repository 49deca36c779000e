"""What a configuration leaves forgeflow unable, or unsafe, to do: the lines shown at
start-up, in ``/readyz`` and on the overview page."""

from __future__ import annotations

from forgeflow.config import Settings


def capability_warnings(settings: Settings) -> list[str]:
    """One line per missing setting: what forgeflow cannot do until it is given."""
    lines: list[str] = []
    if settings.webhook_secret is None:
        lines.append("FORGEFLOW_WEBHOOK_SECRET is not set: the webhook answers 503 not_configured")
    if settings.gitea_url is None:
        lines.append(
            "FORGEFLOW_GITEA_URL is not set: no permission checks, receipts, clones or replies"
        )
    if settings.gitea_token is None:
        lines.append("FORGEFLOW_GITEA_TOKEN is not set: forgeflow cannot call Gitea as the bot")
    return lines


def sandbox_warning(settings: Settings) -> str | None:
    """The loud line of FORGEFLOW_SANDBOX=none, shown at start, in /readyz and on the
    overview page."""
    if settings.sandbox != "none":
        if settings.agent_network == "on":
            return (
                "FORGEFLOW_AGENT_NETWORK=on: the jail shares the host's network and reaches "
                "every service on its loopback (the database included), private networks "
                "and the cloud metadata address; prefer the default, proxy"
            )
        return None
    return (
        "FORGEFLOW_SANDBOX=none: the agent runs unjailed as forgeflow's own user and can "
        "read everything that user can; use it only for a single trusted user"
    )
