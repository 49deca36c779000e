"""Which Gitea reads a ```suggestion block (1.26 on; Forgejo by the Gitea release it names)
and what a review's line comment holds on either side of that version."""

from __future__ import annotations

import pytest

from forgeflow.domain import reviews as r
from forgeflow.domain.gitea_versions import gitea_release, renders_suggestions
from forgeflow.domain.markers import Marker, MarkerKind, parse_marker


@pytest.mark.parametrize(
    ("version", "release", "renders"),
    [
        ("1.26.0", (1, 26), True),
        ("1.26.0+dev-412-g1a2b3c4", (1, 26), True),
        ("v1.27.1", (1, 27), True),
        ("2.0.0-rc1", (2, 0), True),
        ("1.25.4", (1, 25), False),
        ("1.22.6", (1, 22), False),
        ("1.9.0", (1, 9), False),
        # Forgejo: its own number, then the Gitea release it follows.
        ("9.0.3+gitea-1.22.0", (1, 22), False),
        ("11.0.1+gitea-1.22.0", (1, 22), False),
        ("", None, False),
        ("development", None, False),
    ],
)
def test_the_gitea_release_decides(
    version: str, release: tuple[int, int] | None, renders: bool
) -> None:
    assert gitea_release(version) == release
    assert renders_suggestions(version) is renders


def test_an_unknown_version_renders_no_suggestion_block() -> None:
    assert renders_suggestions(None) is False


SUGGESTED = r.LineComment("app.py", "new", 3, "Use this:", suggestion="import json\n")


def test_from_1_26_a_suggestion_is_giteas_suggestion_block() -> None:
    body = r.comment_body(SUGGESTED, suggestions=renders_suggestions("1.26.0"))
    assert body == "Use this:\n\n```suggestion\nimport json\n```"


def test_below_1_26_a_suggestion_is_a_plain_block_under_suggested_replacement() -> None:
    body = r.comment_body(SUGGESTED, suggestions=renders_suggestions("1.25.4"))
    assert body == "Use this:\n\nSuggested replacement:\n\n```\nimport json\n```"
    assert "```suggestion" not in body
    # The fence still outgrows a backtick run in the suggestion.
    ticks = r.LineComment("a.md", "new", 1, "Quote it:", suggestion="```py")
    assert r.comment_body(ticks, suggestions=False).endswith("\n````\n```py\n````")


def test_a_comment_without_a_suggestion_is_its_text_on_either_side() -> None:
    plain = r.LineComment("app.py", "new", 3, "Why?")
    assert r.comment_body(plain, suggestions=False) == r.comment_body(plain) == "Why?"


def test_a_moved_comment_in_the_summary_follows_the_same_choice() -> None:
    marker = Marker(
        "gitea-task-1", "gitea-task-1:1", "default:a/b:pull_request:1", MarkerKind.REVIEW
    )
    moved = (r.LineComment("app.py", "new", 99, "Far away", suggestion="x = 1"),)
    old = r.review_body("Summary.", moved, marker, suggestions=False)
    assert "Suggested replacement:" in old and "```suggestion" not in old
    new = r.review_body("Summary.", moved, marker, suggestions=True)
    assert "```suggestion\n  x = 1" in new
    assert parse_marker(old) == parse_marker(new) == marker
