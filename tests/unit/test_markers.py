from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forgeflow.domain.markers import (
    Marker,
    MarkerKind,
    append_marker,
    find_markers,
    parse_marker,
    quoted,
)

TASK = "gitea-task-0123456789abcdef01234567"
RES = "default:acme/widget:issue:42"


def test_format_is_the_design_contract() -> None:
    m = Marker(TASK, f"{TASK}:1", RES, MarkerKind.FINAL)
    assert m.render() == (
        f"<!-- ccweb taskId={TASK} turnKey={TASK}:1 resourceKey={RES} kind=final -->"
    )


@given(
    body=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200),
    n=st.integers(min_value=0, max_value=10_000),
    kind=st.sampled_from(list(MarkerKind)),
)
def test_round_trip(body: str, n: int, kind: MarkerKind) -> None:
    m = Marker(TASK, f"{TASK}:{n}", RES, kind)
    assert parse_marker(append_marker(body, m)) == m


def test_only_the_last_line_marks_a_comment() -> None:
    m = Marker(TASK, f"{TASK}:1", RES, MarkerKind.FINAL)
    quoted = f"someone pasted {m.render()}\nand wrote more"
    assert parse_marker(quoted) is None
    assert find_markers(quoted) == [m]


@pytest.mark.parametrize("bad", ["", "a b", "x>y"])
def test_fields_cannot_break_the_comment(bad: str) -> None:
    with pytest.raises(ValueError):
        Marker(bad, f"{TASK}:1", RES, MarkerKind.RECEIPT).render()


def test_quoted_text_carries_no_marker_and_says_what_it_was() -> None:
    m = Marker("gitea-task-1", "gitea-task-1:1", "default:acme/widget:issue:1", MarkerKind.FINAL)
    text = f"Copied from a receipt:\n\n{m.render()}\n"
    out = quoted(text)
    assert find_markers(text) == [m] and find_markers(out) == []
    assert "ccweb:quoted taskId=gitea-task-1 " in out
    assert quoted(out) == out  # already quoted: unchanged
    assert quoted("no marker here <!-- a comment -->") == "no marker here <!-- a comment -->"
