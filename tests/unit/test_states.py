"""AC-12: the code's states and transitions are exactly the specification's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from forgeflow.domain.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    TaskState,
    allowed_next,
    check_transition,
)

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec"
TICKED = re.compile(r"`([a-z_]+)`")


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def _prd_table() -> dict[str, set[str]]:
    section = _section((SPEC / "PRD.zh.md").read_text(), "### 6.1", "### 6.2")
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        targets = set() if "终态" in cells[2] else set(TICKED.findall(cells[2]))
        for state in TICKED.findall(cells[0]):
            table[state] = targets
    return table


def _architecture_table() -> dict[str, set[str]]:
    section = _section((SPEC / "ARCHITECTURE.zh.md").read_text(), "5.6 ", "6. 接口契约")
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = line.split("\t")
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        targets = set() if cells[1].strip() == "无" else set(TICKED.findall(cells[1]))
        for state in TICKED.findall(cells[0]):
            table[state] = targets
    return table


def _code_table() -> dict[str, set[str]]:
    return {s.value: {n.value for n in nxt} for s, nxt in TRANSITIONS.items()}


def test_prd_table_equals_code() -> None:
    assert _prd_table() == _code_table()


def test_architecture_table_equals_code() -> None:
    assert _architecture_table() == _code_table()


def test_enum_names_are_the_spec_names() -> None:
    assert {s.value for s in TaskState} == set(_prd_table()) == set(_architecture_table())


def test_terminal_states_never_move() -> None:
    for state in TERMINAL_STATES:
        assert not TRANSITIONS[state]
        for target in TaskState:
            with pytest.raises(IllegalTransition):
                check_transition("t", state.value, target.value)


def test_rest_fallback_success_is_reached_from_reply_verification_only() -> None:
    # §5.4: REST fallback success ends verifying_reply; no other state reaches it.
    reaching = {s for s in TaskState if TaskState.SUCCEEDED_WITH_REST_FALLBACK in allowed_next(s)}
    assert reaching == {TaskState.VERIFYING_REPLY}


def test_unknown_states_are_refused() -> None:
    with pytest.raises(IllegalTransition):
        check_transition("t", "queued", "exploded")
    with pytest.raises(IllegalTransition):
        check_transition("t", "mystery", "queued")
