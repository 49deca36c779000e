"""A whole mention flow (clone, session, a committing turn, its push, a follow-up)
with every git and bwrap process forgeflow starts on the host recorded by wrappers
first on its PATH: none runs in, or names, a path the agent can write. The agent's
own trees appear only as the top-level bind sources of a jail."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.agentic import Agentic, start_agentic
from tests.support.turns import section, shell_turn

WRAPPER = """#!/bin/sh
# test wrapper: what forgeflow started, then the real program
{{ printf 'cwd=%s\\n' "$(pwd -P)"; printf 'GIT_DIR=%s\\n' "${{GIT_DIR-}}";
  for a in "$@"; do printf 'arg=%s\\n' "$a"; done; printf '\\0\\n'; }} >> {log}
exec {real} "$@"
"""


@pytest.fixture
def watched(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Agentic, Path]]:
    bin_dir, log = tmp_path / "watch-bin", tmp_path / "spawned.log"
    bin_dir.mkdir()
    for name in ("git", "bwrap"):
        real = shutil.which(name)
        assert real is not None
        wrapper = bin_dir / name
        wrapper.write_text(WRAPPER.format(log=log, real=real))
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for agentic in start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch):
        yield agentic, log


def records(log: Path) -> list[dict[str, list[str]]]:
    found = []
    for block in log.read_text().split("\0\n"):
        fields: dict[str, list[str]] = {}
        for line in block.splitlines():
            key, _, value = line.partition("=")
            fields.setdefault(key, []).append(value)
        if fields:
            found.append(fields)
    return found


def test_no_host_process_touches_an_agent_writable_path(watched: tuple[Agentic, Path]) -> None:
    agentic, log = watched
    commit = (
        "echo one > fix.txt && git add fix.txt && git commit -qm Fix"
        " && echo '== sha' && git rev-parse HEAD"
    )
    first = shell_turn(agentic, commit, "@ccweb-bot please fix it")
    sha = section(first.output, "sha").strip()
    assert agentic.gitea.branch_sha("acme", "widget", f"ccweb/issue-{agentic.issue}") == sha
    shell_turn(agentic, "git status --short", "@ccweb-bot and now?")

    root = agentic.ff.settings.resolved_workspace_root
    agent_trees = [root / "default", root / ".sessions", root / ".homes", root / ".homes-read-only"]
    tops = {
        str(root / "default/acme/widget"),
        str(root / ".sessions/default/acme/widget"),
        str(root / ".homes/default/acme/widget"),
    }

    def agent_writable(value: str) -> bool:
        return any(value == str(t) or value.startswith(f"{t}/") for t in agent_trees)

    seen = records(log)
    gits = [r for r in seen if any(a in ("fetch", "push", "bundle") for a in r.get("arg", []))]
    bwraps = [r for r in seen if "--unshare-pid" in r.get("arg", [])]
    assert gits and bwraps, seen  # the flow ran git on the host and jails
    for r in seen:
        (cwd,) = r["cwd"]
        assert not agent_writable(cwd), r
        assert not agent_writable(r["GIT_DIR"][0]), r
        args = r.get("arg", [])
        if r in bwraps:
            # Bind sources: the three top-level trees and forgeflow's own paths only.
            for i, a in enumerate(args[:-1]):
                if a in ("--bind", "--ro-bind") and agent_writable(args[i + 1]):
                    where = args[i + 2]
                    assert args[i + 1] in tops, args[i : i + 3]
                    assert where in (args[i + 1], "/home/agent"), args[i : i + 3]
            continue
        for a in args:
            for part in a.split("="):
                assert not agent_writable(part), (a, r)
