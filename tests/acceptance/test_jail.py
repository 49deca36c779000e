"""The agent's jail, attacked from inside a real turn.

The scripted model has the real `codex app-server` run a shell command in the agent's
shell; the test reads what the command printed (the `function_call_output` codex sends
back to the model), then the agent answers on Gitea as usual, so the task succeeds.
Every attack must find nothing; the agent can still do its work in its worktree."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import threading
import uuid
import zipfile
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.codex_home import API_KEY
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.agentic import GITEA_MCP, Agentic, app_server_groups, start_agentic
from tests.support.cluster import wait_for
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.support.turns import section, shell_turn
from tests.support.world import BOT


def run_in_turn(agentic: Agentic, command: str | Callable[[], str]) -> str:
    """What ``command`` printed in the agent's shell in a real turn (tests.support.turns)."""
    return shell_turn(agentic, command, "@ccweb-bot please check your sandbox").output


def secrets(agentic: Agentic) -> dict[str, str]:
    """What must never be seen inside the jail."""
    token = agentic.ff.settings.gitea_token
    assert token is not None
    return {
        "gitea token": token.get_secret_value(),
        "webhook secret": WEBHOOK_SECRET,
        "admin token": ADMIN_TOKEN,
        "model key": API_KEY,
    }


def children_running(needle: str) -> list[int]:
    """This process's children whose command line holds ``needle``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and needle in cmdline:
            pids.append(int(entry.name))
    return pids


def test_other_processes_and_their_environments_are_out_of_sight(agentic: Agentic) -> None:
    # Forgeflow runs in this test's process (it serves the Gitea tools itself: no Gitea
    # MCP process); the jail's bwrap is its child on the host, running once the turn
    # asks the model.
    watched: list[int] = []

    def command() -> str:
        assert children_running(str(GITEA_MCP)) == []
        (bwrap,) = app_server_groups(agentic.ff.settings.data_dir)
        watched.extend([os.getpid(), bwrap])
        return (
            "echo '== count'; ls /proc | grep -E '^[0-9]+$' | wc -l\n"
            # (the start of each: Codex's -c settings would fill its output limit)
            "echo '== cmdlines'; for f in /proc/[0-9]*/cmdline;"
            " do tr '\\0' ' ' < $f | head -c 160; echo; done\n"
            "echo '== host pids'\n"
            + "".join(f"cat /proc/{pid}/cmdline\n" for pid in watched)
            + "echo '== environ'; cat /proc/*/environ | tr '\\0' '\\n' | sort -u\n"
        )

    out = run_in_turn(agentic, command)
    environ = section(out, "environ")
    # It did read environments: its own processes', with no key at all (the jail's
    # capability, worthless outside, is its only credential, in its own environment).
    assert "HOME=/home/agent" in environ and "KEY=" not in environ, environ
    for what, secret in secrets(agentic).items():
        assert secret not in out, f"the {what} is visible in the jail"
    # Of forgeflow's names only the one it gives every turn: where its environment is.
    ours = [line for line in environ.splitlines() if "FORGEFLOW_" in line]
    assert set(ours) <= {"FORGEFLOW_ENV_DIR=/opt/forgeflow/env"}, ours
    names = {line.split("=", 1)[0] for line in environ.splitlines() if "=" in line}
    others = {n for n in names if n.startswith(("FORGEFLOW", "SCRIPTED_MODEL", "OPENAI"))}
    assert others <= {"FORGEFLOW_ENV_DIR"}, others
    # Its own PID namespace: bwrap's init, Codex and the shell, nothing of the host.
    assert 2 <= int(section(out, "count").strip()) <= 12, out
    cmdlines = section(out, "cmdlines")
    assert "codex" in cmdlines  # it saw its own processes
    own = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    for host in ("forgeflow serve", str(GITEA_MCP), "gitea-mcp", own.strip(), "bin/pytest"):
        assert host not in cmdlines, f"a host process is visible: {host!r}"
    gone = section(out, "host pids").splitlines()
    assert gone == [f"cat: /proc/{pid}/cmdline: No such file or directory" for pid in watched], gone


def test_forgeflow_data_and_the_model_key_are_out_of_reach(agentic: Agentic) -> None:
    data_dir = Path(agentic.ff.settings.data_dir).resolve()
    database = Path(agentic.ff.settings.resolved_database_url.removeprefix("sqlite:///"))
    assert database.is_file()
    # The admin token file of a forgeflow that generated its token (a decoy here: this
    # forgeflow has its token from its settings).
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "admin_token").write_text(ADMIN_TOKEN + "\n")
    key_head, key_tail = API_KEY[:6], API_KEY[6:]
    out = run_in_turn(
        agentic,
        f"echo '== data'; ls -A {data_dir}\n"
        f"echo '== files'; for f in {database} {data_dir}/forgeflow.db {data_dir}/admin_token;"
        f" do cat $f | head -c 100; done; ls {data_dir}/logs {data_dir}/run\n"
        "echo '== auth'; cat ~/.codex/auth.json\n"
        "echo '== env'; env\n"
        # The key is spelled in two halves: Codex keeps the command itself in its rollout
        # under ~/.codex, where a grep for the whole literal would find the command.
        f"echo '== grep'; K={key_head}; grep -rl \"${{K}}{key_tail}\" ~ /tmp;"
        " echo grep-exit=$?\n"
        "echo '== config'; cat ~/.codex/config.toml;"
        " for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/cmdline; done 2>/dev/null"
        " | grep '^model_provider' | sort -u",
    )
    for what, secret in secrets(agentic).items():
        assert secret not in out, f"the {what} is visible in the jail"
    # Only the mount point of the workspaces shows in the data folder; nothing in it.
    assert section(out, "data").split() == ["workspaces"], out
    assert (data_dir / "logs").is_dir() and (data_dir / "run").is_dir()  # on the host
    files = section(out, "files")
    for path in (database, data_dir / "forgeflow.db", data_dir / "admin_token"):
        assert f"{path}: No such file or directory" in files, files
    for folder in ("logs", "run"):
        assert f"cannot access '{data_dir / folder}': No such file or directory" in files
    assert "auth.json: No such file or directory" in section(out, "auth")
    env = section(out, "env")
    assert "HOME=/home/agent" in env and "KEY=" not in env, env
    ours = [line for line in env.splitlines() if "FORGEFLOW_" in line]
    assert ours == ["FORGEFLOW_ENV_DIR=/opt/forgeflow/env"], env  # the only one
    assert section(out, "grep").strip() == "grep-exit=1"  # searched, found nothing
    config = section(out, "config")
    # forgeflow writes no config.toml (Codex may keep its own there, e.g. the projects
    # it trusts): Codex gets forgeflow's settings as -c overrides, no token in a file.
    assert "experimental_bearer_token" not in config, config
    base_urls = re.findall(r'^model_providers\.forgeflow\.base_url="(.*)"$', config, re.M)
    assert len(base_urls) == 1 and re.fullmatch(r"http://127\.0\.0\.1:\d+/model", base_urls[0])
    assert agentic.model.url not in config and "bearer" not in config
    assert 'model_providers.forgeflow.env_key="AGENT_CAPABILITY"' in config, config
    # Its only credential: the capability in its environment, not the model's key.
    assert len(re.findall(r"^AGENT_CAPABILITY=[A-Za-z0-9_-]{40,}$", env, re.M)) == 1, env


def test_another_repositorys_clone_and_worktree_are_out_of_reach(agentic: Agentic) -> None:
    gitea = agentic.gitea
    gitea.add_repo("acme", "other", files={"SECRET.md": "other-repo-secret\n"})
    gitea.set_permission("acme", "other", "alice", "write")
    gitea.set_permission("acme", "other", BOT, "admin")
    issue = gitea.add_issue("acme", "other", title="Other work", author="alice")
    gitea.add_hook("acme", "other", url=agentic.ff.webhook_url, secret=WEBHOOK_SECRET)
    answering_agent(agentic.model)  # the turn on acme/other just answers
    look = gitea.post_comment(
        "acme", "other", issue, author="alice", body="@ccweb-bot look at this"
    )
    delivery = gitea.delivery_of_comment(look["id"])
    assert delivery.status_code == 202, delivery.response
    other_task = json.loads(delivery.response)["taskId"]
    assert agentic.finished(other_task)["task"]["state"] == "succeeded"
    root = agentic.ff.settings.resolved_workspace_root
    clone = root / "default/acme/other"
    worktree = root / ".sessions/default/acme/other" / f"issue-{issue}"
    home = root / ".homes/default/acme/other"
    env = root / ".environments/default/acme/other"  # what its setup leaves its turns
    assert (clone / ".git").exists() and (worktree / "SECRET.md").is_file(), "no other clone"
    assert home.is_dir() and env.is_dir()
    (env / "ENV.md").write_text("other-repo-secret\n")
    out = run_in_turn(
        agentic,
        f"echo '== ls'; ls {clone} {worktree} {home} {env} {root / '.homes'}\n"
        f"echo '== cat'; cat {clone}/.git/config {worktree}/SECRET.md\n"
        f"echo '== acme'; ls -A {root}/default/acme {root}/.sessions/default/acme\n"
        # Everywhere but the read-only system and /proc: the file's name and its text.
        "echo '== find'; find / \\( -path /proc -o -path /usr \\) -prune"
        " -o -path '*acme/other*' -print 2>/dev/null;"
        # (in halves: Codex's rollout under ~/.codex holds this very command)
        ' S=other-repo; grep -rls "${S}-secret" /tmp /home /work /etc /dev /opt 2>/dev/null;'
        " echo find-done",
    )
    listing = section(out, "ls")
    for path in (clone, worktree, home, env, root / ".homes"):
        assert f"cannot access '{path}': No such file or directory" in listing, listing
    cat = section(out, "cat")
    for path in (clone / ".git/config", worktree / "SECRET.md"):
        assert f"{path}: No such file or directory" in cat, cat
    assert "other-repo-secret" not in cat
    assert sorted(section(out, "acme").split()) == sorted(
        [f"{root}/default/acme:", "widget", f"{root}/.sessions/default/acme:", "widget"]
    ), out
    assert section(out, "find").split() == ["find-done"], out


def test_loopback_services_want_a_capability_and_writes_stay_inside(agentic: Agentic) -> None:
    data_dir = Path(agentic.ff.settings.data_dir).resolve()
    codex = Path(__file__).resolve().parents[2] / "tools/node/node_modules"
    probe = f"jail-probe-{uuid.uuid4().hex[:8]}"
    code = "curl -s -o /dev/null -w '%{http_code}\\n'"
    rpc = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    out = run_in_turn(
        agentic,
        # The broker's address is in the jail's Codex config.
        "B=$(for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/cmdline; done 2>/dev/null"
        " | sed -n 's|^model_providers.forgeflow.base_url=\"\\(http://127.0.0.1:[0-9]*\\)/model\"$|\\1|p'"
        " | head -1)\n"
        f"echo '== admin'; {code} {agentic.ff.url}/api/gitea-workflow/tasks;"
        f" {code} -H 'Authorization: Bearer made-up' {agentic.ff.url}/api/gitea-workflow/tasks\n"
        "echo '== broker'; echo \"$B\"\n"
        f"echo '== mcp'; {code} -X POST -H 'Content-Type: application/json' -d '{rpc}' $B/mcp;"
        f" {code} -X POST -H 'Authorization: Bearer made-up' -d '{rpc}' $B/mcp;"
        # the repository's model capability is not a session's Gitea capability
        "K=$AGENT_CAPABILITY;"
        f" {code} -X POST -H \"Authorization: Bearer $K\" -d '{rpc}' $B/mcp\n"
        f"echo '== model'; {code} -X POST -d '{{}}' $B/model/responses;"
        f" {code} -X POST -H 'Authorization: Bearer made-up' -d '{{}}' $B/model/responses\n"
        "echo '== write'\n"
        f"for p in /usr/{probe} /opt/{probe} {codex}/{probe}; do touch $p; done\n"
        f"for p in /{probe} /etc/{probe} {data_dir}/{probe}; do touch $p; done",
    )
    # The default network (the egress proxy): the host's loopback is not the jail's,
    # so forgeflow's own port cannot even be reached (curl's 000).
    assert section(out, "admin").split() == ["000", "000"], out
    broker = section(out, "broker").strip()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", broker) and broker != agentic.ff.url
    assert section(out, "mcp").split() == ["401", "401", "401"], out
    assert section(out, "model").split() == ["401", "401"], out
    write = section(out, "write")
    assert f"touch: cannot touch '/usr/{probe}': Read-only file system" in write, write
    # /opt holds the forwarder (/opt/forgeflow/forward.py), so it exists, read-only.
    assert f"touch: cannot touch '/opt/{probe}': Read-only file system" in write, write
    assert f"touch: cannot touch '{codex}/{probe}': Read-only file system" in write, write
    # The jail's root (bwrap's tmpfs with the mount points) is read-only as well. (The
    # data folder of this test lies under /tmp, which in the jail is its private tmpfs:
    # whatever lands there stays in the jail, as the host check below shows.)
    for path in (f"/{probe}", f"/etc/{probe}"):
        assert f"touch: cannot touch '{path}': Read-only file system" in write, write
    for host in (
        Path("/usr", probe),
        Path("/opt", probe),
        codex / probe,
        Path("/", probe),
        Path("/etc", probe),
        data_dir / probe,
    ):
        assert not host.exists(), f"the jail wrote {host} on the host"


def make_wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel of package ``name`` (version 0.1)."""
    info = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: forgeflow-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def package_index(tmp_path: Path) -> Iterator[str]:
    """A folder of wheels served on loopback (pip's ``--find-links`` reads its listing)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    make_wheel(folder, "jailpkg")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{INDEX_NAME}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


INDEX_NAME = "jail-index.test"  # the operator's "internal mirror", on loopback


@pytest.fixture
def agentic_with_index(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    package_index: str,
) -> Iterator[Agentic]:
    """The default network (the egress proxy) with the index allow-listed by name."""
    port = package_index.rstrip("/").rsplit(":", 1)[1]
    yield from start_agentic(
        gitea,
        model,
        tmp_path,
        sqlite_url,
        monkeypatch,
        egress_allow=INDEX_NAME,
        egress_ports=port,
        egress_resolve=f"{INDEX_NAME}=127.0.0.1",
    )


def test_the_agent_still_works_in_its_worktree_home_and_tmp(
    agentic_with_index: Agentic, package_index: str
) -> None:
    agentic = agentic_with_index
    root = agentic.ff.settings.resolved_workspace_root
    worktree = root / ".sessions/default/acme/widget" / f"issue-{agentic.issue}"
    home = root / ".homes/default/acme/widget"
    scratch = f"jail-scratch-{uuid.uuid4().hex[:8]}"
    out = run_in_turn(
        agentic,
        "echo '== cwd'; pwd\n"
        "echo '== commit'; echo fixed > fix.txt && git add fix.txt &&"
        " git -c user.email=agent@example.invalid -c user.name=agent commit -q -m 'Fix it' &&"
        " git log -1 --format=%s\n"
        "echo '== test'; python3 -c 'assert 1 + 1 == 2' && echo tests-ok\n"
        f"echo '== write'; echo in-home > ~/{scratch} && echo in-tmp > /tmp/{scratch} &&"
        f" cat ~/{scratch} /tmp/{scratch}\n"
        "echo '== pip'; python3 -m pip install --user --break-system-packages --no-index"
        f" --disable-pip-version-check --trusted-host {INDEX_NAME} --find-links {package_index}"
        " jailpkg > /tmp/pip.log 2>&1"
        " || cat /tmp/pip.log\n"
        "echo '== import'; cd / && python3 -c 'import jailpkg; print(\"imported\", jailpkg.VALUE)'",
    )
    assert section(out, "cwd").strip() == str(worktree), out
    assert section(out, "commit").strip() == "Fix it", out
    assert section(out, "test").strip() == "tests-ok", out
    assert section(out, "write").split() == ["in-home", "in-tmp"], out
    assert section(out, "pip").strip() == "", out
    assert section(out, "import").strip() == "imported 42", out
    # On the host: the commit is in the worktree, the package and the file in the
    # repository's private home, and the jail's /tmp was its own.
    log = subprocess.run(
        ["git", "-C", str(worktree), "log", "-1", "--format=%s"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert log.stdout.strip() == "Fix it"
    assert (home / scratch).read_text() == "in-home\n"
    assert list(home.glob(".local/lib/python3*/site-packages/jailpkg/__init__.py"))
    assert not Path("/tmp", scratch).exists()


def test_the_agent_cannot_steer_forgeflows_git_on_the_host(
    agentic: Agentic, tmp_path: Path
) -> None:
    """forgeflow's own git never runs in the clone the agent works in (it works in its
    mirror; git on the clone runs in the jail). The agent plants commands for it: a
    filter driver in the clone's config, a hook, alternates, attributes, and a worktree
    ``.git`` file pointing at a git folder of its own whose config has the filter.
    Nothing runs on the host; the hijacked worktree blocks the session."""
    mark = tmp_path / "forgeflow-ran-the-agents-command"
    clone = Path(agentic.ff.settings.resolved_workspace_root) / "default/acme/widget"
    evil = f"touch {mark}"
    out = run_in_turn(
        agentic,
        f"echo '== config'; git config filter.x.clean '{evil}' && echo written\n"
        f"echo '== hook'; echo '{evil}' > {clone}/.git/hooks/post-checkout && echo written\n"
        f"echo '== alternates'; echo /srv > {clone}/.git/objects/info/alternates && echo written\n"
        f"echo '== attributes'; echo '* filter=x' > {clone}/.git/info/attributes && echo written\n"
        "echo '== hijack'; git init -q fake && git -C fake config filter.x.clean"
        f" '{evil}' && echo '* filter=x' > .gitattributes && touch new.txt"
        ' && echo "gitdir: $PWD/fake/.git" > .git && echo hijacked',
    )
    # The clone is the agent's: its writes land (no read-only sub-binds any more).
    for name in ("config", "hook", "alternates", "attributes"):
        assert section(out, name).strip() == "written", out
    assert "hijacked" in section(out, "hijack"), out
    # The next mention: forgeflow prepares the session (git in the jail) and finds the
    # worktree is not its own any more; nothing ran on the host.
    answering_agent(agentic.model)
    again = agentic.mention("@ccweb-bot again")
    detail = wait_for(
        lambda: (d := agentic.detail(again))["task"]["state"] == "blocked_workspace" and d,
        timeout=60,
        what="the hijacked session blocks",
    )
    blocked = [e for e in detail["audit"] if e["toState"] == "blocked_workspace"]
    # The clone's check (in the jail) comes first: with its attributes' filter on every
    # file, git in the jail sees the clone as changed.
    assert blocked[0]["metadata"]["reason"] == "modified", blocked
    assert not mark.exists(), "a command the agent planted ran on the host"


def test_without_network_the_jail_reaches_only_forgeflows_brokers(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FORGEFLOW_AGENT_NETWORK=off: the turn still reaches the model and the Gitea tools
    (through the forwarder to the brokers' socket), and nothing else: not forgeflow's
    own port, not Gitea, not the model server directly."""
    for world in start_agentic(
        gitea, model, tmp_path, sqlite_url, monkeypatch, agent_network="off"
    ):
        code = "curl -s -m 3 -o /dev/null -w '%{http_code}\\n'"
        out = run_in_turn(
            world,
            f"echo '== forgeflow'; {code} {world.ff.url}/healthz; echo exit=$?\n"
            f"echo '== gitea'; {code} {gitea.url}/api/v1/version; echo exit=$?\n"
            f"echo '== model'; {code} {model.url}/responses; echo exit=$?\n"
            "echo '== interfaces'; ls /sys/class/net 2>/dev/null || cat /proc/net/dev",
        )
        for name in ("forgeflow", "gitea", "model"):
            lines = section(out, name).split()
            # curl prints 000 and exits 7 (could not connect): there is no route out.
            assert lines[0] == "000" and lines[-1] != "exit=0", out
        interfaces = section(out, "interfaces")
        assert "lo" in interfaces and "eth" not in interfaces and "ens" not in interfaces, out
        # The model was reached through the pass-through, the answer through the tools.
        assert world.bot_comments()[-1]["body"].rstrip().endswith("kind=final -->")
