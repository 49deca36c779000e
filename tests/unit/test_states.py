"""The code's states and transitions are exactly the specification's, as docs/states.md
keeps them."""

from __future__ import annotations

import re
from pathlib import Path

from forgeflow.domain.admission import Refusal
from forgeflow.domain.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    TaskState,
    allowed_next,
    is_allowed,
)
from forgeflow.store.tasks import StaleStateVersion

STATES_DOC = Path(__file__).resolve().parents[2] / "docs" / "states.md"
TICKED = re.compile(r"`([a-z_]+)`")


def _doc_table() -> dict[str, set[str]]:
    """docs/states.md's table: the specification's, kept in the repository."""
    table: dict[str, set[str]] = {}
    for line in STATES_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        targets = set() if cells[2] == "terminal" else set(TICKED.findall(cells[2]))
        for state in TICKED.findall(cells[0]):
            table[state] = targets
    return table


def _code_table() -> dict[str, set[str]]:
    return {s.value: {n.value for n in nxt} for s, nxt in TRANSITIONS.items()}


def test_the_documented_table_equals_code() -> None:
    assert _doc_table() == _code_table()


def test_enum_names_are_the_documented_names() -> None:
    assert {s.value for s in TaskState} == set(_doc_table())


def test_terminal_states_have_no_moves() -> None:
    # The store's transition refusing them is tests/integration/test_store.py's.
    for state in TERMINAL_STATES:
        assert not TRANSITIONS[state]
        assert not any(is_allowed(state.value, target.value) for target in TaskState)


def test_rest_fallback_success_is_reached_from_reply_verification_only() -> None:
    # §5.4: REST fallback success ends verifying_reply; no other state reaches it.
    reaching = {s for s in TaskState if TaskState.SUCCEEDED_WITH_REST_FALLBACK in allowed_next(s)}
    assert reaching == {TaskState.VERIFYING_REPLY}


def test_unknown_states_are_refused() -> None:
    assert not is_allowed("queued", "exploded")
    assert not is_allowed("mystery", "queued")


def test_a_delivery_that_starts_nothing_is_no_task_state() -> None:
    # ignored and duplicate are the webhook's answers, not states a task reaches.
    names = {s.value for s in TaskState}
    assert "ignored" not in names and "duplicate" not in names


def test_the_refusal_codes_the_doc_names_are_the_codes() -> None:
    text = STATES_DOC.read_text()
    for code in (IllegalTransition.code, StaleStateVersion.code, Refusal.INVALID_OPTIONS.value):
        assert f"`{code}`" in text, code
