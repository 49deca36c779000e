"""A repository's environment (issue #26), as the operator declares it: Debian packages
for a root of its own, extra read-only binds of host toolchains, environment variables
and a setup script of the repository's. Rules and records only, no I/O.

The declaration is forgeflow's configuration, never the repository's files: a pull
request cannot change what its jail gets. Validation names the field that is wrong.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from forgeflow.domain.json import JsonObject, JsonValue

MAX_PACKAGES = 200
MAX_BINDS = 32
MAX_VARIABLES = 64
MAX_VALUE = 4096
MAX_SECRET = 8192
MAX_SECRETS = 32
DEFAULT_SETUP_SECONDS = 900
MAX_SETUP_SECONDS = 3600
# What a failed build or setup quotes in the task's answer, and what a log keeps.
ANSWER_TAIL = 2000
LOG_KEEP = 64 * 1024

ENVIRONMENT_SETUP_FAILED = "environment_setup_failed"

# Debian policy 5.6.1: lowercase letters, digits, + - . ; at least two, starting alnum.
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{1,99}$")
_SUITE = re.compile(r"^[a-z][a-z0-9-]{1,39}$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
# A variable whose name looks like it holds a credential: such values go through setup
# secrets (setup only, redacted), never through the turns' environment.
_CREDENTIAL = re.compile(
    r"(TOKEN|SECRET|PASSW|PASSWD|PWD|API_?KEY|PRIVATE|CREDENTIAL|AUTH|COOKIE|SESSION|_KEY$|^KEY)",
    re.I,
)
# Set by forgeflow in every jail: the environment may not replace them.
_RESERVED = frozenset(
    {"HOME", "USER", "LOGNAME", "TMPDIR", "CODEX_HOME", "LANG", "SHELL", "PWD"}
    | {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"}
    | {"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"}
    | {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"}
)
# Read by the dynamic loader and the C library of every program started with the
# jail's environment, bwrap itself on the host first (LD_DEBUG_OUTPUT would have it
# write a file there): glibc's own list of what a privileged program must not inherit
# (UNSECURE_ENVVARS), with the LD_ and MALLOC_ families whole.
_LOADER = frozenset(
    {"GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH"}
    | {"NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR"}
)
# The jail's own mount points and system folders: a bind may not land on or in them.
_JAIL_OWN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
             "/proc", "/dev", "/sys", "/tmp", "/home",  # noqa: S108 - the jail's, not temp "/run", "/opt/forgeflow", "/root",
             "/var")  # fmt: skip


class EnvironmentInvalid(ValueError):
    """An environment that cannot be used; ``field`` names what is wrong."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, slots=True)
class Environment:
    """One repository's declared environment (empty: the host's system)."""

    packages: tuple[str, ...] = ()  # sorted, each once
    suite: str | None = None  # None: the host's own release
    binds: tuple[str, ...] = ()  # host paths, bound read-only at the same path
    variables: tuple[tuple[str, str], ...] = ()  # sorted by name
    setup_script: str | None = None  # a path in the repository
    setup_timeout_seconds: int = DEFAULT_SETUP_SECONDS

    @property
    def empty(self) -> bool:
        return not (self.packages or self.binds or self.variables or self.setup_script)

    def json(self) -> JsonObject:
        return {
            "packages": list(self.packages),
            "suite": self.suite,
            "binds": list(self.binds),
            "variables": dict(self.variables),
            "setupScript": self.setup_script,
            "setupTimeoutSeconds": self.setup_timeout_seconds,
        }


@dataclass(frozen=True, slots=True)
class RootKey:
    """What a root is built from: its key names its folder and its row."""

    suite: str
    packages: tuple[str, ...]
    key: str = field(init=False)

    def __post_init__(self) -> None:
        text = self.suite + "\n" + "\n".join(self.packages)
        object.__setattr__(self, "key", hashlib.sha256(text.encode()).hexdigest()[:24])


def root_key(env: Environment, host_suite: str, base: Sequence[str]) -> RootKey | None:
    """The root ``env`` needs (its packages plus forgeflow's own ``base``), or None when
    it lists no package (then the jail keeps the host's system)."""
    if not env.packages:
        return None
    return RootKey(env.suite or host_suite, tuple(sorted({*env.packages, *base})))


def setup_fingerprint(
    env: Environment, root: str | None, script_sha: str, secrets: Mapping[str, str]
) -> str:
    """Changes whenever the setup must run again: the script's content, the
    environment, the root it runs on, or a setup secret."""
    h = hashlib.sha256()
    for part in (repr(env.json()), root or "host", script_sha):
        h.update(part.encode() + b"\0")
    for name in sorted(secrets):
        h.update(name.encode() + b"=" + hashlib.sha256(secrets[name].encode()).digest())
    return h.hexdigest()[:32]


def parse(raw: Mapping[str, JsonValue], forbidden: Sequence[str]) -> Environment:
    """An environment from its JSON (the API's body or a stored row); ``forbidden``:
    host folders no bind may reach (forgeflow's data folder, the workspace root)."""
    unknown = set(raw) - {"packages", "suite", "binds", "variables", "setupScript",
                          "setupTimeoutSeconds"}  # fmt: skip
    if unknown:
        raise EnvironmentInvalid(sorted(unknown)[0], "is not a field of an environment")
    packages = _packages(raw.get("packages", []))
    suite = raw.get("suite")
    if suite is not None and (not isinstance(suite, str) or not _SUITE.match(suite)):
        raise EnvironmentInvalid("suite", "must be a Debian suite name such as 'bookworm'")
    binds = tuple(_bind(i, p, forbidden) for i, p in enumerate(_list(raw, "binds", MAX_BINDS)))
    if len(set(binds)) != len(binds):
        raise EnvironmentInvalid("binds", "names a path twice")
    return Environment(
        packages=packages,
        suite=suite,
        binds=binds,
        variables=_variables(raw.get("variables", {})),
        setup_script=_script(raw.get("setupScript")),
        setup_timeout_seconds=_timeout(raw.get("setupTimeoutSeconds", DEFAULT_SETUP_SECONDS)),
    )


def _list(raw: Mapping[str, JsonValue], name: str, limit: int) -> list[JsonValue]:
    value = raw.get(name, [])
    if not isinstance(value, list):
        raise EnvironmentInvalid(name, "must be a list")
    if len(value) > limit:
        raise EnvironmentInvalid(name, f"holds more than {limit} entries")
    return value


def _packages(value: JsonValue) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise EnvironmentInvalid("packages", "must be a list of Debian package names")
    if len(value) > MAX_PACKAGES:
        raise EnvironmentInvalid("packages", f"holds more than {MAX_PACKAGES} names")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not _PACKAGE.match(name):
            raise EnvironmentInvalid(f"packages[{i}]", f"{name!r} is not a Debian package name")
    return tuple(sorted({str(n) for n in value}))


def _bind(i: int, value: JsonValue, forbidden: Sequence[str]) -> str:
    where = f"binds[{i}]"
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise EnvironmentInvalid(where, "must be an absolute host path")
    path = posixpath.normpath(value)
    if path != value.rstrip("/") or ".." in PurePosixPath(value).parts or len(path) > 500:
        raise EnvironmentInvalid(where, f"{value!r} must be a plain path (no '..', no '//')")
    if path == "/" or any(_inside(path, own) or _inside(own, path) for own in _JAIL_OWN):
        raise EnvironmentInvalid(where, f"{path} is, holds or is inside a folder of the jail")
    check_not_forbidden(where, path, forbidden)
    return path


def check_not_forbidden(where: str, path: str, forbidden: Sequence[str]) -> None:
    """``path`` neither inside nor around one of forgeflow's own folders."""
    for own in forbidden:
        if _inside(path, own) or _inside(own, path):
            raise EnvironmentInvalid(where, f"{path} reaches forgeflow's own folder {own}")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _variables(value: JsonValue) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise EnvironmentInvalid("variables", "must be an object of names and values")
    if len(value) > MAX_VARIABLES:
        raise EnvironmentInvalid("variables", f"holds more than {MAX_VARIABLES} variables")
    out = []
    for name, val in value.items():
        where = f"variables.{name}"
        check_name(where, name)
        if _CREDENTIAL.search(name):
            raise EnvironmentInvalid(
                where, "looks like a credential: set it as a setup secret (setup only)"
            )
        if not isinstance(val, str) or "\0" in val or len(val) > MAX_VALUE:
            raise EnvironmentInvalid(where, f"must be a string of at most {MAX_VALUE} chars")
        out.append((name, val))
    return tuple(sorted(out))


def check_name(where: str, name: str) -> None:
    """A variable's (or setup secret's) name: a shell name forgeflow does not set."""
    if not _NAME.match(name):
        raise EnvironmentInvalid(where, f"{name!r} is not a variable name")
    if name.upper() in _RESERVED or name.upper().startswith(("FORGEFLOW_", "CODEX_", "NPM_")):
        raise EnvironmentInvalid(where, f"{name} is set by forgeflow in every jail")
    if name.upper() in _LOADER or name.upper().startswith(("LD_", "MALLOC_")):
        raise EnvironmentInvalid(where, f"{name} is read by bwrap's loader on the host")


def _script(value: JsonValue) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value or len(value) > 300:
        raise EnvironmentInvalid("setupScript", "must be a path in the repository")
    parts = PurePosixPath(value).parts
    if value.startswith("/") or ".." in parts or ".git" in parts:
        raise EnvironmentInvalid("setupScript", f"{value!r} must be a relative path inside it")
    return posixpath.normpath(value)


def _timeout(value: JsonValue) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SETUP_SECONDS:
        raise EnvironmentInvalid(
            "setupTimeoutSeconds", f"must be a whole number of seconds, 1 to {MAX_SETUP_SECONDS}"
        )
    return value


def check_secret(name: str, value: JsonValue) -> str:
    where = f"secrets.{name}"
    check_name(where, name)
    if name.upper() == "PATH":
        raise EnvironmentInvalid(where, "PATH is the environment's, not a secret")
    if not isinstance(value, str) or not value or "\0" in value or len(value) > MAX_SECRET:
        raise EnvironmentInvalid(where, f"must be a string of 1 to {MAX_SECRET} chars")
    return value


# Control characters other than tab and newline: a NUL is refused by PostgreSQL's text
# (the setup's output would decide that its run is never recorded), and terminal
# escapes are for a terminal, not for a page, a comment or an operator's shell.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(log: str) -> str:
    """A log as it is kept and shown: line ends as newlines, other controls as U+FFFD."""
    return _CONTROLS.sub("\ufffd", log.replace("\r\n", "\n").replace("\r", "\n"))


def tail(log: str, limit: int = ANSWER_TAIL) -> str:
    """The end of a log, at most ``limit`` characters, cut at a line."""
    if len(log) <= limit:
        return log
    cut = log[-limit:]
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < limit // 2 else cut


BUILDING = "building"
READY = "ready"
FAILED = "failed"
RUNNING = "running"
REMOVED = "removed"  # a root no environment named and no jail used, deleted


@dataclass(frozen=True, slots=True)
class RootState:
    """A root as the operators see it (``environment_roots``)."""

    root_key: str
    suite: str
    packages: tuple[str, ...]
    state: str  # building, ready, failed, removed
    size_bytes: int | None
    log: str | None
    started_at: str
    finished_at: str | None
    last_used_at: str | None
    removed_at: str | None = None

    def json(self) -> JsonObject:
        return {
            "rootKey": self.root_key,
            "suite": self.suite,
            "packages": list(self.packages),
            "state": self.state,
            "sizeBytes": self.size_bytes,
            "log": self.log,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "lastUsedAt": self.last_used_at,
            "removedAt": self.removed_at,
        }


@dataclass(frozen=True, slots=True)
class SetupState:
    """A repository's last setup run (``environment_setups``)."""

    fingerprint: str
    root_key: str | None
    state: str  # running, ready, failed
    log: str | None
    task_id: str | None
    started_at: str
    finished_at: str | None

    def json(self) -> JsonObject:
        return {
            "state": self.state,
            "rootKey": self.root_key,
            "log": self.log,
            "taskId": self.task_id,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
