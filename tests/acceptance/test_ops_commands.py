"""`forgeflow doctor` with each dependency broken in turn, and `forgeflow gitea connect`
against the emulator's hook API — real processes, real sockets."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow.domain.environment import Environment
from forgeflow.store import Store, environments
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import WEBHOOK_SECRET
from tests.support.process import FORGEFLOW, clean_env, free_port
from tests.support.world import BOT

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
GITEA_MCP = Path(sys.executable).parent / "gitea-mcp"


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FORGEFLOW, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def good_env(gitea: GiteaEmulator, tmp_path: Path) -> Iterator[dict[str, str]]:
    token = gitea.add_user(BOT)
    home = write_codex_home(tmp_path / "codex-home", "http://127.0.0.1:9/v1")
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_GITEA_URL=gitea.url,
        FORGEFLOW_GITEA_TOKEN=token,
        FORGEFLOW_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FORGEFLOW_CODEX_COMMAND=f"{CODEX} app-server",
        FORGEFLOW_GITEA_MCP_COMMAND=str(GITEA_MCP),
        FORGEFLOW_MCP_TIMEOUT_SECONDS="30",
        **home.env(),
    )
    assert _run(env, "migrate").returncode == 0
    yield env


def test_doctor_passes_when_everything_is_there(good_env: dict[str, str]) -> None:
    out = _run(good_env, "doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split("]")[1].split(":")[0].strip() for line in lines] == [
        "configuration",
        "database",
        "gitea",
        "webhook secret",
        "sandbox",
        "environments",
        "model",
        "codex",
        "gitea-mcp",
        "workspace root",
        "free disk",
    ]
    assert all(line.startswith("[ok  ]") for line in lines)
    assert good_env["SCRIPTED_MODEL_API_KEY"] not in out.stdout  # named, never shown


def test_doctor_finds_the_pinned_codex_from_anywhere(
    good_env: dict[str, str], tmp_path: Path
) -> None:
    # As the README has it: `.venv/bin/forgeflow doctor`, run from another folder, with
    # neither the Codex command set nor tools/node on PATH.
    env = dict(good_env)
    env.pop("FORGEFLOW_CODEX_COMMAND")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if "node_modules" not in p
    )
    assert shutil.which("codex", path=env["PATH"]) is None
    out = subprocess.run(
        [FORGEFLOW, "doctor"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    [codex] = [line for line in out.stdout.splitlines() if line.startswith("[ok  ] codex:")]
    assert "app-server answers initialize" in codex


@pytest.mark.parametrize(
    ("change", "failing", "hint"),
    [
        ({"FORGEFLOW_WEBHOOK_SECRET": None}, "configuration", "FORGEFLOW_WEBHOOK_SECRET"),
        (
            {"FORGEFLOW_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"},
            "database",
            "unreachable",
        ),
        ({"FORGEFLOW_GITEA_URL": "http://127.0.0.1:9"}, "gitea", "unreachable"),
        ({"FORGEFLOW_GITEA_TOKEN": "not-a-token"}, "gitea", "refuses the token"),
        ({"FORGEFLOW_BOT_LOGIN": "other-bot"}, "gitea", "not 'other-bot'"),
        ({"SCRIPTED_MODEL_API_KEY": None}, "model", "FORGEFLOW_MODEL_API_KEY"),
        ({"FORGEFLOW_CODEX_COMMAND": "/nonexistent/codex app-server"}, "codex", "not found"),
        ({"FORGEFLOW_CODEX_COMMAND": "/bin/false"}, "codex", "initialize failed"),
        (
            {"FORGEFLOW_GITEA_MCP_COMMAND": "/nonexistent/gitea-mcp"},
            "gitea-mcp",
            "mcp_command_missing",
        ),
        (
            {"FORGEFLOW_GITEA_MCP_COMMAND": "sleep 60", "FORGEFLOW_MCP_TIMEOUT_SECONDS": "2"},
            "gitea-mcp",
            "mcp_initialize_timeout",
        ),
        ({"FORGEFLOW_WORKSPACE_ROOT": "/proc/forgeflow"}, "workspace root", "not writable"),
    ],
)
def test_doctor_names_each_broken_dependency(
    good_env: dict[str, str], change: dict[str, str | None], failing: str, hint: str
) -> None:
    env = dict(good_env)
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    out = _run(env, "doctor")
    assert out.returncode == 1, out.stdout
    failed = [line for line in out.stdout.splitlines() if line.startswith("[FAIL]")]
    assert any(
        line.startswith(f"[FAIL] {failing}:") and hint in line and "fix:" in line for line in failed
    ), out.stdout
    assert good_env["FORGEFLOW_GITEA_TOKEN"] not in out.stdout + out.stderr


def _hooks(gitea: GiteaEmulator, env: dict[str, str]) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{gitea.url}/api/v1/repos/acme/widget/hooks",
        headers={"Authorization": f"token {env['FORGEFLOW_GITEA_TOKEN']}"},
    )
    assert r.status_code == 200, r.text
    hooks: list[dict[str, Any]] = r.json()
    return hooks


def test_connect_creates_then_updates_then_has_nothing_to_change(
    gitea: GiteaEmulator, good_env: dict[str, str]
) -> None:
    gitea.add_repo("acme", "widget")
    gitea.set_permission("acme", "widget", BOT, "admin")
    env = good_env | {"FORGEFLOW_PUBLIC_URL": f"http://127.0.0.1:{free_port()}"}
    dry = _run(env, "gitea", "connect", "acme/widget", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("would create")
    assert _hooks(gitea, env) == []
    created = _run(env, "gitea", "connect", "acme/widget")
    assert created.returncode == 0 and created.stdout.startswith("create a webhook"), created
    [hook] = _hooks(gitea, env)
    assert hook["active"] and "issue_comment" in hook["events"]
    assert hook["config"]["url"].endswith("/api/gitea/webhook")
    # Someone narrows the events by hand: connect puts them back.
    r = httpx.patch(
        f"{gitea.url}/api/v1/repos/acme/widget/hooks/{hook['id']}",
        json={"events": ["push"]},
        headers={"Authorization": f"token {env['FORGEFLOW_GITEA_TOKEN']}"},
    )
    assert r.status_code == 200
    updated = _run(env, "gitea", "connect", "acme/widget")
    assert updated.stdout.startswith(f"update hook {hook['id']}") and "events" in updated.stdout
    same = _run(env, "gitea", "connect", "acme/widget")
    first, second = same.stdout.strip().splitlines()
    assert first == f"hook {hook['id']} on acme/widget is up to date"
    # Gitea never shows a hook's secret: connect says it cannot know it, and how to set it.
    assert "cannot be known" in second and "--update-secret" in second
    assert gitea.hook_secret(hook["id"]) == WEBHOOK_SECRET
    rotated = env | {"FORGEFLOW_WEBHOOK_SECRET": "a-rotated-secret"}
    again = _run(rotated, "gitea", "connect", "acme/widget", "--update-secret")
    assert again.stdout.strip() == f"update hook {hook['id']} on acme/widget: secret"
    assert gitea.hook_secret(hook["id"]) == "a-rotated-secret"
    assert "a-rotated-secret" not in again.stdout + again.stderr
    assert len(_hooks(gitea, env)) == 1
    removed = _run(env, "gitea", "disconnect", "acme/widget")
    assert removed.stdout.startswith("removed 1") and _hooks(gitea, env) == []


def test_connect_refuses_bad_input(good_env: dict[str, str]) -> None:
    out = _run(
        good_env | {"FORGEFLOW_PUBLIC_URL": "http://127.0.0.1:1"}, "gitea", "connect", "../etc"
    )
    assert out.returncode == 2 and "not a valid Gitea name" in out.stderr
    out = _run(good_env, "gitea", "connect", "acme/widget")
    assert out.returncode == 2 and "FORGEFLOW_PUBLIC_URL" in out.stderr


def test_connect_says_unreachable_for_a_gitea_it_cannot_reach(good_env: dict[str, str]) -> None:
    env = good_env | {
        "FORGEFLOW_PUBLIC_URL": "http://127.0.0.1:1",
        "FORGEFLOW_GITEA_URL": f"http://127.0.0.1:{free_port()}",
    }
    for command in ("connect", "disconnect"):
        out = _run(env, "gitea", command, "acme/widget")
        assert out.returncode == 1
        [line] = out.stderr.strip().splitlines()
        assert line.startswith(f"forgeflow: Gitea at {env['FORGEFLOW_GITEA_URL']} is unreachable")
        assert "refused" not in line


def test_connect_says_refused_with_gitea_s_code(
    gitea: GiteaEmulator, good_env: dict[str, str]
) -> None:
    gitea.add_repo("acme", "widget")
    gitea.set_permission("acme", "widget", BOT, "read")  # hooks need admin access
    env = good_env | {"FORGEFLOW_PUBLIC_URL": "http://127.0.0.1:1"}
    out = _run(env, "gitea", "connect", "acme/widget")
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("forgeflow: Gitea refused: ") and "HTTP 403" in line, line


def test_the_shipped_systemd_unit_is_accepted_as_written(tmp_path: Path) -> None:
    unit = (ROOT / "deploy" / "forgeflow.service").read_text()
    # systemd reads a '#' after a value as part of the value: comments only on their own line.
    for number, line in enumerate(unit.splitlines(), 1):
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" not in line, f"forgeflow.service:{number}: {line}"
    env = (ROOT / "deploy" / "forgeflow.env.example").read_text().splitlines()
    assert all("#" not in line for line in env if not line.startswith("#"))
    # The unit as installed in this checkout instead of /srv/forgeflow: every command it
    # names exists, every value parses (a warning on stderr is a failure).
    here = tmp_path / "forgeflow.service"
    here.write_text(unit.replace("/srv/forgeflow", str(ROOT)))
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze is part of Debian's systemd package"
    out = subprocess.run([analyze, "verify", str(here)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def _declare_packages(env: dict[str, str]) -> None:
    """An environment listing a package, written as the API stores it (issue #26)."""
    store = Store(f"sqlite:///{Path(env['FORGEFLOW_DATA_DIR']) / 'forgeflow.db'}")
    try:
        env_ = Environment(("hello",))
        asyncio.run(store.write(lambda c: environments.put(c, "default:acme/widget", env_)))
    finally:
        store.close()


def test_doctor_says_how_to_get_mmdebstrap_when_an_environment_needs_it(
    good_env: dict[str, str],
) -> None:
    _declare_packages(good_env)
    out = _run({**good_env, "FORGEFLOW_MMDEBSTRAP_COMMAND": "/nonexistent/mmdebstrap"}, "doctor")
    assert out.returncode == 1, out.stdout
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("[FAIL] environments:")]
    assert "fix:" in line and "apt-get install mmdebstrap" in line


@pytest.mark.skipif(
    shutil.which("mmdebstrap") is None and not os.environ.get("CI"),  # CI must have it
    reason="run scripts/setup.sh",
)
def test_doctor_has_mmdebstrap_simulate_a_build_here(good_env: dict[str, str]) -> None:
    _declare_packages(good_env)
    out = _run(good_env, "doctor")
    (line,) = [x for x in out.stdout.splitlines() if "] environments:" in x]
    assert line.startswith("[ok  ]") and "builds a root here" in line, out.stdout
