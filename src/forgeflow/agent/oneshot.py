"""One command in a repository's jail, to its end: what forgeflow runs on the agent's
files (git on the clone and the worktrees, a pipeline's script).

The jail is the app-server's (jail.py): the same system binds, the repository's clone,
sessions folder and home at their host paths, a private ``/tmp``, the same fixed
environment, no capabilities, its own user namespace without the right to make more.
forgeflow's host side never runs a program on an agent-writable path; it runs this.

What comes back is untrusted: stdout and stderr are bounded (``output_limit`` bytes
each; past it the command is ended and ``truncated`` set), and callers parse them as
data (shas with ``check_sha``, refs with ``check_ref``, never a path to act on).
``stdin`` is bytes or a forgeflow-owned host file opened here (a bundle): the jail
reads it from its standard input, so no shared folder and no path crosses.

With ``FORGEFLOW_SANDBOX=none`` (one trusted user) the same command runs unjailed, in
the same cleared environment with host paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from forgeflow.agent import jail
from forgeflow.agent.appserver import proxied
from forgeflow.agent.envroot import RootUse
from forgeflow.domain.ids import RepoRef
from forgeflow.domain.paths import agent_home, repo_sessions, repo_workspace

Spawned = Callable[[list[str], Mapping[str, str], str | None], None]


@dataclass(frozen=True, slots=True)
class JailResult:
    returncode: int  # -9 and friends when it was ended
    stdout: bytes
    stderr: bytes
    truncated: bool  # an output passed output_limit: the command was ended
    timed_out: bool  # the time limit passed: the command was ended


@dataclass(frozen=True, slots=True)
class JailPaths:
    """Where one repository's jail lives on the host (all forgeflow-made folders)."""

    clone: Path
    sessions: Path
    home: Path

    @classmethod
    def of(cls, root: Path, repo: RepoRef, *, read_only: bool = False) -> JailPaths:
        r = str(root)
        return cls(
            Path(repo_workspace(r, repo)),
            Path(repo_sessions(r, repo)),
            Path(agent_home(r, repo, read_only=read_only)),
        )

    def make(self, root: Path) -> None:
        """Create the three top-level folders below ``root`` (bwrap binds only what
        exists), with no symlink anywhere on the way (jail.make_tree)."""
        for path in (self.clone, self.sessions, self.home):
            jail.make_tree(root, path)


@dataclass(frozen=True, slots=True)
class Trees:
    """What a jail that is not the repository's own writes: its home and its
    read-write trees (bound at their host paths), all forgeflow-made folders."""

    home: Path
    writable: tuple[Path, ...]


class JailRunner:
    """Runs one command in a repository's jail (or unjailed with sandbox ``none``)."""

    def __init__(
        self,
        workspace_root: Path,
        *,
        jailed: bool = True,
        network: bool = False,
        bwrap: str = "bwrap",
        on_spawn: Spawned | None = None,
    ) -> None:
        self.root = Path(os.path.realpath(workspace_root))
        self.jailed = jailed
        self.network = network  # the default of run(); git steps pass network=False
        self.bwrap = bwrap
        # Told about every process started here (argv, environment, cwd): a test seam.
        self.on_spawn = on_spawn

    @classmethod
    def from_settings(cls, settings: Any, *, on_spawn: Spawned | None = None) -> JailRunner:
        return cls(
            settings.resolved_workspace_root,
            jailed=settings.sandbox == "bwrap",
            network=settings.agent_network == "on",
            on_spawn=on_spawn,
        )

    def paths(self, repo: RepoRef, *, read_only: bool = False) -> JailPaths:
        return JailPaths.of(self.root, repo, read_only=read_only)

    def command(
        self,
        argv: Sequence[str],
        *,
        repository: RepoRef,
        cwd: str,
        read_only: bool = False,
        network: bool | None = None,
        extra_ro_binds: Sequence[tuple[Path, str]] = (),
        env: Mapping[str, str] | None = None,
        system: jail.JailSystem = jail.HOST_SYSTEM,
        egress: Path | None = None,
        own: Trees | None = None,
        extra_rw_binds: Sequence[tuple[Path, str]] = (),
    ) -> tuple[list[str], dict[str, str], str | None]:
        """(argv, environment, host cwd) of the process to start; ``egress``: the
        socket of an egress proxy, the jail's only network (no other network then);
        ``own``: a home and trees of the caller's instead of the repository's clone,
        sessions and home (a setup run: none of the agent's files in it)."""
        if own is None:
            paths = self.paths(repository)  # the home of the repository's own jail
            paths.make(self.root)
            own = Trees(paths.home, (paths.clone, paths.sessions))
        extra = dict(env or {})
        if not self.jailed:
            environ = jail.base_env(
                {
                    **dict(system.variables),
                    **extra,
                    "PATH": os.environ.get("PATH", jail.JAIL_PATH),
                    "HOME": str(own.home),
                    "CODEX_HOME": str(own.home / ".codex"),
                }
            )
            return list(argv), environ, cwd
        trees = own.writable
        placed = tuple(("--ro-bind", str(src), dst) for src, dst in extra_ro_binds)
        for src, _ in extra_rw_binds:
            jail.check_top_level(src)
        placed += tuple(("--bind", str(src), dst) for src, dst in extra_rw_binds)
        readable: tuple[Path, ...] = trees if read_only else ()
        command = list(argv)
        if egress is not None:
            (command, more, python), proxy = proxied(system, command, egress)
            placed, readable, network = placed + more, readable + python, False
            extra.update(proxy)
        spec = jail.JailSpec(
            own.home,
            () if read_only else trees,
            readable,
            network=self.network if network is None else network,
            env=extra,
            placed=placed,
            chdir=cwd,
            system=system,
        )
        jail.check_spec(spec)
        return jail.bwrap_argv(spec, command, bwrap=self.bwrap), jail.jail_env(spec), None

    async def run(
        self,
        argv: Sequence[str],
        *,
        repository: RepoRef,
        cwd: str,
        stdin: bytes | Path | None = None,
        timeout: float,
        output_limit: int,
        read_only: bool = False,
        network: bool | None = None,
        extra_ro_binds: Sequence[tuple[Path, str]] = (),
        env: Mapping[str, str] | None = None,
        system: jail.JailSystem = jail.HOST_SYSTEM,
        egress: Path | None = None,
        own: Trees | None = None,
        extra_rw_binds: Sequence[tuple[Path, str]] = (),
    ) -> JailResult:
        """Run ``argv`` with ``cwd`` (a path as the jail sees it: the host path of a
        folder in the clone or sessions, or /home/agent); see the module docstring."""
        full, environ, host_cwd = self.command(
            argv,
            repository=repository,
            cwd=cwd,
            read_only=read_only,
            network=network,
            extra_ro_binds=extra_ro_binds,
            env=env,
            system=system,
            egress=egress if self.jailed else None,
            own=own,
            extra_rw_binds=extra_rw_binds,
        )
        # An environment's root is held while the jail runs: not removed under it.
        use = RootUse(system.root) if self.jailed and system.root is not None else None
        try:
            return await self._exec(full, environ, host_cwd, stdin, timeout, output_limit)
        finally:
            if use is not None:
                use.release()

    async def run_scratch(
        self,
        argv: Sequence[str],
        *,
        scratch: Path,
        timeout: float,
        output_limit: int,
        env: Mapping[str, str] | None = None,
    ) -> JailResult:
        """Run ``argv`` in a jail holding no repository (a pipeline script of a run
        without one): ``scratch``, a forgeflow-made folder outside every repository, is
        all it can write, bound at its host path (where it starts) and as its home."""
        scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        jail.check_top_level(scratch)
        extra = dict(env or {})
        if not self.jailed:
            host = {"PATH": os.environ.get("PATH", jail.JAIL_PATH), "HOME": str(scratch)}
            environ = jail.base_env({**extra, **host})
            return await self._exec(list(argv), environ, str(scratch), None, timeout, output_limit)
        spec = jail.JailSpec(
            scratch, (scratch,), network=self.network, env=extra, chdir=str(scratch)
        )
        jail.check_spec(spec)
        full = jail.bwrap_argv(spec, argv, bwrap=self.bwrap)
        return await self._exec(full, jail.jail_env(spec), None, None, timeout, output_limit)

    async def _exec(
        self,
        full: list[str],
        environ: dict[str, str],
        host_cwd: str | None,
        stdin: bytes | Path | None,
        timeout: float,
        output_limit: int,
    ) -> JailResult:
        source: IO[bytes] | None = stdin.open("rb") if isinstance(stdin, Path) else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                cwd=host_cwd,
                env=environ,
                stdin=source if source is not None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own group: the time limit ends bwrap, and --die-with-parent and
                # the PID namespace end everything inside.
                start_new_session=True,
            )
        finally:
            if source is not None:
                source.close()
        if self.on_spawn is not None:
            self.on_spawn(list(full), environ, host_cwd)
        return await _collect(
            proc, stdin if isinstance(stdin, bytes) else b"", timeout, output_limit
        )


async def _collect(
    proc: asyncio.subprocess.Process, data: bytes, timeout: float, limit: int
) -> JailResult:
    over = asyncio.Event()

    async def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if data:
                proc.stdin.write(data)
                await proc.stdin.drain()
        proc.stdin.close()

    async def read(stream: asyncio.StreamReader | None) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while stream is not None:
            chunk = await stream.read(65536)
            if not chunk:
                break
            if size + len(chunk) > limit:
                # Past the bound: the command is ended (the stopper below), and what it
                # still wrote is read to the end and dropped, so the pipe closes here.
                chunks.append(chunk[: max(0, limit - size)])
                over.set()
            elif not over.is_set():
                chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    work: asyncio.Future[Any] = asyncio.gather(
        feed(), read(proc.stdout), read(proc.stderr), proc.wait()
    )
    stopper: asyncio.Future[Any] = asyncio.ensure_future(over.wait())
    timed_out = False
    try:
        done, _ = await asyncio.wait(
            {work, stopper}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
        if work not in done:
            timed_out = not over.is_set()
            _kill(proc)
        _, out, err, _ = await work
    except BaseException:
        _kill(proc)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    finally:
        stopper.cancel()
    code = proc.returncode if proc.returncode is not None else -1
    return JailResult(code, out, err, over.is_set(), timed_out)


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
