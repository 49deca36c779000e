"""A turn's transcript, from inside a real turn: the real `codex app-server` runs what
the scripted model asks, and the task's transcript shows it, bounded and redacted."""

from __future__ import annotations

import json
import re
from typing import Any

from forgeflow_testkit.model_steps import ShellCall
from tests.support.agentic import Agentic
from tests.support.turns import script_turn, shell_turn


def transcript(agentic: Agentic, task_id: str, **params: Any) -> dict[str, Any]:
    with agentic.ff.admin() as admin:
        answer = admin.get(f"/api/gitea-workflow/tasks/{task_id}/transcript", params=params)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


def test_the_transcript_shows_commands_tool_calls_and_messages(agentic: Agentic) -> None:
    turn = shell_turn(agentic, "echo transcript-probe; ls no-such-file; echo after")
    items = transcript(agentic, turn.task_id)["items"]
    kinds = [e["kind"] for e in items]
    assert kinds.count("command") == 1 and "tool_call" in kinds and "message" in kinds, kinds
    command = next(e for e in items if e["kind"] == "command")
    assert "transcript-probe" in command["title"]
    assert "transcript-probe" in command["body"] and "no-such-file" in command["body"]
    assert command["exitCode"] == 0 and command["status"] == "completed"
    assert command["taskId"] == turn.task_id and command["turnId"]
    tool = next(e for e in items if e["kind"] == "tool_call")
    assert tool["title"].startswith("gitea.") and "Done." in tool["body"]
    assert next(e for e in items if e["kind"] == "message")["body"] == "Done."
    # In the order they finished; pages follow ``after``.
    seqs = [e["seq"] for e in items]
    assert seqs == sorted(seqs)
    page = transcript(agentic, turn.task_id, after=seqs[0], limit=1)
    assert [e["seq"] for e in page["items"]] == [seqs[1]] and page["nextAfter"] == seqs[1]


def test_a_secret_the_agent_prints_never_reaches_the_transcript(agentic: Agentic) -> None:
    # The one secret the agent can read: its repository's capability for the brokers,
    # in the jail's environment. The model saw it (that is the agent's own output);
    # the transcript forgeflow keeps and shows must not.
    turn = shell_turn(agentic, 'echo "capability = $AGENT_CAPABILITY"')
    found = re.search(r"capability = (\S+)", turn.output)
    assert found is not None, turn.output
    capability = found.group(1)
    stored = json.dumps(transcript(agentic, turn.task_id))
    assert capability not in stored
    assert "capability = ***" in stored, stored


def test_an_unknown_task_has_no_transcript(agentic: Agentic) -> None:
    with agentic.ff.admin() as admin:
        answer = admin.get("/api/gitea-workflow/tasks/gitea-task-nope/transcript")
    assert answer.status_code == 404 and answer.json()["error"] == "task_not_found"


PATCH = """apply_patch <<'EOF'
*** Begin Patch
*** Add File: hello.txt
+hello from a patch
*** End Patch
EOF"""


def test_a_file_change_shows_its_path_and_content(agentic: Agentic) -> None:
    # codex applies a shell `apply_patch` itself and reports a fileChange item.
    script_turn(agentic.model, [ShellCall(PATCH)])
    task_id = agentic.mention("@ccweb-bot add a greeting")
    assert agentic.finished(task_id)["task"]["state"] == "succeeded"
    changes = [e for e in transcript(agentic, task_id)["items"] if e["kind"] == "file_change"]
    assert len(changes) == 1, changes
    assert changes[0]["title"].endswith("/hello.txt")
    assert changes[0]["body"].startswith("add ") and "hello from a patch" in changes[0]["body"]
