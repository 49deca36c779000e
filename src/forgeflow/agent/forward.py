"""The broker forwarder of a jail without network (``FORGEFLOW_AGENT_NETWORK=off``).

Such a jail has a network namespace of its own with only a loopback device, so the
jailed Codex cannot reach forgeflow's brokers on the host's loopback. This script runs
first in the jail: it listens on the jail's ``127.0.0.1:<port>``, forks a forwarder that
copies each connection to the broker's Unix socket bound into the jail, and becomes the
command after ``--`` (the app-server), so bwrap's process tree stays as it was.

Standard library only: it runs under the system's Python inside the jail, outside
forgeflow's virtual environment. Hand-written: socat would be one more system package.

    python3 forward.py PORT SOCKET -- COMMAND...
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(listener: socket.socket, target: str) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(relay, sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: forward.py PORT SOCKET -- COMMAND...")
    port, target, command = int(argv[0]), argv[1], argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    # Listening before the fork: the app-server's first connection never races it.
    if os.fork() == 0:
        asyncio.run(_serve(listener, target))
        os._exit(0)
    listener.close()
    os.execvp(command[0], command)  # noqa: S606 - the jail's own app-server


if __name__ == "__main__":
    main(sys.argv[1:])
