"""The forwarder of a jail with a network namespace of its own
(``FORGEFLOW_AGENT_NETWORK=proxy`` or ``off``).

Such a jail has only a loopback device, so the jailed Codex cannot reach forgeflow's
brokers (nor, with ``proxy``, its egress proxy) on the host's loopback. This script runs
first in the jail: it listens on the jail's ``127.0.0.1:<port>`` for each pair given,
forks a forwarder that copies each connection to that pair's Unix socket bound into the
jail, and becomes the command after ``--`` (the app-server), so bwrap's process tree
stays as it was.

Standard library only: it runs under the system's Python inside the jail, outside
forgeflow's virtual environment. Hand-written: socat would be one more system package.

    python3 forward.py PORT SOCKET [PORT SOCKET...] -- COMMAND...
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


async def _serve_all(pairs: list[tuple[socket.socket, str]]) -> None:
    await asyncio.gather(*(_serve(listener, target) for listener, target in pairs))


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
    if "--" not in argv:
        sys.exit("usage: forward.py PORT SOCKET [PORT SOCKET...] -- COMMAND...")
    cut = argv.index("--")
    pairs_args, command = argv[:cut], argv[cut + 1 :]
    if not pairs_args or len(pairs_args) % 2 or not command:
        sys.exit("usage: forward.py PORT SOCKET [PORT SOCKET...] -- COMMAND...")
    pairs = []
    for port, target in zip(pairs_args[::2], pairs_args[1::2], strict=True):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))
        listener.listen(64)
        pairs.append((listener, target))
    # Listening before the fork: the app-server's first connection never races it.
    if os.fork() == 0:
        asyncio.run(_serve_all(pairs))
        os._exit(0)
    for listener, _ in pairs:
        listener.close()
    os.execvp(command[0], command)  # noqa: S606 - the jail's own app-server


if __name__ == "__main__":
    main(sys.argv[1:])
