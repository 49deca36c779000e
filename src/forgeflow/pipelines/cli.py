"""``forgeflow pipelines …``: templates and manual runs, straight through the store.

A run started here is picked up by whichever ``forgeflow serve`` runs the engine on
the same database.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from forgeflow.cli_ops import ConfigOption, settings_or_exit
from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineTemplate, PipelineTrigger

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from forgeflow.pipelines.runs import Started

# The store, the models and their dependencies are imported inside the commands: every
# ``forgeflow`` invocation builds this sub-app, and most of them never use it.

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, help="Pipeline templates and runs.")


def _write(config: Path | None, fn: Callable[[Connection], T]) -> T:
    from forgeflow.pipelines.runs import PipelineError
    from forgeflow.store import Store

    store = Store(settings_or_exit(config).resolved_database_url)
    try:
        store.migrate()
        return store.db.write_sync(fn)
    except PipelineError as exc:
        typer.echo(f"forgeflow: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(1) from None
    finally:
        store.close()


def _echo(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


@app.command("list")
def list_templates(config: ConfigOption = None) -> None:
    """Templates with their switch and triggers."""
    from forgeflow.redaction import redact_text
    from forgeflow.store import pipeline_templates as tpl

    def _read(conn: Connection) -> list[tuple[PipelineTemplate, list[PipelineTrigger]]]:
        return [(r, tpl.list_triggers(conn, r.key)) for r in tpl.list_definitions(conn)]

    for t, triggers in _write(config, _read):
        kinds = ",".join(x.trigger_type for x in triggers) or "-"
        state = "enabled" if t.is_enabled else "disabled"
        typer.echo(f"{t.key}\tv{t.version}\t{state}\t{kinds}\t{redact_text(t.name)}")


@app.command()
def show(key: str, config: ConfigOption = None) -> None:
    """A template's definition, triggers and latest runs, as JSON."""
    from forgeflow.pipelines import templates, views
    from forgeflow.store import pipeline_templates as tpl
    from forgeflow.store import pipelines as q

    def _read(conn: Connection) -> JsonObject:
        row = templates.require(conn, key)
        recent, _ = q.list_runs(conn, template_key=key, limit=10)
        return {
            **views.template_json(row, tpl.list_triggers(conn, key)),
            "recentRuns": [views.run_json(r, state=False) for r in recent],
        }

    _echo(_write(config, _read))


@app.command()
def apply(file: Path, config: ConfigOption = None) -> None:
    """Create a template from a YAML or JSON file, or replace the one with its key."""
    from forgeflow.pipelines import templates
    from forgeflow.pipelines.bodies import register_builtins
    from forgeflow.pipelines.definition import DefinitionError, load_definition, parse_document
    from forgeflow.pipelines.registry import PipelineBodyRegistry
    from forgeflow.store import pipeline_templates as tpl

    registry = PipelineBodyRegistry()
    register_builtins(registry)
    try:
        data = parse_document(file.read_bytes(), yaml_format=file.suffix != ".json")
        loaded = load_definition(data, bodies=registry.keys())
    except DefinitionError as exc:
        for line in exc.errors:
            typer.echo(f"forgeflow: {line}", err=True)
        raise typer.Exit(1) from None
    for line in loaded.warnings:
        typer.echo(f"forgeflow: warning: {line}", err=True)
    key = loaded.definition.key

    def _apply(conn: Connection) -> PipelineTemplate:
        if tpl.get_definition(conn, key) is None:
            return templates.create(conn, loaded, actor="cli")
        explicit = "enabled" in loaded.definition.model_fields_set
        enabled = loaded.definition.enabled if explicit else None
        return templates.replace(conn, key, loaded, actor="cli", enabled=enabled)

    row = _write(config, _apply)
    typer.echo(f"{key} v{row.version} {'enabled' if row.is_enabled else 'disabled'}")


@app.command()
def enable(key: str, config: ConfigOption = None) -> None:
    """Let the template start runs."""
    from forgeflow.pipelines import templates

    _write(config, lambda c: templates.set_enabled(c, key, True, actor="cli"))
    typer.echo(f"{key} enabled")


@app.command()
def disable(key: str, config: ConfigOption = None) -> None:
    """Refuse new runs of the template (runs under way go on)."""
    from forgeflow.pipelines import templates

    _write(config, lambda c: templates.set_enabled(c, key, False, actor="cli"))
    typer.echo(f"{key} disabled")


@app.command()
def run(
    key: str,
    input: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="An input as name=value.")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Start a run by hand; values are parsed by the declared input types."""
    from forgeflow.pipelines import templates

    values: JsonObject = {}
    for item in input or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            typer.echo(f"forgeflow: --input {item!r} is not name=value", err=True)
            raise typer.Exit(2)
        values[name] = value

    def _start(conn: Connection) -> Started:
        return templates.start_manual(
            conn, key, inputs=values, dedupe_key=None, actor="cli", coerce_text=True
        )

    started = _write(config, _start)
    typer.echo(started.run.run_id)
