"""What ``forgeflow serve`` settles before it serves: the data folder's lock (one
``serve`` per data folder), and what it says at start (what it cannot do yet, one line
each, and where its admin pages are)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
from pathlib import Path

from forgeflow.config import Role, Settings
from forgeflow.config_warnings import capability_warnings

LOCK_FILE = "serve.lock"


class DataFolderInUse(RuntimeError):
    """Another live ``serve`` holds the data folder's lock."""


class DataFolderLock:
    """An exclusive ``flock`` on ``<data folder>/serve.lock``, held for the life of the
    process, with its pid in the file for the next one to name.

    Two processes on one data folder would share one SQLite file, one admin token and
    one worker id (each taking the other's leases for a dead predecessor's) and one set
    of clones. The kernel drops a ``flock`` when its holder dies, so a crashed process's
    lock is free at once; the pid left in the file is only for the message. The file
    descriptor is not inherited (Python's default), so git and Codex children never
    hold it. Several processes on one PostgreSQL database each have their own folder.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise DataFolderInUse(
                f"the data folder {self.path.parent.resolve()} is in use by forgeflow "
                f"({who}, holding {self.path.name}); stop it, or give this process its "
                "own FORGEFLOW_DATA_DIR (several processes share work through one "
                "PostgreSQL FORGEFLOW_DATABASE_URL, each with its own data folder)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def cannot_do_yet(settings: Settings, role: Role) -> list[str]:
    """One line per thing this process cannot do with its settings, and why: the Gitea
    settings, the webhook secret, the model provider's key, a configured Gitea MCP
    command that is not installed."""
    lines = capability_warnings(settings)
    if role is Role.INGRESS:
        return lines  # this process runs no agent
    model = _model_line(settings)
    if model is not None:
        lines.append(model)
    mcp = _mcp_line(settings)
    if mcp is not None:
        lines.append(mcp)
    return lines


def _model_line(settings: Settings) -> str | None:
    from forgeflow.agent.provider import ProviderError, load_provider

    key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    try:
        provider = load_provider(
            base_url=settings.model_base_url, api_key=key, codex_home=settings.codex_home_path
        )
    except ProviderError:
        return None  # serve refuses to start on this, with its own line
    if provider.api_key:
        return None
    if settings.model_base_url is None:
        return (
            "FORGEFLOW_MODEL_BASE_URL and FORGEFLOW_MODEL_API_KEY are not set and there is "
            f"no key for {provider.base_url} (CODEX_HOME's provider, else OpenAI with "
            "OPENAI_API_KEY): the agent's turns fail until the model provider is set"
        )
    return (
        f"FORGEFLOW_MODEL_API_KEY is not set: {provider.base_url} gets the agent's model "
        "requests without a key, so its turns fail until the key is set"
    )


def _mcp_line(settings: Settings) -> str | None:
    """Only when a Gitea MCP server is configured: forgeflow's own tools need nothing."""
    command = settings.gitea_mcp_command
    if not command:
        return None
    argv = shlex.split(command)
    if shutil.which(argv[0]) is not None:
        return None
    return (
        f"FORGEFLOW_GITEA_MCP_COMMAND names {argv[0]!r}, which is not installed: the "
        "agent's turns fail (mcp_command_missing) until it is, or the setting is removed"
    )


def admin_pages_line(settings: Settings, *, token_from_file: bool) -> str:
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    if token_from_file:
        how = f"the admin token in {Path(settings.data_dir).resolve() / 'admin_token'}"
    else:
        how = "FORGEFLOW_ADMIN_TOKEN"
    return f"admin pages at {base}/ui/ (sign in with {how})"
