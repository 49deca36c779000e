"""The egress proxy's cost on a package install: ``pip download`` of a wheel from an
index on loopback, directly and through forgeflow's proxy (``agent/proxy.py``) reached
the way a jail reaches it (``forward.py``: a loopback port relayed to the proxy's Unix
socket), alternating, in the same run.

    .venv/bin/python bench/egress.py [--runs 7] [--megabytes 8]

Prints a Markdown table and writes the raw figures to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from common import free_port, machine, write_result
from forgeflow.agent import forward
from forgeflow.agent.proxy import EgressProxy
from forgeflow.domain.egress import EgressPolicy, parse_pins

NAME = "index.bench"


def make_wheel(folder: Path, megabytes: int) -> None:
    info = "benchpkg-0.1.dist-info"
    files = {
        "benchpkg/__init__.py": "VALUE = 1\n",
        "benchpkg/blob.bin": os.urandom(megabytes * 1024 * 1024).hex()[: megabytes * 1024 * 1024],
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: benchpkg\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    with zipfile.ZipFile(folder / "benchpkg-0.1-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(folder: Path) -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1])


def start_proxy(sock: Path, port: int) -> None:
    policy = EgressPolicy((NAME,), (port,), parse_pins(f"{NAME}=127.0.0.1", "bench"))
    loop = asyncio.new_event_loop()
    proxy = EgressProxy(policy, sock, lambda *_: None)
    loop.run_until_complete(proxy.start())
    threading.Thread(target=loop.run_forever, daemon=True).start()


def pip(index: str, dest: Path, env: dict[str, str]) -> float:
    argv = [sys.executable, "-m", "pip", "download", "--no-index", "--no-cache-dir"]
    argv += ["--disable-pip-version-check", "-q", "--trusted-host", NAME]
    argv += ["--find-links", index, "-d", str(dest), "benchpkg"]
    started = time.perf_counter()
    subprocess.run(argv, env=env, check=True)
    elapsed = time.perf_counter() - started
    for path in dest.iterdir():
        path.unlink()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--megabytes", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ff-bench-egress-") as tmp:
        root = Path(tmp)
        (root / "index").mkdir()
        (root / "dl").mkdir()
        make_wheel(root / "index", args.megabytes)
        port = serve(root / "index")
        sock = root / "egress.sock"
        start_proxy(sock, port)
        relay = free_port()
        base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        proxied_env = {**base, "http_proxy": f"http://127.0.0.1:{relay}", "no_proxy": ""}
        # The jail's relay, in a process group of its own (its forked copier included).
        relay_argv = [sys.executable, forward.__file__, str(relay), str(sock), "--"]
        relayer = subprocess.Popen([*relay_argv, "sleep", "3600"], start_new_session=True)
        try:
            time.sleep(0.5)
            direct_url, proxied_url = f"http://127.0.0.1:{port}/", f"http://{NAME}:{port}/"
            pip(direct_url, root / "dl", base)  # warm-up: pip's files into the page cache
            direct, proxied = [], []
            for _ in range(args.runs):
                direct.append(pip(direct_url, root / "dl", base))
                proxied.append(pip(proxied_url, root / "dl", proxied_env))
        finally:
            os.killpg(relayer.pid, signal.SIGTERM)
            relayer.wait()
    d, p = statistics.median(direct), statistics.median(proxied)
    result = {
        "machine": machine(),
        "megabytes": args.megabytes,
        "runs": args.runs,
        "direct_s": direct,
        "proxied_s": proxied,
        "ratio": p / d,
    }
    write_result("egress", result)
    print("| pip download (one wheel) | direct, median | through the proxy, median | ratio |")
    print("| --- | --- | --- | --- |")
    print(
        f"| {args.megabytes} MB, {args.runs} runs | {d * 1000:.0f} ms | {p * 1000:.0f} ms "
        f"| {p / d:.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
