"""The receipt as a tracking comment: what it says while the task moves (pure; no I/O).

The receipt stays one comment that starts with ``giteabot: 已收到`` (the spec's text);
below it, the place in the queue, the agent's plan as a checklist, what it does now,
the elapsed time, and at the end the outcome, the tokens (and their cost, with prices
configured) and where the work went. Every
field is bounded so that an agent with a long plan cannot make the comment grow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_STEPS = 20
MAX_LINE = 160
MAX_BODY = 4000
_MARKS = {"completed": "x", "inProgress": " ", "pending": " "}


def _line(text: object) -> str:
    """One line of untrusted text: no newlines, no markup that closes our list, bounded."""
    flat = " ".join(str(text).split())
    flat = flat.replace("<", "‹").replace(">", "›")
    return flat if len(flat) <= MAX_LINE else flat[: MAX_LINE - 1] + "…"


def plan_steps(plan: Any) -> tuple[tuple[str, str], ...]:
    """Codex's ``turn/plan/updated`` plan (``[{step, status}]``) as bounded pairs."""
    steps: list[tuple[str, str]] = []
    for item in plan if isinstance(plan, list) else []:
        if not isinstance(item, dict) or len(steps) >= MAX_STEPS:
            continue
        status = str(item.get("status") or "pending")
        steps.append((_line(item.get("step") or ""), status if status in _MARKS else "pending"))
    return tuple(steps)


def doing_line(item: Any) -> str | None:
    """What a started item is, in one line: a command, a tool call; None for others."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "commandExecution":
        return _line(f"$ {item.get('command') or ''}")
    if kind == "mcpToolCall":
        return _line(f"{item.get('server')}.{item.get('tool')}")
    if kind == "fileChange":
        return "editing files"
    if kind == "webSearch":
        return _line(f"searching: {item.get('query') or ''}")
    return None


@dataclass(frozen=True, slots=True)
class View:
    """What the receipt shows now. ``outcome`` set: the task is over (the final edit)."""

    header: str
    options: str | None = None  # the task's model and cap (domain/options.receipt_line)
    plan: tuple[tuple[str, str], ...] = ()
    doing: str | None = None
    elapsed_seconds: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: str | None = None  # with prices configured (domain/prices.format_cost)
    outcome: str | None = None
    where: tuple[str, ...] = ()  # branch, pull request
    link: str = ""


def _elapsed(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def render(view: View) -> str:
    """The receipt's text (without its marker), at most MAX_BODY characters."""
    lines = [view.header]
    if view.options:
        lines.append(view.options)
    if view.plan:
        lines.append("")
        lines += [f"- [{_MARKS[status]}] {step}" for step, status in view.plan]
    if view.outcome is None and view.doing:
        doing = view.doing.replace("`", "'")
        lines += ["", f"正在 / now: `{doing}`"]
    facts = []
    if view.elapsed_seconds is not None:
        facts.append(f"用时 / elapsed {_elapsed(view.elapsed_seconds)}")
    if view.input_tokens or view.output_tokens:
        facts.append(f"tokens: {view.input_tokens} in, {view.output_tokens} out")
    if view.cost is not None:
        facts.append(f"费用 / cost: {_line(view.cost)}")
    if view.outcome is not None:
        lines += ["", f"结果 / outcome: {_line(view.outcome)}"]
    if facts:
        lines += ["", " · ".join(facts)]
    lines += [_line(w) for w in view.where]
    if view.link:
        lines += ["", view.link]
    body = "\n".join(lines)
    return body if len(body) <= MAX_BODY else body[: MAX_BODY - 1] + "…"
