"""Model behaviours for the scripted model that act like a coding agent in a forgeflow
turn: read the prompt, answer on Gitea through the MCP tool with the marker it was given.

The behaviour is derived from what codex really sent (the user message of the turn),
so a test proves that forgeflow's prompt carries what the agent needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import Step, gitea_comment, message

_MARKER = re.compile(
    r"<!-- ccweb taskId=(?P<task>\S+) turnKey=(?P<turn>\S+) "
    r"resourceKey=default:(?P<owner>[^/\s]+)/(?P<repo>[^:\s]+):(?P<kind>\w+):(?P<n>\d+) "
    r"kind=final(?P<state> state=waiting_user)? -->"
)


@dataclass(frozen=True)
class TurnAsk:
    owner: str
    repo: str
    number: int
    marker: str
    prompt: str
    waiting_marker: str | None = None


def read_turn(request: RecordedRequest) -> TurnAsk | None:
    """The forgeflow turn this request belongs to, from its last user message."""
    last = request.last_input
    if last is None or last.get("type") != "message" or last.get("role") != "user":
        return None
    texts = request.texts("user")
    prompt = texts[-1] if texts else ""
    found = [m for m in _MARKER.finditer(prompt) if not m["state"]]
    if not found:
        return None
    m = found[-1]
    waiting = [w.group(0) for w in _MARKER.finditer(prompt) if w["state"]]
    return TurnAsk(
        m["owner"], m["repo"], int(m["n"]), m.group(0), prompt, waiting[-1] if waiting else None
    )


def answering_agent(
    model: ScriptedModel,
    *,
    answer: str = "Here is my answer.",
    forget: int = 0,
    closing: str = "Posted my answer on Gitea.",
) -> None:
    """Every forgeflow turn: post ``answer`` + the marker through the Gitea MCP tool, then
    say ``closing``. The first ``forget`` turns answer in chat only (they "forget" to
    comment), to exercise the reply retry and the REST fallback."""
    forgotten = [0]

    def turn(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        if forgotten[0] < forget:
            forgotten[0] += 1
            return message(f"{answer} (forgot to post it)")
        return gitea_comment(ask.owner, ask.repo, ask.number, f"{answer}\n\n{ask.marker}")

    model.respond(last_input_is_tool_output(), lambda _r: message(closing))
    model.respond(lambda r: read_turn(r) is not None, turn)


def asking_agent(model: ScriptedModel, question: str, *, times: int = 1) -> None:
    """The next ``times`` turns ask the user ``question`` with the waiting marker."""

    def turn(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None and ask.waiting_marker is not None
        return gitea_comment(ask.owner, ask.repo, ask.number, f"{question}\n\n{ask.waiting_marker}")

    model.respond(lambda r: read_turn(r) is not None, turn, times=times, first=True)
