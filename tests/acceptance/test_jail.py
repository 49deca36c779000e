"""The agent's jail, attacked from inside a real turn: the scripted model has the real
`codex app-server` run a shell command, the test reads what the command printed (the
`function_call_output` codex sends back to the model) and the agent then answers as
usual, so the task succeeds. Every attack must find nothing; the agent can still work."""

from __future__ import annotations

import os
from pathlib import Path

from forgeflow_testkit.agents import TurnAsk, answering_agent, read_turn
from forgeflow_testkit.model_server import RecordedRequest, last_input_is_tool_output
from forgeflow_testkit.model_steps import (
    Reply,
    ShellCall,
    Step,
    gitea_comment,
    message,
    new_id,
)
from tests.support.agentic import Agentic

START = "__START__"
END = "__END__"


def run_in_turn(agentic: Agentic, command: str) -> str:
    """Mention the bot; in its turn the agent runs ``command`` in its shell, then answers.
    Returns what the command printed (stdout and stderr), once the task has succeeded."""
    model = agentic.model
    shell_id, comment_id = new_id("call"), new_id("call")
    asks: list[TurnAsk] = []

    def shell(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        script = f"echo {START}\n{{\n{command}\n}} 2>&1\necho {END}"
        return Reply.of(ShellCall(script, call_id=shell_id))

    def answer(_request: RecordedRequest) -> Step:
        ask = asks[0]
        body = f"Checked.\n\n{ask.marker}"
        return gitea_comment(ask.owner, ask.repo, ask.number, body, call_id=comment_id)

    model.respond(
        last_input_is_tool_output(comment_id),
        lambda _r: message("Posted my answer."),
        times=1,
        first=True,
    )
    model.respond(last_input_is_tool_output(shell_id), answer, times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, shell, times=1, first=True)
    task = agentic.mention("@ccweb-bot please check your sandbox")
    detail = agentic.finished(task)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    outputs = [
        o["output"]
        for r in model.requests
        for o in r.function_call_outputs()
        if o.get("call_id") == shell_id
    ]
    # Every later request of the thread repeats it: the first one is the answer.
    assert outputs, "the shell call's output never reached the model"
    text = outputs[0]
    assert isinstance(text, str), text
    print(text)
    assert START in text and END in text, f"the command did not run to its end: {text}"
    return text.split(START, 1)[1].rsplit(END, 1)[0]


def test_probe(agentic: Agentic) -> None:
    out = run_in_turn(
        agentic,
        "id; ls -la /; cat /proc/*/environ | tr '\\0' '\\n'; touch /x /etc/x /usr/x; ls /tmp; pwd; cat ~/.codex/config.toml",
    )
    print(out)
    assert False
