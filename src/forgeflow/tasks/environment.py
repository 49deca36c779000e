"""A task's environment step (issue #26): before the turn, the repository's declared
environment is made ready — its root built (agent/envroot.py) and its setup script,
as Gitea's default branch has it (read from forgeflow's mirror: the clone's copy is the
agent's), run on that root in a jail with an export of that branch and no file of the
agent's (setup_run.py) — and the jails of its turns get that system.

The setup runs again only when its fingerprint changed (the script's content, the
environment, the root, a setup secret); a failed build or setup is not tried again
for the same fingerprint until an operator sets the environment again, and fails the
task with ``environment_setup_failed``, its answer quoting the log's tail. Setup
secrets reach the setup's process environment only: never a turn's jail, and every log
kept of the setup is redacted with them registered.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from forgeflow.agent.envroot import BASE_PACKAGES, RootBuilder, host_suite, tree_size
from forgeflow.agent.jail import HOST_SYSTEM, JailSystem
from forgeflow.agent.oneshot import JailRunner
from forgeflow.agent.port import AgentError
from forgeflow.config import Settings
from forgeflow.domain import environment as env_rules
from forgeflow.domain.egress import EgressPolicy
from forgeflow.domain.environment import (
    FAILED,
    LOG_KEEP,
    READY,
    Environment,
    EnvironmentInvalid,
    RootKey,
)
from forgeflow.domain.ids import RepoRef, repo_key
from forgeflow.domain.json import JsonObject
from forgeflow.redaction import redact_text, register_secrets
from forgeflow.store import Store, audit
from forgeflow.store import environments as q
from forgeflow.tasks.setup_run import Archive, SetupRunner

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = structlog.get_logger("forgeflow.environment")

# The default branch's script, as forgeflow read it from its mirror: (executable, text),
# None when the path is not a regular file there.
ScriptSource = Callable[[str], Awaitable[tuple[bool, str] | None]]


@dataclass(frozen=True, slots=True)
class DefaultBranch:
    """The repository's default branch at the commit the preparation fetched, as
    forgeflow's mirror has it (the clone's copy is the agent's to rewrite)."""

    read: ScriptSource  # one file of it
    archive: Archive  # its whole tree, as a tar written to a file of forgeflow's


@dataclass(frozen=True, slots=True)
class EnvOutcome:
    """The step's result: the system the turn's jail gets, or why there is none."""

    system: JailSystem
    failed: str | None = None  # the log's tail of a failed build or setup
    events: tuple[audit.AuditEvent, ...] = field(default=())


class Environments:
    def __init__(
        self,
        store: Store,
        builder: RootBuilder,
        runner: JailRunner,
        *,
        suite: str,
        forbidden: Sequence[str],
        egress: EgressPolicy | None = None,
    ) -> None:
        """``egress``: the policy of the setup run's egress proxy (the jails' network
        is ``proxy``); None: the setup has the runner's network (``on``) or none."""
        self.store = store
        self.builder = builder
        self.runner = runner
        self.suite = suite
        self.forbidden = tuple(forbidden)
        self.egress = egress
        self.setups = SetupRunner(runner, egress)
        self._current: dict[str, JailSystem] = {}
        self._sweep: asyncio.Task[None] | None = None
        self._sweep_again = False

    @classmethod
    def from_settings(cls, store: Store, s: Settings, forbidden: Sequence[str]) -> Environments:
        """Roots in FORGEFLOW_ENVIRONMENT_ROOTS, setup runs in each repository's jail."""
        builder = RootBuilder(
            s.resolved_environment_roots,
            mmdebstrap=s.mmdebstrap_command,
            timeout=s.environment_build_seconds,
        )
        runner = JailRunner.from_settings(s)
        proxied = s.sandbox == "bwrap" and s.agent_network == "proxy"
        egress = s.egress_policy() if proxied else None
        return cls(store, builder, runner, suite=host_suite(), forbidden=forbidden, egress=egress)

    def key(self, env: Environment) -> RootKey | None:
        return env_rules.root_key(env, self.suite, BASE_PACKAGES)

    async def system(self, owner: str, repo: str) -> JailSystem:
        """The system of the repository's jails now (the app-server asks before it
        starts); never builds: a root not yet ready is an error the task retries."""
        key = repo_key(owner, repo)
        if key in self._current:
            return self._current[key]
        env = await self.store.read(lambda c: q.get(c, key))
        if env is None or env.empty:
            return HOST_SYSTEM
        root = self.key(env)
        if root is not None and not self.builder.ready(root):
            why = f"the root of {key} is not built yet"
            raise AgentError("environment_not_ready", why, retryable=True)
        return self._system(env, root)

    def _system(self, env: Environment, root: RootKey | None) -> JailSystem:
        ident = env_rules.setup_fingerprint(env, root.key if root else None, "", {})
        return JailSystem(
            self.builder.path(root) if root else None,
            tuple(Path(b) for b in env.binds),
            env.variables,
            ident,
        )

    async def prepare(self, repo: RepoRef, task_id: str, branch: DefaultBranch) -> EnvOutcome:
        """Make the repository's environment ready for a turn of ``task_id``; the setup
        runs on ``branch`` (its script and its tree)."""
        key = repo_key(repo.owner, repo.name)
        env = await self.store.read(lambda c: q.get(c, key))
        if env is None or not env.setup_script:
            await self.setups.clear(repo)  # no setup: nothing of an earlier one stays
        if env is None or env.empty:
            self._current.pop(key, None)
            return EnvOutcome(HOST_SYSTEM)
        events: list[audit.AuditEvent] = []
        try:
            self._check_binds(env)
        except EnvironmentInvalid as exc:
            return EnvOutcome(HOST_SYSTEM, str(exc))
        root = self.key(env)
        if root is not None:
            failed = await self._root(root, task_id, key, events)
            if failed is not None:
                return EnvOutcome(HOST_SYSTEM, failed, tuple(events))
        system = self._system(env, root)
        if env.setup_script:
            failed = await self._setup(env, root, system, repo, task_id, events, branch)
            if failed is not None:
                return EnvOutcome(system, failed, tuple(events))
        self._current[key] = system
        if root is not None:  # a new root is ready: those no one names may go now
            self.released()
        return EnvOutcome(system, None, tuple(events))

    def _check_binds(self, env: Environment) -> None:
        """Each bind is there, and its real path (links followed) is not forgeflow's."""
        for i, bind in enumerate(env.binds):
            real = os.path.realpath(bind)
            if not os.path.isdir(real) and not os.path.isfile(real):
                raise EnvironmentInvalid(f"binds[{i}]", f"{bind} does not exist on this host")
            env_rules.check_not_forbidden(f"binds[{i}]", real, self.forbidden)

    async def _root(
        self, root: RootKey, task_id: str, key: str, events: list[audit.AuditEvent]
    ) -> str | None:
        """Build the root unless it is ready; the failure's log, or None."""
        known = await self.store.read(lambda c: q.root(c, root.key))
        if self.builder.ready(root):
            if known is None or known.state != READY:  # built by another forgeflow
                size = await asyncio.to_thread(tree_size, self.builder.path(root))
                await self.store.write(lambda c: q.root_found(c, root, size))
            await self.store.write(lambda c: q.root_used(c, root.key))
            return None
        if known is not None and known.state == FAILED:
            return known.log or "the environment's root failed to build"
        await self.store.write(lambda c: q.root_building(c, root))
        built = await self.builder.ensure(root)
        if built.ok and not built.fresh:  # another task's build of the same list
            await self.store.write(lambda c: q.root_used(c, root.key))
            return None
        text = redact_text(env_rules.printable(built.log))[-LOG_KEEP:]
        state = READY if built.ok else FAILED
        await self.store.write(lambda c: q.root_done(c, root.key, state, text, built.size))
        meta: JsonObject = {"rootKey": root.key, "state": state, "suite": root.suite,
                            "packages": list(root.packages), "sizeBytes": built.size}  # fmt: skip
        events.append(_event(task_id, key, "environment.build", meta))
        log.info("environment.build", root=root.key, state=state)
        return None if built.ok else text

    async def _setup(
        self,
        env: Environment,
        root: RootKey | None,
        system: JailSystem,
        repo: RepoRef,
        task_id: str,
        events: list[audit.AuditEvent],
        branch: DefaultBranch,
    ) -> str | None:
        key = repo_key(repo.owner, repo.name)
        assert env.setup_script is not None
        found = await branch.read(env.setup_script)
        digest = hashlib.sha256(found[1].encode()).hexdigest() if found else "missing"
        secrets = await self.store.read(lambda c: q.secrets(c, key))
        register_secrets(list(secrets.values()))
        fingerprint = env_rules.setup_fingerprint(env, root.key if root else None, digest, secrets)
        last = await self.store.read(lambda c: q.setup(c, key))
        if last is not None and last.fingerprint == fingerprint and last.state != "running":
            return None if last.state == READY else (last.log or "the setup failed")
        rk = root.key if root else None
        await self.store.write(lambda c: q.setup_started(c, key, fingerprint, rk, task_id))
        code: int | None = None
        if found is None:
            text = f"the setup script {env.setup_script} is not a regular file of the "
            text += "repository's default branch"
        else:
            done = await self.setups.run(env, secrets, system, repo, found, branch.archive)
            text, code = done.log, done.code
        state = READY if code == 0 else FAILED
        await self.store.write(lambda c: q.setup_done(c, key, state, text))
        meta: JsonObject = {"state": state, "script": env.setup_script, "exitCode": code}
        events.append(_event(task_id, key, "environment.setup", meta))
        return None if state == READY else text

    # -- old roots -------------------------------------------------------------------

    def released(self) -> None:
        """A jail ended or a new root is ready: remove, in the background, the roots
        that no repository's environment names and no jail uses (one sweep at a time,
        another after it when asked meanwhile)."""
        if self._sweep is not None and not self._sweep.done():
            self._sweep_again = True
            return
        self._sweep = asyncio.get_running_loop().create_task(self._sweeps())

    async def _sweeps(self) -> None:
        while True:
            self._sweep_again = False
            try:
                await self.sweep()
            except Exception as exc:  # the next release tries again
                log.warning("environment.sweep_failed", error=str(exc)[:300])
            if not self._sweep_again:
                return

    async def sweep(self) -> list[str]:
        """Remove each ready root no environment names and no jail holds; its row
        says ``removed``. The keys removed."""
        envs = await self.store.read(q.all_environments)
        named = {k.key for k in (self.key(e) for e in envs) if k is not None}
        rows = await self.store.read(q.all_roots)
        removed = []
        for key in [r.root_key for r in rows if r.state == READY and r.root_key not in named]:
            if await self.builder.remove(key):
                await self.store.write(partial(_removed, key=key))
                log.info("environment.root_removed", root=key)
                removed.append(key)
        await self.builder.delete_leftovers()
        return removed


def _removed(conn: Connection, *, key: str) -> None:
    q.root_removed(conn, key)
    meta: JsonObject = {"rootKey": key}
    audit.append(conn, audit.AuditEvent(action="environment.root_removed", metadata=meta))


def _event(task_id: str, key: str, action: str, meta: JsonObject) -> audit.AuditEvent:
    return audit.AuditEvent(action=action, task_id=task_id, repo_key=key, metadata=meta)
