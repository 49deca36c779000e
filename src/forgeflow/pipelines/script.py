"""``pipeline.bashScript``: ``bash -c <extras.script>`` in the repository's workspace.

The script text is taken as written and never rendered: values from the state bag
reach it only as environment variables ``FF_<NAME>``, one per rendered input, so a
hostile value (``$(rm -rf /)``, quotes, newlines) is data, never code. It runs from
an argv list (no shell in between), in its own process group, with a time limit
(``extras.timeoutSeconds``, default 600 s) after which the whole group is killed.
forgeflow's own settings (``FORGEFLOW_*``, among them its secrets) are not passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Mapping
from typing import Any

from forgeflow.domain.ids import InvalidName, RepoRef
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
    env.update({env_name(k): env_value(v) for k, v in inputs.items()})
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


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(data: bytes) -> str:
    return redact_text(data[-MAX_OUTPUT:].decode("utf-8", "replace"))


async def bash_script(ctx: StepContext) -> dict[str, Any]:
    script = ctx.extras.get("script")
    if not isinstance(script, str) or not script.strip():
        raise StepFailed("invalid_script", "extras.script is required", retryable=False)
    cwd = ctx.ports.workspace.script_dir(ctx.run_id, _repo(ctx.inputs))
    env = script_env(ctx.inputs, ctx)
    limit = ctx.extras.get("timeoutSeconds")
    seconds = float(limit) if isinstance(limit, int | float) and limit > 0 else DEFAULT_TIMEOUT
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        f"forgeflow-{ctx.step_id}",
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(seconds):
            out, err = await proc.communicate()
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        raise StepFailed("script_timeout", f"the script ran longer than {seconds:g}s") from None
    except BaseException:
        # Cancelled (run cancelled, engine stopping): the script must not outlive its step.
        _kill(proc)
        raise
    code = proc.returncode
    if code != 0:
        raise StepFailed("script_failed", f"exit code {code}: {_tail(err)[-2000:]}")
    return {"exitCode": code, "stdout": _tail(out).strip(), "stderr": _tail(err)[-4000:]}
