"""A pipeline script step and the session cleanup on a clone the agent made hostile.

In a real turn the agent plants, in the repository's clone and in its session worktree,
git configuration that runs commands (core.fsmonitor, a filter driver with
.gitattributes, include.path, includeIf, a replaced ``.git``, a worktree ``.git`` and
``commondir`` pointing at copies it wrote), hooks, a ``Makefile`` whose ``$(shell)``
runs even under ``make -n``, and symlinks to folders of the host. Then a
``pipeline.bashScript`` step (``git ls-files``, ``make -n``, ``cat`` through the
symlink) and ``repos.cleanup`` run. Every planted command appends to a canary file
outside the jail if it runs on the host; the step's output must be what the jailed
commands printed, and the cleanup must remove the session and nothing else."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import repo_sessions, repo_workspace, session_worktree
from tests.support.agentic import Agentic
from tests.support.cluster import wait_for
from tests.support.turns import section, shell_turn

YAML = {"Content-Type": "application/yaml"}

TEMPLATE = """
key: hostile_clone
name: A script step and the cleanup on a hostile clone
enabled: true
inputs: [{name: issue, type: integer, required: true}]
nodes:
  - {id: start, kind: trigger}
  - id: script
    kind: listen
    bodyKey: pipeline.bashScript
    outputKey: script
    inputs: {repo: acme/widget}
    extras:
      timeoutSeconds: 60
      script: |
        echo "== host"; hostname
        echo "== ls-files"; git ls-files 2>&1
        echo "== make"; make -n 2>&1
        echo "== link"; cat hostlink/secret.txt 2>&1
        echo "== env"; env | sort
        echo "== end"
  - id: cleanup
    kind: listen
    bodyKey: repos.cleanup
    outputKey: cleanup
    inputs: {resource: "default:acme/widget:issue:{{ inputs.issue }}"}
edges:
  - {from: start, to: script}
  - {from: script, to: cleanup}
triggers: [{type: manual}]
"""


def _file(path: str, text: str) -> str:
    return f"cat > {path} <<'PLANT'\n{text}PLANT\n"


def hostile(canary: Path, clone: str, sessions: str, host: Path, other: Path) -> str:
    """The agent's shell command. The clone's ``.git`` is replaced by a copy with a
    hostile config and hooks (its own session, issue-1, reads them); a second session,
    issue-7, gets a ``.git`` and ``commondir`` pointing at copies the agent wrote."""
    run = f"echo $0 >> {canary}/ran"  # on the host this lands in the canary
    config = f"""[core]
\tfsmonitor = "sh -c '{run}' fsmonitor"
\thooksPath = {sessions}/evil-hooks
[filter "evil"]
\tclean = sh -c '{run}' filter-clean
\tsmudge = sh -c '{run}' filter-smudge
[include]
\tpath = {sessions}/evil.inc
[includeIf "gitdir:/"]
\tpath = {sessions}/evil.inc
"""
    make_run = run.replace("$0", "$$0")
    makefile = f"X := $(shell sh -c '{make_run}' make-shell)\nall:\n\t{make_run}\n"
    hooks = "".join(
        _file(f"{sessions}/evil-hooks/{h}", f"#!/bin/sh\nsh -c '{run}' hook-{h}\n")
        for h in ("pre-commit", "post-checkout", "reference-transaction", "post-index-change")
    )
    plants = "".join(
        _file(f"{d}/.gitattributes", "* filter=evil\n")
        + _file(f"{d}/Makefile", makefile)
        + f"ln -s {host} {d}/hostlink\nln -s {other} {d}/other-repo\n"
        for d in (clone, f"{sessions}/issue-1", f"{sessions}/issue-7")
    )
    inc = _file(f"{sessions}/evil.inc", f"[core]\n\tpager = sh -c '{run}' pager\n")
    evil = _file(f"{clone}/.git/config.evil", config)
    process = _file(
        f"{sessions}/evil-process", f"[filter \"evil\"]\n\tprocess = sh -c '{run}' filter-process\n"
    )
    excluded = "printf '%s\\n' .gitattributes Makefile hostlink other-repo >> "
    return f"""set -e
git -C {clone} worktree add -q -b keep-me {sessions}/issue-7 HEAD
mkdir -p {sessions}/evil-hooks
{hooks}chmod +x {sessions}/evil-hooks/*
{inc}
mv {clone}/.git {clone}/.git-orig
cp -a {clone}/.git-orig {clone}/.git
{evil}cat {clone}/.git/config.evil >> {clone}/.git/config
cp {sessions}/evil-hooks/* {clone}/.git/hooks/
{excluded}{clone}/.git/info/exclude
cp -a {clone}/.git {sessions}/evil-common
{process}cat {sessions}/evil-process >> {sessions}/evil-common/config
cp -a {clone}/.git/worktrees/issue-7 {sessions}/evil-admin
echo {sessions}/evil-common > {sessions}/evil-admin/commondir
echo "gitdir: {sessions}/evil-admin" > {sessions}/issue-7/.git
{plants}echo planted
"""


def _run(agentic: Agentic, issue: int) -> dict[str, Any]:
    with agentic.ff.admin() as admin:
        r = admin.post(
            "/api/pipelines/templates/hostile_clone/runs",
            json={"requestId": f"go-{issue}", "inputs": {"issue": issue}},
        )
        assert r.status_code in (200, 201), r.text
        run_id = r.json()["run"]["runId"]

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
            return run if run["status"] != "running" else None

        found: dict[str, Any] = wait_for(ended, timeout=90, what="the pipeline run ends")
        return found


def _check_script(out: str, canary: Path, bare: Path, token: str) -> None:
    """The step's output is the jail's: its hostname, the repository's files as git in
    the jail listed them (the planted fsmonitor ran there, where the canary's folder
    is not), make's plan with its $(shell) jailed too, no host folder behind the
    symlink, and only the FF_ values and the jail's fixed list in its environment."""
    assert section(out, "host").strip() == "forgeflow-agent", out
    tracked = subprocess.run(
        ["git", f"--git-dir={bare}", "ls-tree", "-r", "--name-only", "main"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    listed = section(out, "ls-files")
    assert tracked.split() and all(name in listed for name in tracked.split()), out
    assert f"fsmonitor: 1: cannot create {canary}/ran: Directory nonexistent" in listed, out
    made = section(out, "make")
    assert f"echo $0 >> {canary}/ran" in made, out  # the plan, not run
    assert f"make-shell: 1: cannot create {canary}/ran" in made, out
    assert "No such file or directory" in section(out, "link"), out
    assert "host-secret-4711" not in out and token not in out
    env = dict(line.split("=", 1) for line in section(out, "env").splitlines() if "=" in line)
    assert env["FF_REPO"] == "acme/widget" and env["HOME"] == "/home/agent", env
    assert not [k for k in env if k.startswith(("FORGEFLOW", "SCRIPTED", "OPENAI"))], env


def test_a_script_step_and_the_cleanup_run_jailed_on_a_hostile_clone(
    agentic: Agentic, tmp_path: Path
) -> None:
    root = str(agentic.ff.settings.resolved_workspace_root)
    repo = RepoRef("acme", "widget")
    resource = ResourceRef(repo, ResourceKind.ISSUE, agentic.issue)
    assert agentic.issue == 1  # its worktree is issue-1
    clone, sessions = repo_workspace(root, repo), repo_sessions(root, repo)
    canary = tmp_path / "canary"
    canary.mkdir()
    host = tmp_path / "host-data"
    host.mkdir()
    (host / "secret.txt").write_text("host-secret-4711\n")
    other = Path(root) / "default" / "acme" / "other"
    other.mkdir(parents=True)
    (other / "file.txt").write_text("another repository\n")
    token = agentic.ff.settings.gitea_token
    assert token is not None
    bare = agentic.gitea.git_root / "acme" / "widget.git"

    turn = shell_turn(agentic, hostile(canary, clone, sessions, host, other))
    assert "planted" in turn.output, turn.output
    with agentic.ff.admin() as admin:
        r = admin.post("/api/pipelines/templates", content=TEMPLATE, headers=YAML)
        assert r.status_code == 201, r.text

    # issue-1 reads the clone's hostile config: the step runs jailed, the cleanup
    # removes that session's folder and bookkeeping, and nothing else.
    first = _run(agentic, 1)
    assert first["status"] == "succeeded", "\n".join(map(str, first["steps"]))
    _check_script(first["state"]["script"]["stdout"], canary, bare, token.get_secret_value())
    assert first["state"]["cleanup"] == {"resourceKey": resource.key, "removed": True}
    assert not Path(session_worktree(root, resource)).exists()
    assert not Path(clone, ".git", "worktrees", "issue-1").exists()
    assert Path(clone, ".git", "worktrees", "issue-7").is_dir()
    assert Path(sessions, "issue-7", "README.md").is_file()

    # issue-7's .git leads to the agent's copies: not provably our worktree, so the
    # cleanup refuses and leaves it for an administrator; the step still runs jailed.
    second = _run(agentic, 7)
    assert second["status"] == "failed"
    steps = {s["stepId"]: s for s in second["steps"]}
    assert steps["cleanup"]["errorCode"] == "workspace_dirty", steps["cleanup"]
    _check_script(second["state"]["script"]["stdout"], canary, bare, token.get_secret_value())
    assert Path(sessions, "issue-7", "README.md").is_file()

    # Nothing planted ran on the host, and nothing outside the repository was touched.
    assert not (canary / "ran").exists(), (canary / "ran").read_text()
    assert (host / "secret.txt").read_text() == "host-secret-4711\n"
    assert (other / "file.txt").read_text() == "another repository\n"
    assert Path(sessions, "evil-common", "config").is_file()  # the agent's own files stay
