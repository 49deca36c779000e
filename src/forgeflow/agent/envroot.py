"""The roots of repositories' environments (issue #26): a Debian system built for a
package list by ``mmdebstrap --mode=unshare --variant=apt`` from the host's apt
sources, without Docker and without root.

A root is built once per key (the sorted package list and the suite) into a temporary
folder beside its place and renamed into it when mmdebstrap succeeded, so a folder at a
root's place is always a whole root. Builds of one key wait for each other: an asyncio
lock in this process, an ``flock`` on the key's lock file between processes sharing
the data folder. A new key builds beside the old roots, which turns keep using until
theirs is ready. The build runs with a cleared environment (no variable of
forgeflow's), its output bounded; roots are bound read-only into jails and nothing
inside them is agent-writable.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from forgeflow.agent.port import AgentError
from forgeflow.domain.environment import LOG_KEEP, RootKey

log = structlog.get_logger("forgeflow.environment")

# What forgeflow itself needs in every root: git for the agent's commits, CA
# certificates for TLS, Python for the jail's forwarder to the brokers.
BASE_PACKAGES = ("ca-certificates", "git", "python3")
BUILD_SECONDS = 1800.0
REMOVE_SECONDS = 600.0
_KEY = re.compile(r"^[0-9a-f]{24}$")
_LEFTOVER = re.compile(r"^\.[0-9a-f]{24}\.[0-9a-f]{8}\.removing$")
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Built:
    ok: bool
    path: Path
    log: str  # bounded (its tail)
    size: int | None = None
    fresh: bool = False  # built by this call


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian release (``VERSION_CODENAME``), the default suite."""
    try:
        for line in os_release.read_text().splitlines():
            name, _, value = line.partition("=")
            if name == "VERSION_CODENAME" and value.strip('"'):
                return value.strip('"')
    except OSError:
        pass
    return "stable"


def mmdebstrap_argv(key: RootKey, target: Path, mmdebstrap: str = "mmdebstrap") -> list[str]:
    """The build's command line (no mirror: mmdebstrap takes the host's apt sources)."""
    return [
        shutil.which(mmdebstrap) or mmdebstrap,
        "--mode=unshare",
        "--variant=apt",
        "--include=" + ",".join(key.packages),
        key.suite,
        str(target),
    ]


def build_env() -> dict[str, str]:
    """The build's whole environment: nothing of forgeflow's, no credential."""
    keep = ("PATH", "LANG", "TMPDIR", "http_proxy", "https_proxy", "no_proxy")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return env


class RootBuilder:
    """Builds and finds the roots kept in ``folder`` (forgeflow's data folder)."""

    def __init__(
        self, folder: Path, *, mmdebstrap: str = "mmdebstrap", timeout: float = BUILD_SECONDS
    ) -> None:
        self.folder = folder
        self.mmdebstrap = mmdebstrap
        self.timeout = timeout
        self._locks: dict[str, asyncio.Lock] = {}

    def path(self, key: RootKey | str) -> Path:
        return self.folder / (key if isinstance(key, str) else key.key)

    def ready(self, key: RootKey | str) -> bool:
        return is_root(self.path(key))

    async def remove(self, key: str) -> bool:
        """Remove the root ``key`` unless a jail uses it or it is being built; True when
        it is gone. It is renamed out of its place first (no jail finds it after that),
        under the key's build lock and its use lock held exclusively, then deleted."""
        if not _KEY.match(key):
            raise ValueError(f"{key!r} is not a root's key")
        target = self.path(key)
        doomed = self.folder / f".{key}.{secrets.token_hex(4)}.removing"
        mine = self._locks.setdefault(key, asyncio.Lock())
        if mine.locked():  # being built here: it is wanted again
            return False
        async with mine:
            build = os.open(self.folder / f"{key}.lock", _LOCK_FLAGS, 0o600)
            use = os.open(use_file(target), _LOCK_FLAGS, 0o600)
            try:
                try:  # neither waits: a build or a jail of this key keeps the root
                    fcntl.flock(build, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                try:
                    st = os.lstat(target)
                except FileNotFoundError:
                    return True
                if not stat.S_ISDIR(st.st_mode):  # a link or a file: not a root of ours
                    log.warning("environment.root_not_removed", root=key, why="not a folder")
                    return False
                os.rename(target, doomed)  # the same folder: nothing is followed
            finally:
                os.close(use)  # closing drops the flocks
                os.close(build)
        await self.delete(doomed)
        return True

    async def delete_leftovers(self) -> None:
        """Finish removals a crash or a failed delete left (``.<key>.<hex>.removing``)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.folder):
                if _LEFTOVER.match(entry.name) and entry.is_dir(follow_symlinks=False):
                    await self.delete(Path(entry.path))

    async def delete(self, doomed: Path) -> None:
        """Delete a root renamed out of its place, inside ``folder`` only, never
        following a link. mmdebstrap run by root leaves root's files; run by another
        user its files belong to that user's subordinate ids, which only a process in
        a user namespace mapping them may delete: mmdebstrap's ``--unshare-helper``."""
        if doomed.parent != self.folder or not _LEFTOVER.match(doomed.name):
            raise ValueError(f"{doomed} is not a removal of {self.folder}")
        if os.geteuid() == 0:
            # rmtree works on file descriptors here (avoids_symlink_attacks): a link
            # inside the root is removed, never followed.
            await asyncio.to_thread(shutil.rmtree, doomed, True)
        else:
            helper = [shutil.which(self.mmdebstrap) or self.mmdebstrap, "--unshare-helper"]
            argv = [*helper, "rm", "-rf", "--one-file-system", "--", str(doomed)]
            code, out = await run_bounded(argv, REMOVE_SECONDS)
            if code != 0:
                log.warning("environment.root_delete_failed", path=str(doomed), log=out[-500:])

    async def ensure(self, key: RootKey) -> Built:
        """The root of ``key``, built now unless it is there (one build per key)."""
        async with self._locks.setdefault(key.key, asyncio.Lock()):
            if self.ready(key):
                return Built(True, self.path(key), "")
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock = os.open(self.folder / f"{key.key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                # Another process's build of the same key: wait for it (in a thread,
                # the event loop goes on), then use what it made.
                await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
                if self.ready(key):
                    return Built(True, self.path(key), "")
                return await self._build(key)
            finally:
                os.close(lock)  # closing drops the flock

    async def _build(self, key: RootKey) -> Built:
        target = self.path(key)
        tmp = self.folder / f".{key.key}.{secrets.token_hex(4)}.tmp"
        code, log = await run_bounded(mmdebstrap_argv(key, tmp, self.mmdebstrap), self.timeout)
        if code != 0 or not (tmp / "usr").is_dir():
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            why = "timed out" if code is None else f"exit status {code}"
            return Built(False, target, f"{log}\nmmdebstrap failed ({why})")
        os.chmod(tmp, 0o755)  # noqa: S103 - a system root: readable, written by no one
        os.rename(tmp, target)  # atomic: the place holds a whole root or nothing
        return Built(True, target, log, await asyncio.to_thread(tree_size, target), True)


def is_root(path: Path) -> bool:
    """A whole root at ``path`` (a real folder, not a link, with its ``usr``)."""
    return not path.is_symlink() and (path / "usr").is_dir()


def use_file(root: Path) -> Path:
    """The lock file whose shared flock a jail of ``root`` holds while it runs."""
    return root.parent / f"{root.name}.use"


class RootUse:
    """A jail's use of a root, from before it starts until it ended: a shared flock on
    the root's use file (dropped with the process, should it die), which a removal
    must take exclusively, in this process or another one sharing the folder."""

    def __init__(self, root: Path) -> None:
        self._fd: int | None = os.open(use_file(root), _LOCK_FLAGS, 0o600)
        try:
            # A removal holds it exclusively only while it renames the root away.
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            if not is_root(root):
                why = f"the environment's root {root.name} was removed; it is built again"
                raise AgentError("environment_not_ready", why, retryable=True)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def tree_size(path: Path) -> int:
    """Bytes of the files below ``path`` (``lstat``: links are not followed)."""
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


async def run_bounded(argv: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """Run ``argv`` on the host with :func:`build_env`; its exit status (None: ended at
    ``timeout``) and the tail of its merged output (LOG_KEEP bytes)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=build_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    kept = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            kept.extend(chunk)
            del kept[:-LOG_KEEP]

    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return None, kept.decode(errors="replace")
    return proc.returncode, kept.decode(errors="replace")


class RootsUnavailable(Exception):
    """mmdebstrap cannot build a root here; the message names the fix."""


def probe_tools(mmdebstrap: str = "mmdebstrap") -> str:
    """What unshare mode needs, checked without building: mmdebstrap itself and, for
    a user other than root, newuidmap and subordinate ids. Its path, or raises."""
    found = shutil.which(mmdebstrap)
    if found is None:
        raise RootsUnavailable(
            f"{mmdebstrap} is not installed: apt-get install mmdebstrap uidmap "
            "(scripts/setup.sh installs them), or set FORGEFLOW_MMDEBSTRAP_COMMAND"
        )
    if os.geteuid() != 0:
        if shutil.which("newuidmap") is None:
            raise RootsUnavailable("newuidmap is missing: apt-get install uidmap")
        user = _user_name()
        for table in ("/etc/subuid", "/etc/subgid"):
            if not _has_range(Path(table), user):
                raise RootsUnavailable(
                    f"{user} has no subordinate ids in {table}: "
                    f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}"
                )
    return found


async def probe_build(suite: str, scratch: Path, mmdebstrap: str = "mmdebstrap") -> None:
    """A simulated build (apt resolves, nothing is installed) in unshare mode, from
    the host's apt sources: what a real build needs of this host, in seconds."""
    found = probe_tools(mmdebstrap)
    target = scratch / f".probe-{secrets.token_hex(4)}"
    argv = [found, "--mode=unshare", "--variant=apt", "--simulate", suite, str(target)]
    try:
        code, out = await run_bounded(argv, 300.0)
    finally:
        await asyncio.to_thread(shutil.rmtree, target, True)
    if code == 0:
        return
    last = (out.strip().splitlines() or ["no output"])[-1]
    fix = "check the host's apt sources (/etc/apt/sources.list.d) and their reachability"
    if "unshare" in out.lower() or "namespace" in out.lower() or "newuidmap" in out.lower():
        fix = (
            "unprivileged user namespaces are off: sysctl kernel.unprivileged_userns_clone=1 "
            "and user.max_user_namespaces > 0"
        )
    raise RootsUnavailable(f"mmdebstrap cannot build here ({last[:300]}): {fix}")


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _has_range(table: Path, user: str) -> bool:
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":", 1)[0] in (user, str(os.geteuid())) for line in lines)
