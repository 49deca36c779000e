"""Run ``forgeflow`` as a real child process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

FORGEFLOW = str(Path(sys.executable).parent / "forgeflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
    env.update(extra)
    return env


def start_serve(env: dict[str, str], *args: str, stderr_path: Path) -> subprocess.Popen[bytes]:
    with stderr_path.open("ab") as err:
        return subprocess.Popen(
            [FORGEFLOW, "serve", *args], env=env, stdout=subprocess.DEVNULL, stderr=err
        )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    # Returns as soon as /healthz answers; the bound is generous because a start-up on
    # two cores shared with other suites took more than 30 s (imports, migrations).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"forgeflow exited with {proc.returncode}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("forgeflow did not become healthy")
