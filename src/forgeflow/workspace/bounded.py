"""A subprocess's output read with a bound (``GitRunner.run``'s ``max_output``): git's
output about what a pull request or the agent pushed is as long as they like, and it is
read into forgeflow's own process, which no jail bounds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

# What is kept of a bounded run's stderr (git's messages are short).
_STDERR_KEPT = 64 * 1024


async def communicate(
    proc: asyncio.subprocess.Process, max_output: int | None
) -> tuple[bytes, bytes, bool]:
    """The process's stdout and stderr and whether stdout was cut at ``max_output``
    (then the process group is ended: git would otherwise block on a full pipe)."""
    if max_output is None:
        out, err = await proc.communicate()
        return out, err, False
    assert proc.stdout is not None and proc.stderr is not None

    async def read(stream: asyncio.StreamReader, keep: int, stop: bool) -> tuple[bytes, bool]:
        buf = bytearray()
        while chunk := await stream.read(64 * 1024):
            buf += chunk[: max(0, keep + 1 - len(buf))]
            if len(buf) > keep and stop:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return bytes(buf[:keep]), True
        return bytes(buf[:keep]), False

    (out, cut), (err, _) = await asyncio.gather(
        read(proc.stdout, max_output, True), read(proc.stderr, _STDERR_KEPT, False)
    )
    await proc.wait()
    return out, err, cut
