"""A repository's setup run (issue #26), in a jail that holds nothing of the agent's.

The agent owns its clone (the worktree, ``.git/config`` and hooks) and its home (the
dotfiles that npm, pip, git and the shells read). A setup run there would run the
agent's choices with the setup secrets, and could leave them where the next turn reads
them. So the setup's jail binds neither; it gets

- a fresh export of the default branch at the commit forgeflow's mirror has: the host
  side writes a tar of that tree with ``git archive`` into a private file of its own,
  and a one-shot jail (no network, no secret) empties the export folder and unpacks the
  tar there. The host never writes repository content, nor walks or removes what an
  earlier run left (links, unreadable folders): the emptying is the jail's, done again
  after the run. The export is a plain tree: no ``.git``;
- a home of its own (``setup_home``), kept between setup runs for package caches,
  which no turn's jail binds;
- the repository's environment folder (``environment_dir``) read-write at
  ``jail.ENV_DIR``, named by ``$FORGEFLOW_ENV_DIR``: what the setup leaves for the
  turns, which get it read-only at the same path. It is emptied (in the same jail as
  the export) before each run, and when the environment has no setup script any more,
  so it holds what the last run of the current script left, nothing older.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog

from forgeflow.agent import jail
from forgeflow.agent.jail import ENV_DIR, ENV_DIR_VAR, JailSystem
from forgeflow.agent.oneshot import JailResult, JailRunner, Trees
from forgeflow.agent.proxy import Blocks, EgressProxy
from forgeflow.domain import environment as env_rules
from forgeflow.domain.egress import EgressPolicy
from forgeflow.domain.environment import LOG_KEEP, Environment
from forgeflow.domain.ids import RepoRef
from forgeflow.domain.paths import environment_dir, setup_export, setup_home
from forgeflow.redaction import redact_text
from forgeflow.workspace.git import WorkspaceError

log = structlog.get_logger("forgeflow.environment")

# Writes a tar of the default branch's tree to the given host file (forgeflow's own).
Archive = Callable[[Path], Awaitable[None]]
# Where the jail finds forgeflow's copy of the script (the jail's own root, not a bind).
SETUP_DIR = "/opt/forgeflow/setup"
# $0 the copy, $1 "exec" when the repository has it executable (its #! line), else sh.
_RUN_SETUP = 'exec 2>&1; if [ "$1" = exec ]; then exec "$0"; else exec /bin/sh "$0"; fi'
# In a jail of the setup's folders: each folder named is emptied of what the last run
# left (a folder it made unreadable is made removable first), then, with $1 "unpack",
# the tar on stdin is unpacked into the cwd (the export).
_REFILL = (
    'set -e; exec 2>&1; mode=$1; shift; for d in "$@"; do '
    'chmod -R u+rwX "$d" 2>/dev/null || true; find "$d" -mindepth 1 -delete; done; '
    'if [ "$mode" = unpack ]; then tar -x -f -; fi'
)


@dataclass(frozen=True, slots=True)
class SetupFolders:
    """A repository's setup folders on the host (forgeflow-made, below the workspace
    root; only ``env`` is ever bound into a turn, and read-only)."""

    home: Path
    export: Path
    env: Path

    @classmethod
    def of(cls, root: Path, repo: RepoRef) -> SetupFolders:
        r = str(root)
        return cls(
            Path(setup_home(r, repo)), Path(setup_export(r, repo)), Path(environment_dir(r, repo))
        )

    def make(self, root: Path) -> None:
        for path in (self.home, self.export, self.env):
            jail.make_tree(root, path)


@dataclass(frozen=True, slots=True)
class SetupDone:
    code: int | None  # None: it did not run to an exit status (timed out, not exported)
    log: str  # redacted, printable, its last LOG_KEEP characters


class SetupRunner:
    """Runs a repository's setup script (its text as the default branch has it)."""

    def __init__(self, runner: JailRunner, egress: EgressPolicy | None) -> None:
        self.runner = runner
        self.egress = egress

    def folders(self, repo: RepoRef) -> SetupFolders:
        return SetupFolders.of(self.runner.root, repo)

    async def run(
        self,
        env: Environment,
        secrets: dict[str, str],
        system: JailSystem,
        repo: RepoRef,
        script: tuple[bool, str],
        archive: Archive,
    ) -> SetupDone:
        assert env.setup_script is not None
        folders = self.folders(repo)
        folders.make(self.runner.root)
        limit = env.setup_timeout_seconds
        with tempfile.TemporaryDirectory(prefix="forgeflow-setup-") as private:
            tar = Path(private) / "tree.tar"
            try:
                await archive(tar)
            except WorkspaceError as exc:
                why = f"forgeflow could not export the default branch: {exc}"
                return SetupDone(None, _text(why))
            # The environment folder too: it holds what this run leaves, nothing older.
            unpacked = await self._refill(repo, folders, tar, limit, env_too=True)
            tar.unlink()
            if unpacked.returncode != 0 or unpacked.timed_out:
                why = "forgeflow could not unpack the default branch for the setup:\n"
                return SetupDone(None, _text(why + _output(unpacked)))
            try:
                done, blocks = await self._script(env, secrets, system, repo, script, private)
            finally:
                cleared = await self._refill(repo, folders, None, limit)
                if cleared.returncode != 0:
                    log.warning("environment.export_not_cleared", repo=f"{repo.owner}/{repo.name}")
        return SetupDone(
            None if done.timed_out else done.returncode, _setup_log(done, limit, blocks)
        )

    async def clear(self, repo: RepoRef) -> None:
        """Without a setup script the environment folder is empty: what an earlier
        setup left there is removed (in a jail), once."""
        folders = self.folders(repo)
        try:
            with os.scandir(folders.env) as entries:  # a listing: nothing is followed
                if next(entries, None) is None:
                    return
        except FileNotFoundError:
            return
        folders.make(self.runner.root)
        done = await self._refill(repo, folders, None, 300, env_too=True, export_too=False)
        if done.returncode != 0:
            log.warning("environment.folder_not_cleared", repo=f"{repo.owner}/{repo.name}")

    async def _refill(
        self,
        repo: RepoRef,
        folders: SetupFolders,
        tar: Path | None,
        limit: int,
        *,
        env_too: bool = False,
        export_too: bool = True,
    ) -> JailResult:
        """Empty the export and, ``env_too``, the environment folder (in a jail: what
        is there is the setup's), then unpack ``tar`` into the export; no network, no
        secret, on the host's system."""
        jailed = self.runner.jailed
        where = [str(folders.export)] if export_too else []
        if env_too:
            where.append(ENV_DIR if jailed else str(folders.env))
        mode = "unpack" if tar is not None else "clear"
        return await self.runner.run(
            ["/bin/sh", "-c", _REFILL, "refill", mode, *where],
            repository=repo,
            cwd=str(folders.export),
            stdin=tar,
            timeout=float(limit),
            output_limit=LOG_KEEP,
            network=False,
            own=Trees(folders.home, (folders.export,)),
            extra_rw_binds=[(folders.env, ENV_DIR)] if env_too else [],
        )

    async def _script(
        self,
        env: Environment,
        secrets: dict[str, str],
        system: JailSystem,
        repo: RepoRef,
        script: tuple[bool, str],
        private: str,
    ) -> tuple[JailResult, Blocks]:
        """Run forgeflow's copy of the script, bound read-only from ``private``, in the
        export, with the setup's home and the environment folder."""
        assert env.setup_script is not None
        folders = self.folders(repo)
        blocks = Blocks()
        copy = Path(private) / "setup"
        copy.write_text(script[1])
        copy.chmod(0o500)
        inside = f"{SETUP_DIR}/{PurePosixPath(env.setup_script).name}"
        jailed = self.runner.jailed
        where = inside if jailed else str(copy)
        own = {ENV_DIR_VAR: ENV_DIR if jailed else str(folders.env)}
        async with self._proxy(f"{repo.owner}/{repo.name}", blocks, Path(private)) as egress:
            done = await self.runner.run(
                ["/bin/sh", "-c", _RUN_SETUP, where, "exec" if script[0] else "sh"],
                repository=repo,
                cwd=str(folders.export),
                timeout=float(env.setup_timeout_seconds),
                output_limit=LOG_KEEP,
                extra_ro_binds=[(copy, inside)],
                extra_rw_binds=[(folders.env, ENV_DIR)],
                env={**dict(env.variables), **secrets, **own},
                system=system,
                egress=egress,
                own=Trees(folders.home, (folders.export,)),
            )
        return done, blocks

    @contextlib.asynccontextmanager
    async def _proxy(
        self, repo_name: str, blocks: Blocks, folder: Path
    ) -> AsyncIterator[Path | None]:
        """The setup run's own egress proxy (as a turn's jail has one), on a socket in
        the run's short private folder (a Unix socket's path is limited to 107 bytes);
        None without the ``proxy`` network."""
        if self.egress is None:
            yield None
            return
        proxy = EgressProxy(
            self.egress.for_repository(repo_name), folder / "egress.sock", blocks.add
        )
        try:
            await proxy.start()
            yield proxy.unix_socket
        finally:
            await proxy.aclose()


def _output(done: JailResult) -> str:
    return (done.stdout + done.stderr).decode(errors="replace")


def _text(text: str) -> str:
    return redact_text(env_rules.printable(text))[-LOG_KEEP:]


def _setup_log(done: JailResult, limit: int, blocks: Blocks) -> str:
    text = _output(done)
    for (host, port), count in blocks.counts.items():
        why = blocks.reasons[(host, port)]
        text += f"\nforgeflow: the network policy refused {host}:{port} x{count} ({why})"
    if done.timed_out:
        text += f"\nthe setup did not end within {limit} seconds"
    elif done.returncode != 0:
        text += f"\nthe setup ended with exit status {done.returncode}"
    return _text(text)
