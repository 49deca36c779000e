"""The modes of pipeline spaces: a step runs in its space's mode and cannot widen it."""

from __future__ import annotations

import pytest

from forgeflow.domain.modes import is_draft, step_mode_error


@pytest.mark.parametrize(
    ("space", "step", "code"),
    [
        ("review", None, None),
        ("review", "review", None),
        ("chat", None, None),
        ("review", "chat", "mode_widening"),
        ("plan", "chat", "mode_widening"),
        ("review", "plan", "mode_mismatch"),
        ("chat", "review", "mode_mismatch"),  # narrower: needs a space of its own
        ("review", "yolo", "invalid_mode"),
    ],
)
def test_a_step_runs_in_its_spaces_mode(space: str, step: str | None, code: str | None) -> None:
    refused = step_mode_error(space, step)
    assert (refused[0] if refused else None) == code


def test_only_plan_and_review_are_drafts() -> None:
    assert [m for m in ("chat", "plan", "review", None) if is_draft(m)] == ["plan", "review"]
