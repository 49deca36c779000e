"""One command, once, inside a repository's jail: pipeline script steps and the git
forgeflow runs on a clone the agent can write (the clean check and bookkeeping of a
removed session worktree).

It is the agent's jail (``agent.jail``) around a different command: the same allow-list
of binds, the same network setting, the environment cleared and rebuilt from the fixed
list plus the caller's values. Its home is a fresh empty folder of its own (never the
agent's home, which holds Codex's config and its capability), removed afterwards with
``shutil.rmtree``, which on Linux removes a tree through directory descriptors and
never follows a symlink planted in it. The command runs in its own process group; at
its time limit (or when the caller is cancelled) bubblewrap is killed, and with it,
``--die-with-parent``, the jail's PID namespace and everything in it. Its output is
read with a bound: only the last ``limit`` bytes of each stream are kept.

With ``FORGEFLOW_SANDBOX=none`` (a single trusted user, loudly documented) the command
runs on the host with the same fixed environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from forgeflow.agent import jail
from forgeflow.config import Settings

# Where a command starts: bwrap_argv always starts in the jail's home, so coreutils'
# env changes folder first (no shell in between, so no quoting to get wrong).
_ENV = "/usr/bin/env"


class JailTimeout(Exception):
    """The command ran longer than its time limit; it was killed."""


@dataclass(frozen=True, slots=True)
class JailResult:
    code: int
    stdout: bytes  # the last ``limit`` bytes
    stderr: bytes


@dataclass(frozen=True, slots=True)
class JailRunner:
    """How one-shot jails are made here (from forgeflow's settings)."""

    homes: Path  # a forgeflow-owned folder, outside every bind, for the fresh homes
    jailed: bool = True
    network: bool = True
    bwrap: str = "bwrap"

    async def run(
        self,
        command: Sequence[str],
        *,
        cwd: Path,
        writable: tuple[Path, ...] = (),
        readable: tuple[Path, ...] = (),
        protected: tuple[Path, ...] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        limit: int = 64 * 1024,
    ) -> JailResult:
        self.homes.mkdir(parents=True, exist_ok=True, mode=0o700)
        home = Path(tempfile.mkdtemp(prefix="jail-", dir=self.homes))
        try:
            argv, host_env = self._argv(command, home, cwd, writable, readable, protected, env)
            # bwrap itself starts in "/", never in a folder the agent can write.
            return await _run(argv, host_env, cwd if not self.jailed else Path("/"), timeout, limit)
        finally:
            # Symlink-safe here (fd-based); refuse to run where it would not be.
            assert shutil.rmtree.avoids_symlink_attacks
            shutil.rmtree(home, ignore_errors=True)

    def _argv(
        self,
        command: Sequence[str],
        home: Path,
        cwd: Path,
        writable: tuple[Path, ...],
        readable: tuple[Path, ...],
        protected: tuple[Path, ...],
        env: Mapping[str, str] | None,
    ) -> tuple[list[str], dict[str, str]]:
        extra = dict(env or {})
        if not self.jailed:
            host = {"PATH": os.environ.get("PATH", jail.JAIL_PATH), "HOME": str(home)}
            return list(command), jail.base_env({**extra, **host})
        spec = jail.JailSpec(
            home,
            writable,
            readable,
            network=self.network,
            env=extra,
            protected=tuple(p for p in protected if p.exists()),
        )
        inner = [_ENV, "-C", str(cwd), *command]
        # bwrap itself gets nothing of forgeflow's environment either.
        return jail.bwrap_argv(spec, inner, bwrap=self.bwrap), {"PATH": jail.JAIL_PATH}


async def _run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float, limit: int
) -> JailResult:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            out, err, _ = await asyncio.gather(
                _tail(proc.stdout, limit), _tail(proc.stderr, limit), proc.wait()
            )
    except TimeoutError:
        _kill(proc)
        # The jail is gone with bwrap, so its pipes end: read them out to close them.
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(proc.communicate(), 10)
        raise JailTimeout(f"ran longer than {timeout:g}s") from None
    except BaseException:
        _kill(proc)  # cancelled: the command must not outlive its caller
        raise
    return JailResult(proc.returncode or 0, out, err)


async def _tail(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The last ``limit`` bytes of a stream, read to its end in bounded chunks."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > limit:
            del kept[:-limit]
    return bytes(kept)


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def runner_from_settings(settings: Settings) -> JailRunner:
    """The agent's jail settings (sandbox, network); homes in forgeflow's data folder."""
    return JailRunner(
        homes=Path(settings.data_dir) / "run" / "jail-homes",
        jailed=settings.sandbox == "bwrap",
        network=settings.agent_network == "on",
    )
