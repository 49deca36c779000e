"""docs/pipelines.md's tables against the pipeline vocabulary: the step kinds, the bodies
a definition may name, the closed set of domain events with their payloads, and the
built-in templates with their default switch and triggers."""

from __future__ import annotations

import re

from forgeflow.domain.events import EVENT_TYPES, PAYLOAD_FIELDS
from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.kinds import StepKind
from forgeflow.pipelines.registry import PipelineBodyRegistry
from forgeflow.pipelines.seeds import load_builtins
from tests.support import docs

# The fields every Gitea event carries besides its own (the page says so once).
GITEA_FIELDS = {"repoKey", "owner", "repo", "sender", "deliveryId"}


def _rows(header: str) -> list[list[str]]:
    """The rows of the page's table whose header row starts with ``header``."""
    text = docs.read("docs/pipelines.md")
    table = text.split(f"\n| {header} |", 1)[1].split("\n\n", 1)[0]
    return docs.table_rows(table)[1:]  # the header's rule row on


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_kinds_table_lists_exactly_the_step_kinds() -> None:
    documented = {name for row in _rows("kind") for name in _names(row[0])}
    assert documented == {k.value for k in StepKind}


def test_the_bodies_table_lists_exactly_the_registered_bodies() -> None:
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    documented = {name for row in _rows("body") for name in _names(row[0])}
    assert documented == registry.keys()


def test_the_events_table_is_the_closed_set_with_its_payloads() -> None:
    rows = {_names(r[0])[0]: r[2] for r in _rows("event") if _names(r[0])}
    assert set(rows) == set(EVENT_TYPES)
    wrong = []
    for event, cell in rows.items():
        same = re.fullmatch(r"as `(\w+)`", cell)
        listed = rows[same.group(1)] if same else cell
        documented = {f.strip() for f in _names(listed)[0].split(",")}
        documented = {re.sub(r" \(.*", "", f) for f in documented}
        code = set(PAYLOAD_FIELDS[event])
        extra = GITEA_FIELDS if code >= GITEA_FIELDS else {"repoKey"}  # every run has it
        if documented | extra != code | extra:
            wrong.append(f"{event}: docs {sorted(documented)}, code {sorted(code)}")
    assert not wrong, "\n".join(wrong)


def test_the_builtin_templates_table_says_their_switch_and_triggers() -> None:
    rows = {_names(r[0])[0]: r for r in _rows("key") if _names(r[0])}
    shipped = {loaded.definition.key: loaded.definition for loaded in load_builtins()}
    assert set(rows) == set(shipped)
    wrong = []
    for key, definition in shipped.items():
        row = rows[key]
        if row[1] != ("yes" if definition.enabled else "no"):
            wrong.append(f"{key}: enabled {definition.enabled}, documented {row[1]!r}")
        for trigger in definition.triggers:
            named = {
                "manual": "manual",
                "webhook": "webhook",
                "event": f"`{trigger.eventType}`",
                "schedule": f"`{trigger.schedule}`",
            }[trigger.type]
            if named not in row[2]:
                wrong.append(f"{key}: trigger {named} not in {row[2]!r}")
    assert not wrong, "\n".join(wrong)
