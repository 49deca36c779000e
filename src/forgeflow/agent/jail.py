"""The jail a repository's ``codex app-server`` runs in (bubblewrap).

The agent runs commands a model chose after reading untrusted text, so the jail is
built as an allow-list: bwrap starts from an empty root and we bind in only

- the system, read-only: ``/usr`` (with the merged-``/usr`` links), a list of ``/etc``
  entries that programs need (no ``shadow``, no ``ssl/private``, no service configs);
- the Codex installation that ``FORGEFLOW_CODEX_COMMAND`` names and its interpreter,
  read-only, wherever they live (a CI checkout may sit under ``/tmp``);
- the repository's clone and its session worktrees, read-write, at their host paths
  (a git worktree names its clone by absolute path and back): each a top-level folder
  forgeflow made, in a folder of forgeflow's that is not bound, checked with ``lstat``
  to be a real directory just before the jail starts. Nothing inside an agent-writable
  tree is ever a bind source or destination;
- a private home that persists between app-servers (package caches, Codex's rollouts
  for ``thread/resume``) and a private ``/tmp``;
- the repository's environment folder, read-only at ``ENV_DIR``: what its setup left
  for the turns (tasks/setup_run.py);
- a fresh ``/proc`` of its own PID namespace and a minimal ``/dev``.

The environment is rebuilt from a fixed list: no variable of forgeflow's and no
credential. It is handed to bwrap as its process environment (bwrap passes it on), not
as ``--setenv`` arguments, so what the jail is given (its capability) is not in the
host's process list. The jail gets a user namespace of its own and may not make more
(``--unshare-user --disable-userns``). Hand-written argv: no Python library drives
bubblewrap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

JAIL_HOME = "/home/agent"
# Resource limits of every process in a jail (threads count as processes; a build with
# many jobs stays far below this). Memory: writable private memory per process.
JAIL_MAX_PROCESSES = 4096
JAIL_MAX_DATA_BYTES = 8 * 1024**3
JAIL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What programs in the jail may read of /etc. Everything else there (shadow files,
# private keys, service configurations such as a forgeflow unit's environment file)
# stays outside.
ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "gitconfig",
    "group",
    "host.conf",
    "hostname",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pip.conf",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "resolv.conf",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
    "xdg",
)
# The merged-/usr links of a Debian-like system.
_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class JailUnavailable(Exception):
    """bubblewrap cannot run here; the message names the fix."""

    code = "sandbox_unavailable"


# Of /etc, what stays the host's even in an environment's root: how to reach the network.
_HOST_ETC = frozenset({"resolv.conf", "hosts", "hostname"})
# Where forgeflow places host programs a root lacks (the Codex binary's folder is bound
# at its host path; this is for the few single files).
SYSTEM_BIN = "/opt/forgeflow/bin"
# A repository's environment folder (issue #26), at the same path in its setup (which
# writes it) and its turns (which read it), so what a setup makes there (a virtualenv,
# an installed toolchain) finds itself at the path it was made for.
ENV_DIR = "/opt/forgeflow/env"
ENV_DIR_VAR = "FORGEFLOW_ENV_DIR"


@dataclass(frozen=True, slots=True)
class JailSystem:
    """A repository's environment as its jail gets it (issue #26): a root built for its
    package list (None: the host's system), read-only binds of host toolchains, and its
    variables. ``key`` tells one system from another (an app-server on an older one is
    restarted once idle)."""

    root: Path | None = None
    binds: tuple[Path, ...] = ()
    variables: tuple[tuple[str, str], ...] = ()
    key: str = "host"


HOST_SYSTEM = JailSystem()


class Systems(Protocol):
    """The repositories' environments as the app-servers see them."""

    async def system(self, owner: str, repo: str) -> JailSystem:
        """The repository's system, asked before its app-server starts."""

    def released(self) -> None:
        """An app-server ended: a root it held may be removed now."""


@dataclass(frozen=True, slots=True)
class JailSpec:
    """What one repository's jail is made of (host paths)."""

    home: Path  # the private home, bound at JAIL_HOME
    writable: tuple[Path, ...]  # the clone and the sessions folder, at their host paths
    readable: tuple[Path, ...] = ()  # the Codex installation and its interpreter
    network: bool = True
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the fixed list
    # (bwrap option, host path, jail path): forgeflow-owned files and folders placed at
    # paths of the jail's own root (/run/forgeflow, /opt/forgeflow), never inside a bind
    placed: tuple[tuple[str, str, str], ...] = ()
    chdir: str = JAIL_HOME
    system: JailSystem = HOST_SYSTEM


class JailRefused(Exception):
    """A path the jail would bind is not the real directory forgeflow made."""

    code = "workspace_dirty"

    def __init__(self, message: str, reason: str = "not_a_directory") -> None:
        super().__init__(message)
        self.reason = reason


def make_tree(root: Path, path: Path) -> None:
    """Create ``path`` below ``root`` (0700), each folder on the way made or checked
    with ``lstat``: a symlink anywhere between them is refused, never followed."""
    rel = path.relative_to(root)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)  # the operator's, not the agent's
    current = root
    for depth, part in enumerate(("", *rel.parts)):
        current = current / part if part else current
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o700)
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):
            raise JailRefused(f"{current} is not a directory of forgeflow's", "outside_root")
        if depth < len(rel.parts) and st.st_mode & 0o077:
            # forgeflow's folders above an agent tree are its own alone: whatever the
            # agent leaves in its tree (a setuid copy of a shell, made as the jail's
            # uid) cannot be reached, let alone run, by another local user.
            os.chmod(current, 0o700)


def check_top_level(path: Path) -> None:
    """``path`` must be a real directory, not a symlink (``lstat``: nothing followed).
    Its parent is forgeflow's and not bound, so the agent cannot swap it afterwards."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise JailRefused(f"{path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise JailRefused(f"{path} is not a directory (a symlink or a file was put there)")


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The jail's whole environment: a fixed list plus what the caller adds."""
    env = {
        "PATH": JAIL_PATH,
        "HOME": JAIL_HOME,
        "USER": "agent",
        "LOGNAME": "agent",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",  # noqa: S108 - the jail's own private /tmp
        "CODEX_HOME": f"{JAIL_HOME}/.codex",
    }
    env.update(extra)
    return env


def bwrap_argv(spec: JailSpec, command: Sequence[str], *, bwrap: str = "bwrap") -> list[str]:
    """The full command line that runs ``command`` inside the jail."""
    argv = [
        # Found on forgeflow's PATH, not the jail's (the process gets the jail's env).
        shutil.which(bwrap) or bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        # Codex runs with the jail as its sandbox (externalSandbox) and needs no
        # namespaces of its own; denying them shrinks the kernel surface an escape uses.
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
        "--hostname",
        "forgeflow-agent",
    ]
    if not spec.network:
        argv.append("--unshare-net")
    argv += system_binds(spec.system.root or Path("/"))
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home"]  # noqa: S108
    for path in spec.system.binds:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--bind", str(spec.home), JAIL_HOME]
    for path in spec.readable:
        argv += ["--ro-bind", str(path), str(path)]
    for path in spec.writable:
        argv += ["--bind", str(path), str(path)]
    for option, host_path, jail_path in spec.placed:
        argv += [option, host_path, jail_path]
    # The root itself (bwrap's tmpfs holding the mount points) is read-only too: writes
    # land only in the binds above and the tmpfs /tmp and /home.
    argv += ["--remount-ro", "/"]
    argv += ["--chdir", spec.chdir, "--", *limited(command)]
    return argv


def system_binds(root: Path) -> list[str]:
    """``/usr``, its merged links and the allowed ``/etc`` entries of ``root`` (``/``:
    the host's; else an environment's root, whose links stay links inside the jail and
    whose network files are the host's)."""
    argv = ["--ro-bind", str(root / "usr"), "/usr"]
    for name in _USR_LINKS:
        link = root / name
        if link.is_symlink():
            argv += ["--symlink", os.readlink(link), f"/{name}"]
        elif link.is_dir():
            argv += ["--ro-bind", str(link), f"/{name}"]
    for entry in ETC_ENTRIES:
        own = root if entry not in _HOST_ETC else Path("/")
        path = own / "etc" / entry
        if own != Path("/") and path.is_symlink():
            # Inside a root a link means the root's own path: kept a link, not followed
            # on the host.
            argv += ["--symlink", os.readlink(path), f"/etc/{entry}"]
        elif path.exists():
            # A symlinked host entry (resolv.conf -> /run/...) is bound by its target.
            argv += ["--ro-bind", str(path.resolve()), f"/etc/{entry}"]
    return argv


def limited(command: Sequence[str]) -> list[str]:
    """``command`` under the jail's resource limits (util-linux ``prlimit``, run first in
    the jail): a fork bomb or a memory hog in one jail must not take the host's process
    table or memory from forgeflow and every other repository's work."""
    return [
        "/usr/bin/prlimit",
        f"--nproc={JAIL_MAX_PROCESSES}",
        f"--data={JAIL_MAX_DATA_BYTES}",
        "--",
        *command,
    ]


def jail_env(spec: JailSpec) -> dict[str, str]:
    """The environment bwrap is started with, and passes on unchanged to the jail: the
    fixed list, the environment's variables (``$PATH`` in a value is the jail's own),
    then the caller's (forgeflow's own win)."""
    env = base_env({})
    for name, value in spec.system.variables:
        env[name] = value.replace("$PATH", env["PATH"])
    env.update(spec.env)
    return env


def check_spec(spec: JailSpec) -> None:
    """Every read-write bind of ``spec`` (and the home) is a real directory."""
    for path in (spec.home, *spec.writable):
        check_top_level(path)


def installation_paths(command: Sequence[str]) -> tuple[Path, ...]:
    """What must be readable in the jail for ``command`` to run: its installation root
    (the outermost ``node_modules`` of an npm package, else the folder above ``bin``)
    and, for a script, its interpreter's, unless they already sit in ``/usr``."""
    found = shutil.which(command[0])
    if found is None:
        raise JailUnavailable(f"{command[0]!r} was not found on PATH")
    paths: list[Path] = []
    real = Path(found).resolve()
    paths.append(_install_root(real))
    interpreter = _interpreter(real)
    if interpreter is not None:
        paths.append(_install_root(interpreter))
    return tuple(p for p in dict.fromkeys(paths) if not _under(p, Path("/usr")))


def direct_command(command: Sequence[str]) -> list[str]:
    """``command`` without its launcher script when it is npm's Codex (a Node script
    that runs the package's own static binary): an environment's root need not hold the
    host's Node. Anything else is returned as it is."""
    found = shutil.which(command[0])
    if found is None:
        return list(command)
    real = Path(found).resolve()
    if _interpreter(real) is None or "node_modules" not in real.parts:
        return list(command)
    modules = _install_root(real)
    for binary in sorted(modules.glob("@openai/codex-linux-*/vendor/*/bin/codex")):
        return [str(binary), *command[1:]]
    return list(command)


def _install_root(real: Path) -> Path:
    parts = real.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules") + 1])
    parent = real.parent
    return parent.parent if parent.name == "bin" else parent


def _interpreter(script: Path) -> Path | None:
    try:
        with script.open("rb") as fh:
            first = fh.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    name = words[1] if Path(words[0]).name == "env" and len(words) > 1 else words[0]
    found = shutil.which(name)
    return Path(found).resolve() if found else None


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def probe(bwrap: str = "bwrap") -> None:
    """Run ``true`` in a minimal jail; raise :class:`JailUnavailable` naming the fix."""
    found = shutil.which(bwrap)
    if found is None:
        raise JailUnavailable(
            "bubblewrap is not installed: install Debian's package 'bubblewrap' "
            "(apt-get install bubblewrap), or set FORGEFLOW_SANDBOX=none for a single "
            "trusted user"
        )
    argv = [found, "--ro-bind", "/usr", "/usr", "--unshare-pid", "--proc", "/proc"]
    for name in _USR_LINKS:
        link = Path("/", name)
        if link.is_symlink():
            argv += ["--symlink", os.readlink(link), str(link)]
    argv += ["--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    if done.returncode == 0:
        return
    why = (done.stderr.strip().splitlines() or ["no output"])[-1]
    fix = "check that bwrap works for this user"
    if "namespace" in why.lower() or "permission" in why.lower():
        fix = (
            "user namespaces are off for this user: enable them "
            "(sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0) "
            "or run forgeflow as root"
        )
    raise JailUnavailable(f"bubblewrap cannot start a jail here ({why}): {fix}")
