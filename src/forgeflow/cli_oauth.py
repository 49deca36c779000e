"""``forgeflow gitea connect --oauth``: forgeflow's OAuth2 application in Gitea (Sign in
with Gitea), made or repaired for the public URL's callback, its client id and secret
stored in the data folder (0600) like the generated admin token."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import typer

from forgeflow.config import Settings
from forgeflow.domain.oauth import redirect_uri


def connect_oauth(
    s: Settings,
    url: str | None,
    dry_run: bool,
    make_client: Callable[[Settings], object],
    failed: Callable[[Settings, Exception], typer.Exit],
) -> None:
    from forgeflow.gitea import oauth_apps
    from forgeflow.gitea.client import GiteaClient, GiteaError

    base = url or s.public_url
    if not base:
        typer.echo(
            "forgeflow: give --url or set FORGEFLOW_PUBLIC_URL (where people reach forgeflow)",
            err=True,
        )
        raise typer.Exit(2)
    callback = redirect_uri(base)
    client = make_client(s)
    assert isinstance(client, GiteaClient)
    data_dir = Path(s.data_dir)
    stored = oauth_apps.read_client(data_dir)
    stored_id = s.oauth_client_id or (stored[0] if stored else None)

    async def go() -> oauth_apps.Outcome:
        try:
            return await oauth_apps.connect(client, callback, stored_id, dry_run=dry_run)
        finally:
            await client.aclose()

    try:
        outcome = asyncio.run(go())
    except GiteaError as exc:
        raise failed(s, exc) from None
    prefix = "would " if dry_run else ""
    if outcome.action == "none":
        typer.echo(f"OAuth2 application {outcome.app.client_id} is up to date for {callback}")
        return
    if outcome.action == "create":
        typer.echo(f"{prefix}create the OAuth2 application {oauth_apps.APP_NAME} for {callback}")
    else:
        typer.echo(
            f"{prefix}update OAuth2 application {outcome.app.client_id} ({outcome.why}; "
            "Gitea makes a new client secret)"
        )
    if dry_run:
        return
    path = oauth_apps.store_client(data_dir, outcome.app.client_id, outcome.app.client_secret)
    typer.echo(f"  client {outcome.app.client_id}; its secret is kept in {path} (0600)")
    if s.oauth_client_id is not None:
        typer.echo(
            "  FORGEFLOW_OAUTH_CLIENT_ID/SECRET are set and win over the stored ones: "
            "update them or unset them",
            err=True,
        )
