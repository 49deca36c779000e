"""A setup run's jail (issue #26) against real bubblewrap and git: it holds an export of
the default branch and folders of its own, never the agent's clone or home, and
another repository's environment folder is not in it.

- the setup's cwd is a fresh export of the commit (no ``.git``, none of the clone's
  files), its home is not the agent's (no dotfile the agent planted), and nothing of
  the agent's or of another repository is anywhere in its jail;
- what it leaves in the export (links to ``/``, a folder it made unreadable) is
  removed in a jail: the next run starts from the tree alone, and the host's files the
  links point at are untouched;
- what it writes to ``$FORGEFLOW_ENV_DIR`` lands in the repository's environment
  folder, emptied before each run and once the setup script is gone; its home is
  kept for the next setup run.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping
from pathlib import Path

from forgeflow.agent.jail import HOST_SYSTEM
from forgeflow.agent.oneshot import JailRunner
from forgeflow.domain.environment import Environment
from forgeflow.domain.ids import RepoRef
from forgeflow.tasks.setup_run import SetupFolders, SetupRunner
from forgeflow.workspace import mirror
from forgeflow.workspace.git import GitRunner

A = RepoRef("acme", "widget")
B = RepoRef("acme", "gadget")
SECRET = "isolated-setup-s3cr3t-77ab10"

SCRIPT = """
echo "pwd:$(pwd) home:$HOME env:$FORGEFLOW_ENV_DIR"
echo "entries:$(ls -A | tr '\\n' ' ')"
test -e .git && echo has-git || echo no-git
cat "$HOME/.npmrc" 2>/dev/null | sed 's/^/npmrc:/'
find / -path /proc -prune -o \\( -name b-marker -o -name agent-clone-file \\
  -o -name .agent-dotfile -o -name cache-file \\) -print 2>/dev/null | sed 's/^/seen:/'
test -e "$HOME/cache-file" && echo home-kept
echo "env-entries:$(ls -A "$FORGEFLOW_ENV_DIR" | tr '\n' ' ')"
echo "made:${#SETUP_TOKEN}" > "$FORGEFLOW_ENV_DIR/a-result"
ln -s / "$FORGEFLOW_ENV_DIR/root-link"
mkdir -p "$FORGEFLOW_ENV_DIR/locked/x" && chmod 000 "$FORGEFLOW_ENV_DIR/locked"
echo cached > "$HOME/cache-file"
ln -s / escape; ln -s "$FORGEFLOW_ENV_DIR" envlink
mkdir -p locked/inner && touch locked/inner/f && chmod 000 locked
echo done
"""


def commit_tree(path: Path) -> str:
    path.mkdir()
    (path / "ci").mkdir()
    (path / "Makefile").write_text("all:\n\t@echo make:gitea\n")
    (path / "ci" / "setup.sh").write_text(SCRIPT)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(path)], check=True)
    subprocess.run([*git, "-C", str(path), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(path), "commit", "-qm", "tree"], check=True)
    head = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return head.stdout.strip()


def test_the_setup_runs_on_an_export_with_folders_of_its_own(tmp_path: Path) -> None:
    spawned: list[list[str]] = []

    def seen(argv: list[str], _env: Mapping[str, str], _cwd: str | None) -> None:
        spawned.append(argv)

    runner = JailRunner(tmp_path / "ws", jailed=True, on_spawn=seen)
    source = tmp_path / "source"
    head = commit_tree(source)
    git = GitRunner(str(tmp_path / "git"), None)

    async def archive(out: Path) -> None:
        await mirror.archive(git, str(source), head, out)

    # The agent's clone and home, with what it planted; another repository's folder.
    agent = runner.paths(A)
    agent.make(runner.root)
    (agent.home / ".npmrc").write_text("script-shell=/home/agent/steal.sh\n")
    (agent.home / ".agent-dotfile").write_text("planted\n")
    (agent.clone / "agent-clone-file").write_text("planted\n")
    other = SetupFolders.of(runner.root, B)
    other.make(runner.root)
    (other.env / "b-marker").write_text("b's\n")
    setups = SetupRunner(runner, None)
    env = Environment(setup_script="ci/setup.sh")

    def run() -> str:
        done = asyncio.run(
            setups.run(env, {"SETUP_TOKEN": SECRET}, HOST_SYSTEM, A, (False, SCRIPT), archive)
        )
        assert done.code == 0, done.log
        return done.log

    first, second = run(), run()
    ours = setups.folders(A)
    for log in (first, second):
        assert f"pwd:{ours.export} home:/home/agent env:/opt/forgeflow/env" in log, log
        # Only the commit's tree: nothing the last run left (links, the locked folder).
        assert "entries:Makefile ci \n" in log and "no-git" in log, log
        assert "npmrc:" not in log and "done" in log, log
        assert "env-entries:\n" in log, log  # emptied of the last run's results
    # find sees the jail (the setup's own kept home, the control), and nothing else.
    assert "seen:" not in first
    assert [line for line in second.splitlines() if line.startswith("seen:")] == [
        "seen:/home/agent/cache-file"
    ], second
    assert "home-kept" not in first and "home-kept" in second
    assert (ours.env / "a-result").read_text() == f"made:{len(SECRET)}\n"
    assert (ours.home / "cache-file").read_text() == "cached\n"
    assert list(ours.export.iterdir()) == []  # emptied after the run, in a jail
    assert sorted(p.name for p in ours.env.iterdir()) == ["a-result", "locked", "root-link"]
    # The script gone from the environment: its folder is emptied (links not followed).
    asyncio.run(setups.clear(A))
    assert list(ours.env.iterdir()) == [] and Path("/usr/bin").is_dir()
    assert sorted(p.name for p in other.env.iterdir()) == ["b-marker"]
    assert sorted(p.name for p in agent.home.iterdir()) == [".agent-dotfile", ".npmrc"]
    assert sorted(p.name for p in agent.clone.iterdir()) == ["agent-clone-file"]
    # No jail of the setup binds a folder of the agent's or of the other repository.
    assert spawned
    for argv in spawned:
        for path in (agent.home, agent.clone, agent.sessions, other.env, other.home):
            assert str(path) not in argv, argv


UNJAILED = """
echo "pwd:$(pwd) env:$FORGEFLOW_ENV_DIR"
echo "entries:$(ls -A | tr '\\n' ' ')"
echo "token:${#SETUP_TOKEN}"
echo made > "$FORGEFLOW_ENV_DIR/result"
ln -s / "$FORGEFLOW_ENV_DIR/root-link"
echo left > stray
"""


def test_without_a_jail_the_setup_runs_on_the_export_with_host_paths(tmp_path: Path) -> None:
    """FORGEFLOW_SANDBOX=none (one trusted user): the same export and folders, named by
    their host paths; what a run left is removed before the next, links not followed."""
    runner = JailRunner(tmp_path / "ws", jailed=False)
    source = tmp_path / "source"
    head = commit_tree(source)
    git = GitRunner(str(tmp_path / "git"), None)

    async def archive(out: Path) -> None:
        await mirror.archive(git, str(source), head, out)

    setups = SetupRunner(runner, None)
    env = Environment(setup_script="ci/setup.sh")
    ours = setups.folders(A)

    def run() -> str:
        done = asyncio.run(
            setups.run(env, {"SETUP_TOKEN": SECRET}, HOST_SYSTEM, A, (False, UNJAILED), archive)
        )
        assert done.code == 0, done.log
        return done.log

    for log in (run(), run()):
        assert f"pwd:{ours.export} env:{ours.env}" in log, log
        assert "entries:Makefile ci \n" in log, log  # no `stray` from the run before
        assert f"token:{len(SECRET)}" in log and SECRET not in log, log
    assert (ours.env / "result").read_text() == "made\n"
    assert list(ours.export.iterdir()) == []
    asyncio.run(setups.clear(A))
    assert list(ours.env.iterdir()) == [] and Path("/usr/bin").is_dir()
