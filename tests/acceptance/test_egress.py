"""The jail's network in the default mode (``FORGEFLOW_AGENT_NETWORK=proxy``), attacked
from inside a real turn.

The jail has only its own loopback; forgeflow's egress proxy, outside, is its only way
out. The agent tries every way to the host's services (forgeflow's PostgreSQL, Redis,
MariaDB, NATS, AMQP, MQTT), canary listeners on the host's loopback and on its
non-loopback address, the metadata address, private ranges, a name that resolves to
loopback and the IP-literal spellings of 127.0.0.1: directly and through the proxy.
Nothing reaches a canary, every proxied attempt is refused and recorded for the task,
and the answer names them. An allow-listed host works unasked through the proxy, for
curl (plain and CONNECT), pip, npm and git. A repository's setup script (#26) has the
same network: its own egress proxy under ``proxy``, nothing under ``off``."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.acceptance.test_jail import make_wheel
from tests.support.agentic import start_agentic
from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.turns import section, shell_turn

HOST_SERVICES = (5432, 6379, 3306, 4222, 5672, 1883)
INDEX = "index.test"  # allow-listed exactly, pinned to 127.0.0.1
REBIND = "rebind.test"  # allowed by the wildcard only, pinned to 127.0.0.1


class Canary:
    """A listener that counts the connections it accepts."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def local_address() -> str:
    """The host's first non-loopback IPv4 address."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True)
    found = [a for a in out.stdout.split() if "." in a and not a.startswith("127.")]
    assert found, "this host has no non-loopback IPv4 address"
    return found[0]


def make_index(folder: Path) -> None:
    """A wheel for pip, a packument for npm, a bare repository for git (dumb HTTP)."""
    make_wheel(folder, "jailpkg")
    (folder / "npm").mkdir()
    packument = {
        "name": "jailpkg",
        "dist-tags": {"latest": "1.0.0"},
        "versions": {
            "1.0.0": {
                "name": "jailpkg",
                "version": "1.0.0",
                "dist": {"tarball": f"http://{INDEX}/npm/jailpkg-1.0.0.tgz"},
            }
        },
    }
    (folder / "npm" / "jailpkg").write_text(json.dumps(packument))
    work = folder / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "README").write_text("served through the proxy\n")
    subprocess.run([*git, "-C", str(work), "add", "."], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    bare = folder / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[int]:
    folder = tmp_path / "index"
    folder.mkdir()
    make_index(folder)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def ui_page(base: str, path: str) -> str:
    with httpx.Client(base_url=base, follow_redirects=True) as ui:
        login = ui.get("/ui/login")
        token = login.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        ui.post("/ui/login", data={"token": ADMIN_TOKEN, "operator": "ops", "csrf": token})
        page = ui.get(path)
    assert page.status_code == 200
    return page.text


def attack_script(loop: Canary, loop6: Canary, outer: Canary, outer_host: str) -> str:
    p, p6, po = loop.port, loop6.port, outer.port
    direct = [f"127.0.0.1:{port}" for port in (*HOST_SERVICES, p)]
    direct += [f"[::1]:{p6}", f"{outer_host}:{po}", "169.254.169.254:80", "10.0.0.1:80"]
    proxied = [
        f"127.0.0.1:{HOST_SERVICES[0]}",
        f"localhost:{p}",
        f"[::1]:{p6}",
        f"2130706433:{p}",
        f"0x7f000001:{p}",
        f"127.1:{p}",
        f"[::ffff:127.0.0.1]:{p}",
        f"{REBIND}:{p}",
        f"{outer_host}:{po}",
        "169.254.169.254:80",
        "[fd00:ec2::254]:80",
        "10.0.0.1:80",
        "192.168.1.1:80",
        "100.64.0.1:80",
    ]
    tcp = (
        "import socket,sys\n"
        "for t in sys.argv[1:]:\n"
        "    h,_,p=t.rpartition(':')\n"
        "    try:\n"
        "        socket.create_connection((h.strip('[]'),int(p)),timeout=3).close()\n"
        "        print(t,'open')\n"
        "    except OSError as e: print(t,'closed',type(e).__name__)\n"
    )
    # --noproxy '': NO_PROXY names loopback (the brokers), so the agent overrides it to
    # put loopback targets to the proxy too.
    curl = "curl --noproxy '' -s -m 5 -o /dev/null"
    lines = [
        "echo '== env'; env | grep -i _proxy | sort",
        f"cat > /tmp/tcp.py <<'PY'\n{tcp}PY",
        f"echo '== direct'; python3 /tmp/tcp.py {' '.join(direct)}",
        "echo '== proxied'",
        *[f"echo {t} $({curl} -w '%{{http_code}}' http://{t}/)" for t in proxied],
        "echo '== connect'",
        *[f"echo {t} $({curl} -p -w '%{{http_connect}}' http://{t}/)" for t in proxied[1:8]],
        "echo '== python'; NO_PROXY= no_proxy= python3 -c \"import urllib.request as u\n"
        f"try: u.urlopen('http://localhost:{p}/', timeout=5)\n"
        "except Exception as e: print(getattr(e, 'code', e))\"",
    ]
    return "\n".join(lines)


def allowed_script(port: int) -> str:
    url = f"http://{INDEX}:{port}"
    return "\n".join(
        [
            f"echo '== plain'; curl -s -m 5 {url}/npm/jailpkg | head -c 18; echo",
            f"echo '== tunnel'; curl -s -m 5 -p {url}/npm/jailpkg | head -c 18; echo",
            "echo '== pip'; python3 -m pip download --no-index --disable-pip-version-check"
            f" --trusted-host {INDEX} --find-links {url}/ -d /tmp/dl jailpkg > /tmp/pip.log 2>&1"
            " && ls /tmp/dl"
            " || cat /tmp/pip.log",
            f"echo '== npm'; npm view jailpkg version --registry {url}/npm/"
            " --no-update-notifier 2>&1 | tail -3",
            f"echo '== git'; git clone -q {url}/repo.git /tmp/clone 2>&1; cat /tmp/clone/README",
        ]
    )


def test_the_jail_reaches_no_host_service_and_allow_listed_hosts_through_the_proxy(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    index: int,
) -> None:
    outer_host = local_address()
    loop, loop6, outer = Canary("127.0.0.1"), Canary("::1"), Canary(outer_host)
    ports = ",".join(str(x) for x in (80, 443, index, loop.port, loop6.port, outer.port))
    settings = {
        # "*": every name passes the allow-list, so only the address check stops them.
        "egress_allow": f"*,{INDEX}",
        "egress_ports": ports,
        "egress_resolve": f"{INDEX}=127.0.0.1,{REBIND}=127.0.0.1",
    }
    for world in start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch, **settings):
        turn = shell_turn(world, attack_script(loop, loop6, outer, outer_host))
        out = turn.output
        assert "HTTPS_PROXY=http://127.0.0.1:" in section(out, "env"), out
        assert "NO_PROXY=127.0.0.1,localhost,::1" in section(out, "env"), out
        direct = section(out, "direct").strip().splitlines()
        assert len(direct) == len(HOST_SERVICES) + 5, out
        assert all(" closed " in line for line in direct), out
        for name in ("proxied", "connect"):
            answers = section(out, name).strip().splitlines()
            assert answers and all(line.split()[-1] == "403" for line in answers), out
        assert section(out, "python").strip() == "403", out
        assert (loop.accepted, loop6.accepted, outer.accepted) == (0, 0, 0)
        # Recorded for the task: one row of the turn, by host and port.
        rows = [e for e in turn.detail["audit"] if e["action"] == "egress.blocked"]
        assert len(rows) == 1, turn.detail["audit"]
        seen = {(r["host"], r["port"]) for r in rows[0]["metadata"]["requests"]}
        for target in (("localhost", loop.port), (REBIND, loop.port), ("169.254.169.254", 80)):
            assert target in seen, seen
        assert ("fd00:ec2::254", 80) in seen and ("::1", loop6.port) in seen, seen
        assert rows[0]["metadata"]["total"] >= 14 + 7 + 1, rows
        # The answer names them, and the task page lists them.
        answer = world.bot_comments()[-1]["body"]
        assert "forgeflow: the sandbox's network policy refused" in answer, answer
        page = ui_page(world.ff.url, f"/ui/tasks/{turn.task_id}")
        assert "Network requests refused" in page and REBIND in page

        done = shell_turn(world, allowed_script(index)).output
        assert section(done, "plain").strip() == '{"name": "jailpkg"', done
        assert section(done, "tunnel").strip() == '{"name": "jailpkg"', done
        assert section(done, "pip").strip() == "jailpkg-0.1-py3-none-any.whl", done
        assert section(done, "npm").strip() == "1.0.0", done
        assert section(done, "git").strip() == "served through the proxy", done


SETUP_FETCH = (
    'echo "== allowed"; curl -s -m 5 http://{index}:{port}/npm/jailpkg | head -c 18; echo\n'
    'echo "== refused"; curl -s -m 5 -o /dev/null -w "%{{http_code}}"'
    " http://blocked.test:{port}/; echo\n"
    'echo "== direct"; curl -s -m 5 --noproxy "*" http://127.0.0.1:{port}/ >/dev/null;'
    ' echo "exit:$?"\n'
)
ENV = "/api/gitea-workflow/repos/default:acme/widget/environment"


def _setup_log(world: Any, port: int) -> str:
    """Declare a setup script that fetches from the index, run a turn, its setup log."""
    script = SETUP_FETCH.format(index=INDEX, port=port)
    world.gitea.push_branch("acme", "widget", "main", {"ci/fetch.sh": script})
    with world.ff.admin() as admin:
        body = {"requestId": "env-1", "environment": {"setupScript": "ci/fetch.sh"}}
        assert admin.put(ENV, json=body).status_code == 200
    shell_turn(world, "echo turn")
    with world.ff.admin() as admin:
        setup = admin.get(ENV).json()["setup"]
    assert setup["state"] == "ready", setup
    return str(setup["log"])


@pytest.mark.parametrize("network", ["proxy", "off"])
def test_a_setup_script_has_the_jails_network(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    index: int,
    network: str,
) -> None:
    settings = {
        "agent_network": network,
        "egress_allow": INDEX,
        "egress_ports": f"80,443,{index}",
        "egress_resolve": f"{INDEX}=127.0.0.1",
    }
    for world in start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch, **settings):
        log = _setup_log(world, index)
        # The host's loopback is never reached directly: the setup's jail has its own.
        assert section(log, "direct").splitlines()[0] == "exit:7", log
        if network == "proxy":
            assert section(log, "allowed").strip() == '{"name": "jailpkg"', log
            assert section(log, "refused").splitlines()[0] == "403", log
            # What the proxy refused is in the setup's log, by host and port.
            assert f"refused blocked.test:{index}" in log, log
        else:  # no proxy, no DNS: nothing is fetched
            assert section(log, "allowed").strip() == "", log
            assert section(log, "refused").splitlines()[0] == "000", log
