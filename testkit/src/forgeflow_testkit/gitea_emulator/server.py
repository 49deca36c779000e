"""Runs the emulator's ASGI app with uvicorn on 127.0.0.1 in a background thread."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp


class BackgroundServer:
    """The listening socket is bound at construction (port 0 picks a free port), so the
    URL is known before the server starts."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            # Not uvloop: a test runs forgeflow's own uvloop loop in the same process, and
            # uvloop refuses two loops spawning processes at once ("Racing with another
            # loop to spawn a process"); the emulator's git backend spawns git.
            loop="asyncio",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            return
        self._socket.listen(128)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"gitea-emulator-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the Gitea emulator did not start")
            time.sleep(0.01)

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)
            self._thread = None
        self._socket.close()
