"""A real turn that runs a shell command: the scripted model has the real
``codex app-server`` run it, then answers on Gitea as usual. The attack and publishing
tests read what the command printed (the ``function_call_output`` codex sends back)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.model_server import (
    RecordedRequest,
    ScriptedModel,
    last_input_is_tool_output,
)
from forgeflow_testkit.model_steps import (
    Reply,
    ShellCall,
    Step,
    ToolCall,
    delay,
    gitea_comment,
    message,
    new_id,
)
from tests.support.agentic import Agentic

START = "__START__"
END = "__END__"


@dataclass(frozen=True)
class Turn:
    task_id: str
    detail: dict[str, Any]  # the task's detail once it ended
    output: str  # what the command printed (stdout and stderr)
    prompt: str  # the user message of the turn, as codex sent it


def wrapped(command: str) -> str:
    """``command`` between markers, so a test knows it ran to its end."""
    return f"echo {START}\n{{\n{command}\n}} 2>&1\necho {END}"


def tool_output(agentic: Agentic, call_id: str) -> str:
    """What the call ``call_id`` returned to the model (later requests repeat it)."""
    outputs = [
        str(o["output"])
        for r in agentic.model.requests
        for o in r.function_call_outputs()
        if o.get("call_id") == call_id
    ]
    assert outputs, f"the output of {call_id} never reached the model"
    return outputs[0]


def printed(agentic: Agentic, call_id: str) -> str:
    """What the shell call ``call_id`` printed between the markers."""
    text = tool_output(agentic, call_id)
    assert START in text and END in text, f"the command did not run to its end:\n{text}"
    return text.split(START, 1)[1].rsplit(END, 1)[0]


def shell_turn(
    agentic: Agentic,
    command: str | Callable[[], str],
    text: str = "@ccweb-bot please check this",
) -> Turn:
    """Mention the bot; in its turn the agent runs ``command``, then answers on Gitea.
    Fails unless the task succeeded and the command ran to its end. A callable
    ``command`` is written when the turn asks the model (its app-server runs by then)."""
    model = agentic.model
    shell_id, comment_id = new_id("call"), new_id("call")
    asks: list[TurnAsk] = []

    def shell(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        script = command() if callable(command) else command
        return Reply.of(ShellCall(wrapped(script), call_id=shell_id))

    def answer(_request: RecordedRequest) -> Step:
        ask = asks[0]
        body = f"Done.\n\n{ask.marker}"
        return gitea_comment(ask.owner, ask.repo, ask.number, body, call_id=comment_id)

    # Ahead of any other rule, each once: this turn's shell call, then its answer.
    model.respond(
        last_input_is_tool_output(comment_id), lambda _r: message("Done."), times=1, first=True
    )
    model.respond(last_input_is_tool_output(shell_id), answer, times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, shell, times=1, first=True)
    task_id = agentic.mention(text)
    detail = agentic.finished(task_id)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    return Turn(task_id, detail, printed(agentic, shell_id), asks[0].prompt)


def section(output: str, name: str) -> str:
    """The lines a command printed after ``echo '== name'``, up to the next section."""
    found = re.search(rf"^== {re.escape(name)}\n(.*?)(?=^== |\Z)", output, re.S | re.M)
    assert found is not None, f"no section {name!r} in:\n{output}"
    return found.group(1)


def script_turn(
    model: ScriptedModel, calls: Sequence[ShellCall | ToolCall], pauses: Sequence[float] = ()
) -> None:
    """The next turn makes ``calls`` (shell commands or tool calls) one after another (the
    model thinks ``pauses[i]`` seconds before call ``i``, when given), then answers
    "Done." on Gitea."""
    ids = [new_id("call") for _ in calls]
    comment_id = new_id("call")
    asks: list[TurnAsk] = []

    def first(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return Reply.of(replace(calls[0], call_id=ids[0]))

    def answer(_request: RecordedRequest) -> Step:
        ask = asks[0]
        body = f"Done.\n\n{ask.marker}"
        return gitea_comment(ask.owner, ask.repo, ask.number, body, call_id=comment_id)

    def then(n: int) -> Callable[[RecordedRequest], Step]:
        step = Reply.of(replace(calls[n], call_id=ids[n]))
        pause = pauses[n] if n < len(pauses) else 0.0
        return lambda _r: delay(pause, step) if pause else step

    # Ahead of any other rule, each once, the last first (rules added later match first).
    model.respond(
        last_input_is_tool_output(comment_id), lambda _r: message("Done."), times=1, first=True
    )
    model.respond(last_input_is_tool_output(ids[-1]), answer, times=1, first=True)
    for n in range(len(calls) - 1, 0, -1):
        model.respond(last_input_is_tool_output(ids[n - 1]), then(n), times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, first, times=1, first=True)
