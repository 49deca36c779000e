"""The ``forgeflow`` command line."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import forgeflow
from forgeflow.cli_ops import ConfigOption, doctor, gitea_app, settings_or_exit
from forgeflow.config import Role, Settings
from forgeflow.config_warnings import sandbox_warning
from forgeflow.pipelines.cli import app as pipelines_app

if TYPE_CHECKING:
    from forgeflow.services import Services

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Drive a coding agent from Gitea comments, durably.",
)
app.add_typer(pipelines_app, name="pipelines")
app.add_typer(gitea_app, name="gitea")
app.command()(doctor)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"forgeflow {forgeflow.__version__}")


@app.command()
def migrate(config: ConfigOption = None) -> None:
    """Bring the database schema up to date and exit."""
    from forgeflow.store import Store

    settings = settings_or_exit(config)
    store = Store(settings.resolved_database_url)
    try:
        store.migrate()
    finally:
        store.close()
    typer.echo("forgeflow: database is up to date")


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Listen address.")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port.")] = None,
    role: Annotated[Role, typer.Option(help="ingress, worker or all.")] = Role.ALL,
) -> None:
    """Run forgeflow: webhook ingress, control API and workers."""
    from forgeflow.logs import configure
    from forgeflow.services import WorkerIdInUse, build_services, ensure_admin_token
    from forgeflow.startup import DataFolderInUse, DataFolderLock, admin_pages_line, cannot_do_yet

    settings = settings_or_exit(config, host=host, port=port)
    lock = DataFolderLock(settings.data_dir)
    try:
        lock.acquire()
    except DataFolderInUse as exc:
        typer.echo(f"forgeflow: {exc}", err=True)
        raise typer.Exit(1) from None
    configure(settings.log_level)
    for line in cannot_do_yet(settings, role):
        typer.echo(f"forgeflow: {line}", err=True)
    _check_agent(settings, role)
    from_file = settings.admin_token is None
    token, generated = ensure_admin_token(settings)
    if generated:
        typer.echo(
            "forgeflow: generated an admin token (kept in "
            f"{Path(settings.data_dir) / 'admin_token'}, shown only this once):\n    {token}",
            err=True,
        )
    services = build_services(settings, role=role)
    for line in services.worker_blockers():
        typer.echo(f"forgeflow: {line}", err=True)
    typer.echo(
        f"forgeflow: serving on http://{settings.host}:{settings.port} "
        f"(role {role.value}, database {services.store.dialect})",
        err=True,
    )
    typer.echo(f"forgeflow: {admin_pages_line(settings, token_from_file=from_file)}", err=True)
    try:
        # asyncio's own loop, not uvloop: libuv starts every git child with fork(),
        # copying the page tables of this large process while the loop waits, where
        # CPython's subprocess uses vfork: every task starts several git processes.
        asyncio.run(_serve(services, settings))
    except WorkerIdInUse as exc:
        typer.echo(f"forgeflow: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        lock.release()


def _check_agent(settings: Settings, role: Role) -> None:
    """Refuse to run tasks with a model provider that cannot be read or a jail that
    cannot work, one line each; warn loudly without a jail."""
    from forgeflow.agent.jail import JailUnavailable, probe
    from forgeflow.agent.provider import ProviderError, load_provider

    warning = sandbox_warning(settings)
    if warning is not None:
        typer.echo(f"forgeflow: WARNING: {warning}", err=True)
    if role is Role.INGRESS:
        return  # this process runs no agent
    try:
        load_provider(
            base_url=settings.model_base_url, api_key=None, codex_home=settings.codex_home_path
        )
    except ProviderError as exc:
        typer.echo(f"forgeflow: cannot read the model provider: {exc}", err=True)
        raise typer.Exit(2) from None
    if settings.sandbox == "none":
        return
    try:
        probe()
    except JailUnavailable as exc:
        typer.echo(f"forgeflow: cannot start with FORGEFLOW_SANDBOX=bwrap: {exc}", err=True)
        raise typer.Exit(2) from None


async def _serve(services: Services, settings: Settings) -> None:
    """Start the workers, then the HTTP server, in one loop.

    The scheduler starts first, so a restart claims queued work while the HTTP layer
    (FastAPI, the OpenAPI models, the admin UI: the larger part of start-up) is still
    being imported, on a thread so the loop keeps working meanwhile.
    """
    import uvicorn

    _watch_children_with_pidfds()
    try:
        await services.start()
        app_module = await asyncio.to_thread(importlib.import_module, "forgeflow.api.app")
        app = app_module.create_app(services, lifecycle=False)
        server_module = await asyncio.to_thread(importlib.import_module, "forgeflow.api.server")
        await uvicorn.Server(server_module.server_config(app, settings)).serve()
    finally:
        await services.aclose()


def _watch_children_with_pidfds() -> None:
    """On Python 3.11 asyncio waits for each child (every git) on a thread of its own;
    a pidfd in the loop's selector costs no thread (3.12 does this by itself)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    watcher = asyncio.PidfdChildWatcher()
    try:
        os.close(os.pidfd_open(os.getpid()))  # the kernel may lack pidfds (before 5.3)
    except OSError:
        return
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


def main() -> None:
    app(prog_name="forgeflow")


if __name__ == "__main__":
    main()
