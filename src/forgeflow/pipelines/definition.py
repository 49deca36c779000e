"""Pipeline definitions as users write them (YAML or JSON), parsed and checked.

:func:`load_definition` turns a document into a :class:`PipelineDefinition` plus load
warnings, or raises :class:`DefinitionError` whose messages name the node and field
(``nodes[triage].retry.backoff: …``). Pure: no I/O.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forgeflow.domain.json import JsonObject
from forgeflow.pipelines import graph
from forgeflow.pipelines.kinds import DEFAULT_BODIES, StepKind
from forgeflow.pipelines.state import StateReducer

KEY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"

# Extras keys are matched exactly; anything else is reported as a load warning.
KNOWN_EXTRAS = frozenset(
    {
        "spaceId",
        "mode",
        "awaitApproval",
        "idempotent",
        "iterableKey",
        "itemKey",
        "maxConcurrency",
        "allowUnresolvedPlaceholders",
        "switchKey",
        "cases",
        "default",
        "script",
        "timeoutSeconds",
        "body",
        "labels",
        "templateKey",
        "triggerType",
        "eventType",
        "pollSeconds",
    }
)
TRIGGER_TYPES = ("event", "schedule", "manual", "webhook")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class StepRetryPolicy(_Model):
    """StepRetryPolicy: ``attempts`` counts every try, the first included."""

    attempts: int = Field(default=1, ge=1, le=50)
    backoff: Literal["linear", "exponential"] = "exponential"
    delaySeconds: float = Field(default=5.0, ge=0, le=86400)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        factor = attempt if self.backoff == "linear" else 2 ** max(attempt - 1, 0)
        return float(self.delaySeconds * factor)


class InputSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    type: Literal["string", "integer", "number", "boolean", "object", "array"] = "string"
    required: bool = False
    default: Any = None
    description: str | None = None


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``90s``, ``30m``, ``24h``, ``2d``."""
    if isinstance(value, bool):
        raise ValueError("must be a number of seconds or a duration like '24h'")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError("must be a number of seconds or a duration like '24h'")
    return float(match.group(1)) * _UNITS[match.group(2)]


class ConfigSpec(_Model):
    maxConcurrentSteps: int = Field(default=8, ge=1, le=1000)
    maxSteps: int = Field(default=500, ge=1, le=1_000_000)
    suspendedStepTimeout: float = Field(default=86400.0, gt=0)

    @field_validator("suspendedStepTimeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)


class NodeSpec(_Model):
    id: str = Field(pattern=KEY_PATTERN)
    kind: StepKind
    bodyKey: str | None = Field(default=None, min_length=1, max_length=200)
    name: str | None = None
    description: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    outputKey: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    retry: StepRetryPolicy | None = None
    continueOnFail: bool = False
    extras: dict[str, Any] = Field(default_factory=dict)

    @property
    def body(self) -> str | None:
        """The body to run: the declared one, or the kind's default (None: no body)."""
        return self.bodyKey or DEFAULT_BODIES.get(self.kind)

    @property
    def attempts(self) -> int:
        return self.retry.attempts if self.retry else 1

    @property
    def idempotent(self) -> bool:
        return self.extras.get("idempotent") is not False

    @property
    def awaits_approval(self) -> bool:
        return self.extras.get("awaitApproval") is True


class EdgeSpec(_Model):
    source: str = Field(alias="from")
    to: str
    routeKey: str | None = Field(default=None, min_length=1, max_length=100)


class TriggerSpec(_Model):
    type: Literal["event", "schedule", "manual", "webhook"]
    eventType: str | None = Field(default=None, min_length=1, max_length=100)
    match: JsonObject | None = None
    schedule: str | None = None
    enabled: bool = True


class PipelineDefinition(_Model):
    key: str = Field(pattern=KEY_PATTERN)
    name: str = Field(min_length=1, max_length=200)
    version: int = Field(default=1, ge=1)
    enabled: bool = False
    description: str | None = None
    inputs: list[InputSpec] = Field(default_factory=list)
    config: ConfigSpec = Field(default_factory=ConfigSpec)
    reducers: dict[str, StateReducer] = Field(default_factory=dict)
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
    triggers: list[TriggerSpec] = Field(default_factory=list)

    # A definition is frozen and a run's snapshot is parsed once (pipelines.snapshots),
    # so what the planner derives from it is worked out once per run, not per step.
    @cached_property
    def by_id(self) -> dict[str, NodeSpec]:
        """The nodes by id."""
        return {n.id: n for n in self.nodes}

    @cached_property
    def incoming(self) -> dict[str, tuple[tuple[str, str | None], ...]]:
        """Every node's incoming edges as (source, routeKey), in declaration order."""
        edges: dict[str, list[tuple[str, str | None]]] = {n.id: [] for n in self.nodes}
        for e in self.edges:
            edges[e.to].append((e.source, e.routeKey))
        return {node_id: tuple(found) for node_id, found in edges.items()}

    def node(self, node_id: str) -> NodeSpec:
        return self.by_id[node_id]

    def reducer(self, key: str) -> StateReducer:
        return self.reducers.get(key, StateReducer.OVERRIDE)

    def to_json(self) -> JsonObject:
        """The canonical JSON form (what is stored and snapshotted into runs)."""
        data: JsonObject = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return data


class DefinitionError(Exception):
    """The document is not a valid definition; ``errors`` name node and field."""

    code = "invalid_definition"

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Loaded:
    definition: PipelineDefinition
    warnings: list[str]


# libyaml's safe loader when PyYAML was built with it: the pure-Python one took a
# tenth of a second for the built-in templates at every start.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_document(text: str | bytes, *, yaml_format: bool) -> Any:
    """A YAML or JSON document as Python data; a syntax error is a DefinitionError."""
    try:
        if yaml_format:
            return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader
        return json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:
        kind = "YAML" if yaml_format else "JSON"
        raise DefinitionError([f"document: not valid {kind}: {exc}"]) from None


def load_definition(data: Any, *, bodies: Collection[str] | None = None) -> Loaded:
    """Validate a definition; ``bodies`` (registered body keys) enables that warning."""
    if not isinstance(data, Mapping):
        raise DefinitionError(["document: must be a mapping with key, name, nodes, …"])
    try:
        definition = PipelineDefinition.model_validate(dict(data))
    except ValidationError as exc:
        raise DefinitionError(_pydantic_errors(exc, data)) from None
    errors = graph.check(definition)
    if errors:
        raise DefinitionError(errors)
    return Loaded(definition, _warnings(definition, bodies))


def _label(data: Mapping[str, Any], section: str, index: int) -> str:
    items = data.get(section)
    if section == "nodes" and isinstance(items, list) and index < len(items):
        item = items[index]
        if isinstance(item, Mapping) and isinstance(item.get("id"), str) and item["id"]:
            return f"nodes[{item['id']}]"
    if section == "inputs" and isinstance(items, list) and index < len(items):
        item = items[index]
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            return f"inputs[{item['name']}]"
    return f"{section}[{index}]"


def _pydantic_errors(exc: ValidationError, data: Mapping[str, Any]) -> list[str]:
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        parts: list[str] = []
        if len(loc) >= 2 and loc[0] in ("nodes", "edges", "triggers", "inputs"):
            if isinstance(loc[1], int):
                parts.append(_label(data, str(loc[0]), loc[1]))
                loc = loc[2:]
            else:
                parts.append(str(loc[0]))
                loc = loc[1:]
        parts.extend("from" if p == "source" else str(p) for p in loc)
        where = ".".join(parts) or "document"
        msg = str(err["msg"])
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append(f"{where}: {msg}")
    return out


def _warnings(d: PipelineDefinition, bodies: Collection[str] | None) -> list[str]:
    warnings = []
    for node in d.nodes:
        where = f"nodes[{node.id}]"
        body = node.body
        if bodies is not None and body is not None and body not in bodies:
            warnings.append(
                f"{where}.bodyKey: {body!r} is not registered; "
                "the step will fail with unregistered_body"
            )
        for key in node.extras:
            if key not in KNOWN_EXTRAS:
                near = difflib.get_close_matches(key, sorted(KNOWN_EXTRAS), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                warnings.append(f"{where}.extras.{key}: unknown key, ignored{hint}")
        script = node.extras.get("script")
        if isinstance(script, str) and "{{" in script:
            warnings.append(
                f"{where}.extras.script: placeholders are never rendered into a script; "
                "pass values through inputs (environment variables FF_<NAME>)"
            )
        if node.kind is StepKind.ROUTER:
            warnings.extend(_route_warnings(d, node))
    return warnings


def _route_warnings(d: PipelineDefinition, node: NodeSpec) -> list[str]:
    keys = {e.routeKey for e in d.edges if e.source == node.id and e.routeKey}
    cases = node.extras.get("cases")
    routes: list[str] = []
    if isinstance(cases, Mapping):
        routes.extend(str(v) for v in cases.values())
    elif isinstance(cases, list):
        routes.extend(str(v) for v in cases)
    if node.extras.get("default") is not None:
        routes.append(str(node.extras["default"]))
    return [
        f"nodes[{node.id}].extras: route {r!r} has no edge with that routeKey; "
        "choosing it runs nothing downstream"
        for r in dict.fromkeys(routes)
        if r not in keys
    ]
