"""The one way forgeflow runs git: argv lists, a scrubbed environment, a time limit.

Credentials reach git only through ``GIT_ASKPASS``: a fixed script that prints two
variables set in the child's environment alone, so the token is never in a remote URL,
``.git/config``, the process list, a log line or an exception message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.redaction import MASK, derived_forms, redact_text
from forgeflow.workspace.bounded import communicate

ASKPASS_NAME = ".forgeflow-askpass"
USERNAME_VAR = "FORGEFLOW_GIT_USERNAME"
PASSWORD_VAR = "FORGEFLOW_GIT_PASSWORD"  # noqa: S105 - the variable's name, not a secret

ALLOWED_VAR = "FORGEFLOW_GIT_ALLOWED"

# git asks "Username for 'https://host/path': " first, then "Password for
# 'https://user@host/path': " (with credential.useHttpPath the prompt holds the path).
# The script answers only when that URL lies under the one forgeflow allows (the
# configured Gitea URL): a URL anything rewrote (a config, a redirect) gets nothing.
ASKPASS_SCRIPT = f"""#!/bin/sh
# forgeflow: answers git's credential prompts from the child's own environment, and
# only for the allowed destination.
url=${{1#*\\'}}; url=${{url%\\'*}}
case "$url" in
  *://*@*) scheme=${{url%%://*}}; rest=${{url#*://}}; url="$scheme://${{rest#*@}}" ;;
esac
case "$url/" in
  "${ALLOWED_VAR}"*) ;;
  *) exit 1 ;;
esac
case "$1" in
  Username*) printf '%s\\n' "${USERNAME_VAR}" ;;
  *) printf '%s\\n' "${PASSWORD_VAR}" ;;
esac
"""

# Only what git needs to run and to reach the network; everything else (forgeflow's own
# secrets, GIT_DIR/GIT_WORK_TREE from a caller, SSH_ASKPASS, ...) stays behind.
_PASSTHROUGH = (
    "PATH",
    "HOME",
    "TMPDIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)

# Applied to every git call with -c, which beats any repository or user configuration.
# The repositories we touch are filled by people we do not control (and an agent works
# in their worktrees), so nothing configured or shipped in them may run code in our
# process: no hooks (post-checkout on worktree add, post-merge, reference-transaction on
# fetch), no fsmonitor command, no stored credential helper, no transport other than
# HTTP(S) (no ext::, file:// or ssh command tricks), no submodule recursion towards URLs
# from a hostile .gitmodules, no redirect that would take the credentials elsewhere,
# and no detached auto-gc that would outlive our time limit (GC is the cleanup
# pipeline's business).
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("credential.helper", ""),
    # The prompt (and so the askpass check) carries the whole URL, path included.
    ("credential.useHttpPath", "true"),
    ("protocol.allow", "never"),
    ("protocol.http.allow", "always"),
    ("protocol.https.allow", "always"),
    ("http.followRedirects", "false"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("advice.detachedHead", "false"),
)

_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
# Characters git refuses in ref names (git-check-ref-format(1)); ":" would also turn a
# fetch refspec "src:dst" into a write to a ref of the sender's choosing.
_BAD_REF_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")

# Texts git prints when the server refused our credentials or git had none to offer.
_AUTH_MARKERS = (
    "authentication failed",
    "could not read username",
    "could not read password",
    "terminal prompts disabled",
    "returned error: 401",
    "returned error: 403",
    "http basic: access denied",
    "invalid username or password",
)


Spawn = Callable[[list[str], Mapping[str, str], asyncio.subprocess.Process, str | None], None]


class WorkspaceError(Exception):
    """A workspace operation failed; ``code`` is the audit/error code."""

    code = "workspace_error"

    def __init__(self, message: str, *, details: Mapping[str, JsonValue] | None = None) -> None:
        super().__init__(message)
        self.details: JsonObject = dict(details or {})  # audited with the failure


class WorkspaceDirty(WorkspaceError):
    code = "workspace_dirty"


class GitAuthFailed(WorkspaceError):
    code = "git_auth_failed"


class GitTimeout(WorkspaceError):
    code = "git_timeout"


class GitFailed(WorkspaceError):
    code = "git_failed"


def check_url(url: str, what: str) -> SplitResult:
    """Only plain HTTP(S) URLs without credentials may reach git or ``.git/config``."""
    parts = urlsplit(url)
    if (
        parts.scheme not in {"http", "https"}
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url)
    ):
        raise GitFailed(f"{what} must be an http(s) URL without credentials")
    return parts


def strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def same_origin(a: SplitResult, b: SplitResult) -> bool:
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)


def check_ref(name: str, what: str) -> str:
    """A branch or ref name that git accepts and that cannot become an option/refspec."""
    if (
        not name
        or len(name) > 255
        or name.startswith(("-", "/"))
        or name.endswith(("/", ".", ".lock"))
        or _BAD_REF_CHARS.search(name)
        or ".." in name
        or "@{" in name
        or "//" in name
        or name == "@"
        or any(part.startswith(".") for part in name.split("/"))
    ):
        raise GitFailed(f"{what} {name!r} is not a valid git ref name")
    return name


def check_sha(value: str, what: str) -> str:
    sha = value.lower()
    if not _SHA_RE.match(sha):
        raise GitFailed(f"{what} {value!r} is not a commit id")
    return sha


@dataclass(frozen=True)
class GitResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    truncated: bool = False  # stdout was cut at the run's ``max_output`` (git was ended)


@dataclass
class GitRunner:
    """Runs git commands; ``auth=True`` calls get the credentials, all others none."""

    root: str
    token: str | None
    username: str = "forgeflow"
    timeout: float = 300.0
    # The credentials are given only to URLs under this one (the configured Gitea);
    # None: under the scheme, host and port of the URL the command names.
    gitea_url: str | None = None
    # Told about every git process started (argv, environment, process, cwd): an
    # audit and test seam that sees exactly what git was handed.
    on_spawn: Spawn | None = None
    _askpass: str | None = field(default=None, init=False, repr=False)

    def scrub(self, text: str) -> str:
        """Remove the token (and every registered secret) from text meant for people."""
        if self.token:
            for form in sorted({self.token, *derived_forms(self.token, (self.username,))},
                               key=len, reverse=True):  # fmt: skip
                text = text.replace(form, MASK)
        return redact_text(text)

    def askpass_path(self) -> str:
        """Write the askpass script once (0700, atomically) and return its path."""
        if self._askpass is not None:
            return self._askpass
        path = os.path.join(self.root, ASKPASS_NAME)
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        try:
            with open(path, encoding="utf-8") as fh:
                current = fh.read()
            fresh = current == ASKPASS_SCRIPT and not os.path.islink(path)
        except OSError:
            fresh = False
        if not fresh:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f"{ASKPASS_NAME}.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(ASKPASS_SCRIPT)
                os.chmod(tmp, 0o700)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        elif os.stat(path).st_mode & 0o777 != 0o700:
            os.chmod(path, 0o700)
        self._askpass = path
        return path

    def allowed_prefix(self, url: str | None) -> str:
        """What a prompt's URL must start with for the askpass to answer."""
        base = self.gitea_url or url or ""
        parts = urlsplit(base)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        path = parts.path.rstrip("/") if self.gitea_url else ""
        return f"{parts.scheme}://{netloc}{path}/"

    def environment(self, *, auth: bool, url: str | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
        env.update(
            {
                # English messages, so failures can be classified by their text.
                "LC_ALL": "C",
                "LANG": "C",
                "GIT_TERMINAL_PROMPT": "0",
                # Neither the machine's nor the user's git configuration applies: the
                # behaviour must not depend on, e.g., a global credential helper.
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull,
                # `git status` must not rewrite an index (ours or the agent's) as a side
                # effect of looking at it.
                "GIT_OPTIONAL_LOCKS": "0",
                # Replacement refs an agent made must not change what we read or push.
                "GIT_NO_REPLACE_OBJECTS": "1",
            }
        )
        if auth and self.token:
            env["GIT_ASKPASS"] = self.askpass_path()
            env[USERNAME_VAR] = self.username
            env[PASSWORD_VAR] = self.token
            env[ALLOWED_VAR] = self.allowed_prefix(url)
        return env

    def argv(self, args: tuple[str, ...]) -> list[str]:
        argv = ["git"]
        for key, value in SAFE_CONFIG:
            argv += ["-c", f"{key}={value}"]
        return [*argv, *args]

    async def run(
        self,
        *args: str,
        cwd: str | None = None,
        auth: bool = False,
        check: bool = True,
        time_limit: float | None = None,
        worktree: tuple[str, str] | None = None,
        max_output: int | None = None,
    ) -> GitResult:
        """``worktree``: (its administrative folder, the clone's .git) for a command in a
        session worktree. git is told both instead of following the worktree's ``.git``
        file, which the agent can rewrite to a folder (and config) of its own.
        ``max_output``: keep at most this many bytes of stdout; past them git is ended
        and the result says ``truncated`` (a diff of what a pull request or the agent
        pushed is as long as they like: git's output is read into this process)."""
        argv = self.argv(args)
        limit = self.timeout if time_limit is None else time_limit
        words = [a for i, a in enumerate(args) if a != "-c" and (i == 0 or args[i - 1] != "-c")]
        what = f"git {words[0]}" if words else "git"
        url = next((a for a in args if a.startswith(("http://", "https://"))), None)
        env = self.environment(auth=auth, url=url)
        if worktree is not None and cwd is not None:
            env.update(
                {"GIT_DIR": worktree[0], "GIT_COMMON_DIR": worktree[1], "GIT_WORK_TREE": cwd}
            )
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Its own process group, so a timeout also ends git-remote-http, index-pack
            # and the askpass script, not just the git front end.
            start_new_session=True,
        )
        if self.on_spawn is not None:
            self.on_spawn(list(argv), env, proc, cwd)
        try:
            out, err, cut = await asyncio.wait_for(communicate(proc, max_output), timeout=limit)
        except TimeoutError:
            await _kill(proc)
            raise GitTimeout(f"{what} did not finish within {limit:g}s") from None
        except BaseException:
            # Cancelled: never leave a git process running on a checkout we manage.
            await _kill(proc)
            raise
        result = GitResult(
            argv=tuple(argv),
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=self.scrub(err.decode("utf-8", errors="replace")),
            truncated=cut,
        )
        if check and result.returncode != 0 and not cut:
            raise self.failure(what, result)
        return result

    def failure(self, what: str, result: GitResult) -> WorkspaceError:
        stderr = result.stderr.strip()
        lowered = stderr.lower()
        details: JsonObject = {
            "command": what,
            "exitCode": result.returncode,
            "stderr": stderr[-2000:],
        }
        if any(marker in lowered for marker in _AUTH_MARKERS):
            return GitAuthFailed(f"{what}: authentication failed: {stderr[-500:]}", details=details)
        return GitFailed(
            f"{what} failed (exit {result.returncode}): {stderr[-500:]}", details=details
        )


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    # Reap the child so no zombie is left; SIGKILL cannot be ignored, so this is quick.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), timeout=5)
