"""Operator commands: ``forgeflow doctor`` and ``forgeflow gitea connect|disconnect``,
and the ``--config`` option every sub-command shares.

The shared pieces live here, not in :mod:`forgeflow.cli`, so sub-command modules
(``forgeflow.pipelines.cli`` too) never import the top-level command line that
registers them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from forgeflow.config import ConfigError, Settings, load_settings

if TYPE_CHECKING:  # the CLI imports the Gitea modules only in the commands that use them
    from forgeflow.gitea.hooks import Plan

gitea_app = typer.Typer(no_args_is_help=True, help="Set up the Gitea webhook.")

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="TOML file; the environment wins over it.")
]


def settings_or_exit(config: Path | None, **overrides: object) -> Settings:
    """The settings, or exit with status 2 and one line saying what is wrong."""
    try:
        return load_settings(config, **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        typer.echo(f"forgeflow: invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from None


def doctor(config: ConfigOption = None) -> None:
    """Check configuration, database, Gitea, Codex, gitea-mcp and disk, one line each."""
    from forgeflow.doctor import doctor as run

    checks, code = run(settings_or_exit(config))
    for check in checks:
        typer.echo(check.line())
    raise typer.Exit(code)


def _hook_url(s: Settings, url: str | None) -> str:
    base = url or s.public_url
    if not base:
        typer.echo(
            "forgeflow: give --url or set FORGEFLOW_PUBLIC_URL (where Gitea reaches forgeflow)",
            err=True,
        )
        raise typer.Exit(2)
    return base.rstrip("/") + "/api/gitea/webhook"


def _client(s: Settings) -> object:
    from forgeflow.gitea.client import GiteaClient

    if s.gitea_url is None or s.gitea_token is None:
        typer.echo("forgeflow: FORGEFLOW_GITEA_URL and FORGEFLOW_GITEA_TOKEN are needed", err=True)
        raise typer.Exit(2)
    return GiteaClient(s.gitea_url, s.gitea_token.get_secret_value())


def _gitea_failed(s: Settings, exc: Exception) -> typer.Exit:
    """One line for a Gitea that could not be reached, or that answered with an error."""
    from forgeflow.gitea.client import GiteaUnavailable

    if isinstance(exc, GiteaUnavailable) and exc.status is None:
        typer.echo(f"forgeflow: Gitea at {s.gitea_url} is unreachable: {exc}", err=True)
    else:
        typer.echo(f"forgeflow: Gitea refused: {exc}", err=True)
    return typer.Exit(1)


@gitea_app.command()
def connect(
    target: Annotated[str | None, typer.Argument(help="OWNER/REPO or ORG")] = None,
    url: Annotated[str | None, typer.Option(help="forgeflow's public base URL.")] = None,
    oauth: Annotated[
        bool,
        typer.Option(
            "--oauth",
            help="Create or repair forgeflow's OAuth2 application (Sign in with Gitea) "
            "and store its client secret in the data folder.",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would change.")] = False,
    update_secret: Annotated[
        bool,
        typer.Option(
            "--update-secret", help="Set the secret of a hook that is otherwise up to date."
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Create or update the webhook of a repository or organisation, and with --oauth
    forgeflow's OAuth2 application (idempotent)."""
    s = settings_or_exit(config)
    if oauth:
        from forgeflow.cli_oauth import connect_oauth

        connect_oauth(s, url, dry_run, _client, _gitea_failed)
    if target is None:
        if not oauth:
            typer.echo("forgeflow: give OWNER/REPO or ORG, or --oauth", err=True)
            raise typer.Exit(2)
        return
    _connect_hook(s, target, url, dry_run=dry_run, update_secret=update_secret)


def _connect_hook(
    s: Settings, target: str, url: str | None, *, dry_run: bool, update_secret: bool
) -> None:
    """The webhook part of ``gitea connect``: the hook of ``target`` made to match."""
    from forgeflow.domain.ids import InvalidName
    from forgeflow.gitea import hooks
    from forgeflow.gitea.client import GiteaClient, GiteaError

    if s.webhook_secret is None:
        typer.echo("forgeflow: FORGEFLOW_WEBHOOK_SECRET is needed", err=True)
        raise typer.Exit(2)
    try:
        where = hooks.Target.parse(target)
    except InvalidName as exc:
        typer.echo(f"forgeflow: {exc}", err=True)
        raise typer.Exit(2) from None
    hook_url = _hook_url(s, url)
    client = _client(s)
    assert isinstance(client, GiteaClient)

    secret = s.webhook_secret.get_secret_value()

    async def go() -> hooks.Plan:
        try:
            return await hooks.connect(
                client,
                where,
                url=hook_url,
                secret=secret,
                dry_run=dry_run,
                update_secret=update_secret,
            )
        finally:
            await client.aclose()

    try:
        plan = asyncio.run(go())
    except GiteaError as exc:
        raise _gitea_failed(s, exc) from None
    _say_plan(plan, str(where), hook_url, dry_run)


def _say_plan(plan: Plan, where: str, hook_url: str, dry_run: bool) -> None:
    """One line for what ``gitea connect`` did (or would do) to the hook."""
    prefix = "would " if dry_run else ""
    if plan.action == "create":
        typer.echo(
            f"{prefix}create a webhook on {where} for {hook_url}"
            + ("" if dry_run else f" (hook {plan.hook_id})")
        )
    elif plan.action == "update":
        typer.echo(
            f"{prefix}update hook {plan.hook_id} on {where}: {', '.join(plan.changes)}"
            + ("" if "secret" in plan.changes else " (and its secret)")
        )
    else:
        typer.echo(f"hook {plan.hook_id} on {where} is up to date")
        typer.echo(
            "  its secret is not compared: Gitea never shows a hook's secret, so whether it "
            "is the current FORGEFLOW_WEBHOOK_SECRET cannot be known; --update-secret sets "
            "it again"
        )


@gitea_app.command()
def disconnect(
    target: Annotated[str, typer.Argument(help="OWNER/REPO or ORG")],
    url: Annotated[str | None, typer.Option(help="forgeflow's public base URL.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run")] = False,
    config: ConfigOption = None,
) -> None:
    """Remove forgeflow's webhook from a repository or organisation."""
    from forgeflow.domain.ids import InvalidName
    from forgeflow.gitea import hooks
    from forgeflow.gitea.client import GiteaClient, GiteaError

    s = settings_or_exit(config)
    try:
        where = hooks.Target.parse(target)
    except InvalidName as exc:
        typer.echo(f"forgeflow: {exc}", err=True)
        raise typer.Exit(2) from None
    hook_url = _hook_url(s, url)
    client = _client(s)
    assert isinstance(client, GiteaClient)

    async def go() -> list[int]:
        try:
            return await hooks.disconnect(client, where, url=hook_url, dry_run=dry_run)
        finally:
            await client.aclose()

    try:
        ids = asyncio.run(go())
    except GiteaError as exc:
        raise _gitea_failed(s, exc) from None
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"{verb} {len(ids)} webhook(s) from {where}" if ids else f"no forgeflow webhook on {where}"
    )
