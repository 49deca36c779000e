"""docs/tools.md's table against forgeflow's own Gitea tools (``gitea_tools.server.TOOLS``):
the same tools, the same arguments, ``name?`` exactly for the optional ones without a
documented default, and the defaults and bounds the table gives (``limit`` (20, ≤ 50))."""

from __future__ import annotations

import re

from pydantic.fields import FieldInfo

from forgeflow.agent.gitea_tools.server import TOOLS
from tests.support import docs


def _table() -> dict[str, str]:
    """Each tool of the page's table with its arguments cell."""
    rows = docs.table_rows(docs.read("docs/tools.md").split("## Tools\n", 1)[1])
    return {m.group(1): r[1] for r in rows if (m := re.fullmatch(r"`([a-z_]+)`", r[0]))}


def _arguments(cell: str) -> dict[str, str]:
    """The top-level arguments of a cell, each with what follows it up to the next one
    (``(20, ≤ 50)``); an item list in brackets is the argument's, not the tool's."""
    found: dict[str, str] = {}
    depth, name = 0, None
    for token in re.findall(r"`[^`]+`|\(|\)|[^`()]+", cell):
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        elif depth == 0 and token.startswith("`"):
            name = token.strip("`")
            found[name] = ""
            continue
        if name is not None:
            found[name] += token
    return {k: v for k, v in found.items() if k != "—"}


def _bounds(field: FieldInfo) -> tuple[object, object]:
    le = next((m.le for m in field.metadata if hasattr(m, "le")), None)
    return field.default, le


def test_the_table_lists_exactly_the_tools() -> None:
    assert set(_table()) == {t.name for t in TOOLS}


def test_each_tool_has_the_documented_arguments() -> None:
    table = _table()
    wrong = []
    for tool in TOOLS:
        documented = _arguments(table[tool.name])
        names = {re.sub(r"(\[\])?\??$", "", k): k for k in documented}
        if set(names) != set(tool.args.model_fields):
            wrong.append(f"{tool.name}: docs {sorted(names)}, code {list(tool.args.model_fields)}")
            continue
        for name, field in tool.args.model_fields.items():
            written, rest = names[name], documented[names[name]]
            optional = written.endswith("?")
            if field.is_required() and optional:
                wrong.append(f"{tool.name}.{name}: required, documented optional")
            if not field.is_required() and not optional and "(" not in rest:
                wrong.append(f"{tool.name}.{name}: optional, with no `?` and no default")
            numbers = re.findall(r"\d[\d ]*", rest.replace(" 000", "000"))
            default, le = _bounds(field)
            if numbers and isinstance(default, int) and int(numbers[0]) != default:
                wrong.append(f"{tool.name}.{name}: default {default}, documented {numbers[0]}")
            if "≤" in rest and le is not None and int(numbers[-1]) != le:
                wrong.append(f"{tool.name}.{name}: at most {le}, documented {numbers[-1]}")
    assert not wrong, "\n".join(wrong)
