"""Newline-delimited JSON-RPC over a child process's stdio, as ``codex app-server``
speaks it, with the child in its own process group. (MCP is not spoken here: the Gitea
tools and the external server's client use the ``mcp`` SDK, agent/gitea_tools/.)

Hand-written: the JSON-RPC libraries on PyPI either want HTTP/websocket transports or
LSP's Content-Length framing; this is one line per message and ~150 lines of code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from forgeflow.redaction import redact_text

log = structlog.get_logger("forgeflow.jsonrpc")

Json = dict[str, Any]
Handler = Callable[[Json], Awaitable[None]]


class RpcError(Exception):
    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"{method}: error {code}: {message}")
        self.method = method
        self.code = code
        self.rpc_message = message


class RpcTimeout(Exception):
    pass


class ProcessGone(Exception):
    pass


def kill_group(pgid: int) -> None:
    """End a whole process group: a launcher's children must not outlive it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if sig is signal.SIGTERM:
            # Give the group a moment to exit cleanly before the hard kill.
            for _ in range(20):
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                import time

                time.sleep(0.05)


class RpcProcess:
    """One child process speaking JSON-RPC lines; notifications and server requests go
    to ``on_message``; responses resolve the matching :meth:`request`."""

    def __init__(
        self, proc: asyncio.subprocess.Process, on_message: Handler, pgid_file: Path | None
    ) -> None:
        self.proc = proc
        self._on_message = on_message
        self._pgid_file = pgid_file
        self._pending: dict[int, asyncio.Future[Json]] = {}
        self._next_id = 0
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="jsonrpc.reader")
        self._stderr: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        on_message: Handler,
        stderr_path: Path | None = None,
        pgid_file: Path | None = None,
        cwd: str | None = None,
    ) -> RpcProcess:
        if pgid_file is not None and pgid_file.exists():
            # A crashed forgeflow left its app-server group behind; it would still hold
            # the threads' writer locks, so it goes first.
            with contextlib.suppress(ValueError, OSError):
                kill_group(int(pgid_file.read_text().strip()))
            pgid_file.unlink(missing_ok=True)
        # stderr is a pipe forgeflow copies to the log, never the log file itself: an open
        # host file in the jail could be reopened there (/proc/<pid>/fd/2) to read, cut or
        # forge every repository's log lines.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if stderr_path else asyncio.subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            limit=64 * 1024 * 1024,
        )
        if pgid_file is not None:
            pgid_file.parent.mkdir(parents=True, exist_ok=True)
            # Written aside and renamed so that a reader never sees a half-written pid.
            partial = pgid_file.with_suffix(".partial")
            partial.write_text(str(proc.pid))
            partial.replace(pgid_file)
        rpc = cls(proc, on_message, pgid_file)
        if stderr_path is not None and proc.stderr is not None:
            rpc._stderr = asyncio.create_task(
                _copy_stderr(proc.stderr, stderr_path), name="jsonrpc.stderr"
            )
        return rpc

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("jsonrpc.bad_line", length=len(line))
                    continue
                if not isinstance(msg, dict):
                    continue
                if "id" in msg and "method" not in msg:
                    fut = self._pending.pop(msg["id"], None) if isinstance(msg["id"], int) else None
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                try:
                    await self._on_message(msg)
                except Exception:
                    log.exception("jsonrpc.handler_failed", method=msg.get("method"))
        finally:
            self.closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ProcessGone("the process closed its output"))
            self._pending.clear()

    async def _write(self, msg: Json) -> None:
        if self.closed.is_set() or self.proc.stdin is None:
            raise ProcessGone("the process is gone")
        if self.proc.stdin.is_closing():
            raise ProcessGone("the process closed its input")
        try:
            self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            # RuntimeError: asyncio's "unable to perform operation on closed transport".
            raise ProcessGone(str(exc)) from None

    async def request(self, method: str, params: Json, timeout: float) -> Json:
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[Json] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        await self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        try:
            async with asyncio.timeout(timeout):
                reply = await fut
        except TimeoutError:
            self._pending.pop(rid, None)
            raise RpcTimeout(f"{method}: no answer within {timeout:g}s") from None
        if "error" in reply:
            err = reply["error"] or {}
            raise RpcError(method, int(err.get("code", 0)), str(err.get("message", "")))
        result: Json = reply.get("result") or {}
        return result

    async def notify(self, method: str, params: Json | None = None) -> None:
        msg: Json = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._write(msg)

    async def respond(self, request_id: Any, result: Json) -> None:
        await self._write({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def respond_error(self, request_id: Any, code: int, message: str) -> None:
        error = {"code": code, "message": message}
        await self._write({"jsonrpc": "2.0", "id": request_id, "error": error})

    async def close(self) -> None:
        if self.proc.returncode is None:
            await asyncio.get_running_loop().run_in_executor(None, kill_group, self.proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        if self._pgid_file is not None:
            self._pgid_file.unlink(missing_ok=True)


_STDERR_LINE = 4096  # characters of one stderr line kept in the log
_STDERR_TOTAL = 16 * 1024 * 1024  # bytes of one process's stderr kept, then one note


async def _copy_stderr(stream: asyncio.StreamReader, path: Path) -> None:
    """Copy a child's stderr to ``path``, bounded per line and in all, redacted: what a
    jailed process writes is untrusted, and the log is forgeflow's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("ab") as log_file:
        while True:
            try:
                line = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:
                line = end.partial
            except asyncio.LimitOverrunError as over:
                line = await stream.read(over.consumed)
            if not line:
                return
            if written >= _STDERR_TOTAL:
                continue  # keep draining, so the child never blocks on a full pipe
            text = redact_text(line.decode("utf-8", errors="replace").rstrip("\n"))
            out = (text[:_STDERR_LINE] + "\n").encode()
            written += len(out)
            if written >= _STDERR_TOTAL:
                out += b"[forgeflow: further stderr of this process left out]\n"
            log_file.write(out)
            log_file.flush()
