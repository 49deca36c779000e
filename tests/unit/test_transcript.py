"""What a turn's items become in its transcript: kept, bounded and redacted."""

from __future__ import annotations

from typing import Any

from forgeflow.domain.transcript import (
    DIFF_LIMIT,
    OUTPUT_LIMIT,
    EntryKind,
    clip,
    from_item,
)
from forgeflow.redaction import MASK, redact, register_secrets

CANARY = "canary-secret-7f3a9c2e1b"


def _entry(item: dict[str, Any]) -> Any:
    return from_item(item, redact)


def test_command_keeps_command_exit_code_and_output() -> None:
    entry = _entry(
        {
            "type": "commandExecution",
            "id": "i1",
            "command": "git status --short",
            "cwd": "/w",
            "status": "completed",
            "exitCode": 1,
            "aggregatedOutput": "fatal: not a git repository\n",
        }
    )
    assert entry.kind is EntryKind.COMMAND
    assert entry.title == "git status --short"
    assert entry.exit_code == 1 and entry.status == "completed"
    assert entry.body == "fatal: not a git repository\n" and not entry.truncated


def test_file_change_keeps_every_path_and_diff() -> None:
    entry = _entry(
        {
            "type": "fileChange",
            "id": "i2",
            "status": "completed",
            "changes": [
                {"path": "a.py", "kind": {"type": "update"}, "diff": "-x\n+y\n"},
                {"path": "b.md", "kind": {"type": "add"}, "diff": "+hello\n"},
            ],
        }
    )
    assert entry.kind is EntryKind.FILE_CHANGE
    assert entry.title == "a.py, b.md"
    assert "-x\n+y" in entry.body and "+hello" in entry.body


def test_tool_call_shows_arguments_and_result_with_secret_keys_masked() -> None:
    entry = _entry(
        {
            "type": "mcpToolCall",
            "id": "i3",
            "server": "gitea",
            "tool": "create_issue_comment",
            "status": "completed",
            "arguments": {"body": "done", "token": "abc-not-registered"},
            "result": {"content": [{"type": "text", "text": '{"id": 7}'}]},
        }
    )
    assert entry.kind is EntryKind.TOOL_CALL and entry.title == "gitea.create_issue_comment"
    assert '"body": "done"' in entry.body and '{"id": 7}' in entry.body
    assert "abc-not-registered" not in entry.body and MASK in entry.body


def test_registered_secrets_never_reach_an_entry() -> None:
    register_secrets([CANARY])
    items = [
        {"type": "agentMessage", "id": "m", "text": f"the key is {CANARY}"},
        {
            "type": "commandExecution",
            "id": "c",
            "command": f"echo {CANARY}",
            "status": "completed",
            "exitCode": 0,
            "aggregatedOutput": f"{CANARY}\n" * 5000,
        },
        {
            "type": "fileChange",
            "id": "f",
            "status": "completed",
            "changes": [{"path": "k", "kind": {"type": "add"}, "diff": f"+{CANARY}"}],
        },
    ]
    for item in items:
        entry = _entry(item)
        assert CANARY not in entry.title + entry.body
        assert MASK in entry.title + entry.body


def test_long_output_is_cut_in_the_middle_and_says_so() -> None:
    output = "start\n" + "x" * (OUTPUT_LIMIT * 3) + "\nexit: the end"
    entry = _entry(
        {
            "type": "commandExecution",
            "id": "c",
            "command": "make",
            "status": "completed",
            "exitCode": 2,
            "aggregatedOutput": output,
        }
    )
    assert entry.truncated
    assert entry.body.startswith("start\n") and entry.body.endswith("exit: the end")
    assert "characters left out" in entry.body
    assert len(entry.body) < OUTPUT_LIMIT + 100


def test_clip_keeps_short_text_whole() -> None:
    assert clip("short", DIFF_LIMIT) == ("short", False)


def test_items_a_reviewer_has_no_use_for_are_skipped() -> None:
    for kind in ("userMessage", "reasoning", "contextCompaction"):
        assert _entry({"type": kind, "id": "x"}) is None
