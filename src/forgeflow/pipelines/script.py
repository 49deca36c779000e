"""``pipeline.bashScript``: ``bash -c <extras.script>`` in the repository's jail.

The script text is taken as written and never rendered: values from the state bag
reach it only as environment variables ``FF_<NAME>``, one per rendered input, so a
hostile value (``$(rm -rf /)``, quotes, newlines) is data, never code. It runs from
an argv list (no shell in between) inside the repository's jail, as the agent's
commands do (the clone is the agent's: a ``Makefile``, hooks or a git configuration in
it must not reach the host), read-only for a draft space, in a jail around the run's
own scratch folder when there is no repository; with a time limit
(``extras.timeoutSeconds``, default 600 s) after which the jail is killed. Nothing of
forgeflow's environment (its settings, its secrets) is passed on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from forgeflow.domain.ids import InvalidName, RepoRef
from forgeflow.domain.json import JsonObject
from forgeflow.pipelines.ports import ScriptRequest
from forgeflow.pipelines.registry import StepContext, StepFailed
from forgeflow.redaction import redact_text

DEFAULT_TIMEOUT = 600.0
MAX_OUTPUT = 64 * 1024
_NAME = re.compile(r"[^A-Z0-9_]")


def env_name(key: str) -> str:
    return "FF_" + _NAME.sub("_", key.upper())


def env_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if "\x00" in text:
        raise StepFailed(
            "invalid_input", "a value for the script holds a NUL byte", retryable=False
        )
    return text


def script_env(inputs: Mapping[str, Any], ctx: StepContext) -> dict[str, str]:
    """All the script gets: one variable per rendered input, and the step's ids. The
    jail adds its fixed list (PATH, HOME, ...); nothing of forgeflow's environment."""
    env = {env_name(k): env_value(v) for k, v in inputs.items()}
    env["FF_RUN_ID"] = ctx.run_id
    env["FF_STEP_ID"] = ctx.step_id
    if ctx.item_index is not None:
        env["FF_ITEM_INDEX"] = str(ctx.item_index)
        env.setdefault("FF_ITEM", env_value(ctx.item))
    return env


def _repo(inputs: Mapping[str, Any]) -> RepoRef | None:
    value = inputs.get("repo")
    if not value:
        return None
    owner, _, name = str(value).partition("/")
    try:
        return RepoRef(owner, name)
    except InvalidName as exc:
        raise StepFailed("invalid_resource", str(exc), retryable=False) from None


def _tail(data: bytes) -> str:
    return redact_text(data[-MAX_OUTPUT:].decode("utf-8", "replace"))


async def bash_script(ctx: StepContext) -> JsonObject:
    script = ctx.extras.get("script")
    if not isinstance(script, str) or not script.strip():
        raise StepFailed("invalid_script", "extras.script is required", retryable=False)
    limit = ctx.extras.get("timeoutSeconds")
    seconds = float(limit) if isinstance(limit, int | float) and limit > 0 else DEFAULT_TIMEOUT
    space = ctx.extras.get("spaceId")
    request = ScriptRequest(
        run_id=ctx.run_id,
        repo=_repo(ctx.inputs),
        space_id=str(ctx.render(space)) if space else None,
        argv=("bash", "-c", script, f"forgeflow-{ctx.step_id}"),
        env=script_env(ctx.inputs, ctx),
        timeout=seconds,
    )
    try:
        done = await ctx.ports.workspace.run_script(request)
    except TimeoutError:
        raise StepFailed("script_timeout", f"the script ran longer than {seconds:g}s") from None
    if done.code != 0:
        raise StepFailed("script_failed", f"exit code {done.code}: {_tail(done.stderr)[-2000:]}")
    return {
        "exitCode": 0,
        "stdout": _tail(done.stdout).strip(),
        "stderr": _tail(done.stderr)[-4000:],
    }
