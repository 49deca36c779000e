"""Repositories' environments with the real mmdebstrap, bubblewrap and codex app-server
(issue #26). One small root is built per test session (the package ``hello`` and
forgeflow's own base packages) in a folder the tests share; forgeflow finds it ready.

- a repository whose environment lists ``hello`` gets a jail where ``hello`` runs and
  the host's ``/usr`` (its bubblewrap, its node) is not there;
- a setup secret is seen by the setup script and by nothing of the turn: not its
  environment, not its transcript, not forgeflow's logs;
- a failing setup fails the task with ``environment_setup_failed``, the answer quoting
  the log's end;
- the repository's page shows its root (state, size, last use) and its last setup with
  the end of its log;
- a changed list's old root stays while a jail runs on it (another forgeflow sharing
  the folder and the database cannot remove it either) and is removed once none does;
- neither a setup nor a turn can write into the root it shares with other repositories.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forgeflow.agent.envroot import BASE_PACKAGES, RootBuilder, host_suite
from forgeflow.domain.environment import Environment, RootKey, RootState, root_key
from forgeflow.store import Store
from forgeflow.store import environments as q
from forgeflow.tasks.environment import Environments
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.acceptance.test_egress import ui_page
from tests.support.agentic import Agentic, start_agentic
from tests.support.cluster import wait_for
from tests.support.turns import shell_turn

# Skipped only off CI: there scripts/setup.sh installs mmdebstrap, and a missing one must
# fail the run rather than hide the install step it lost.
pytestmark = pytest.mark.skipif(
    shutil.which("mmdebstrap") is None and not os.environ.get("CI"),
    reason="mmdebstrap is missing: run scripts/setup.sh",
)

REPO = "/api/gitea-workflow/repos/default:acme/widget/environment"
PAGE = "/ui/repos/default:acme/widget"
SECRET = "setup-only-s3cr3t-4f9c2e"


def key_of(*packages: str) -> RootKey:
    key = root_key(Environment(packages=packages), host_suite(), BASE_PACKAGES)
    assert key is not None
    return key


@pytest.fixture(scope="session")
def env_roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The roots folder of every test here, with the root of ``["hello"]`` built once
    (FORGEFLOW_TEST_ENV_ROOTS: a folder kept between sessions, as CI caches it)."""
    kept = os.environ.get("FORGEFLOW_TEST_ENV_ROOTS")
    base = tmp_path_factory.getbasetemp()
    # Under xdist every worker has its own session: they share the run's folder, and
    # the builder's file lock makes the first build the only one.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = Path(kept) if kept else shared / "envroots"
    folder.mkdir(exist_ok=True)
    built = asyncio.run(RootBuilder(folder).ensure(key_of("hello")))
    assert built.ok, built.log
    return folder


@pytest.fixture
def env_agentic(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    env_roots: Path,
) -> Iterator[Agentic]:
    yield from start_agentic(
        gitea, model, tmp_path, sqlite_url, monkeypatch, environment_roots=env_roots
    )


def declare(agentic: Agentic, environment: dict[str, object], n: int = 1) -> None:
    with agentic.ff.admin() as admin:
        r = admin.put(REPO, json={"requestId": f"env-{n}", "environment": environment})
        assert r.status_code == 200, r.text


def test_the_jail_runs_the_environment_s_package_not_the_host_s_system(
    env_agentic: Agentic,
) -> None:
    declare(env_agentic, {"packages": ["hello"], "variables": {"GREETING_STYLE": "plain"}})
    turn = shell_turn(
        env_agentic,
        "hello\n"
        "test -e /usr/bin/bwrap && echo host-usr-visible || echo host-usr-hidden\n"
        "test -e /usr/bin/node && echo host-node-visible || echo host-node-hidden\n"
        'echo "style:$GREETING_STYLE"',
    )
    assert "Hello, world!" in turn.output
    assert "host-usr-hidden" in turn.output and "host-node-hidden" in turn.output
    assert "style:plain" in turn.output
    with env_agentic.ff.admin() as admin:
        root = admin.get(REPO).json()["root"]
    # Found ready in the shared folder (built by the fixture): recorded as found.
    assert root["state"] == "ready" and root["sizeBytes"] > 1_000_000, root
    assert root["lastUsedAt"] is not None
    page = ui_page(env_agentic.ff.url, PAGE)
    assert 'id="environment-root"' in page and "s-ready" in page, page
    assert "MiB" in page.split('id="root-size"', 1)[1][:40]
    assert "hello" in page and "GREETING_STYLE=plain" in page


def test_a_setup_secret_reaches_the_setup_only(env_agentic: Agentic) -> None:
    env_agentic.gitea.push_branch(
        "acme",
        "widget",
        "main",
        {
            "ci/env-setup.sh": (
                'echo "secret-length:${#SETUP_TOKEN}"\n'
                'echo "printed:$SETUP_TOKEN"\n'
                'hello > "$FORGEFLOW_ENV_DIR/setup-marker"\n'
            )
        },
    )
    with env_agentic.ff.admin() as admin:
        r = admin.put(
            REPO + "/secrets", json={"requestId": "s-1", "secrets": {"SETUP_TOKEN": SECRET}}
        )
        assert r.status_code == 200, r.text
    declare(env_agentic, {"packages": ["hello"], "setupScript": "ci/env-setup.sh"})
    turn = shell_turn(
        env_agentic,
        'env | grep -c SETUP_TOKEN || true\necho "value:${SETUP_TOKEN:-absent}"\n'
        'cat "$FORGEFLOW_ENV_DIR/setup-marker"\n'
        # Its own rollout (sessions/) holds this command, the word searched for.
        'grep -rl --exclude-dir=sessions s3cr3t "$HOME" "$FORGEFLOW_ENV_DIR" /tmp 2>/dev/null'
        ' | sed "s/^/found:/" || true',
    )
    assert "value:absent" in turn.output
    assert "0\n" in turn.output  # no variable of that name in the turn's environment
    assert "Hello, world!" in turn.output  # the setup's result, in the environment folder
    assert SECRET not in turn.output and "found:" not in turn.output  # nor in a file
    with env_agentic.ff.admin() as admin:
        setup = admin.get(REPO).json()["setup"]
        transcript = admin.get(f"/api/gitea-workflow/tasks/{turn.task_id}/transcript").text
        audit = admin.get("/api/gitea-workflow/audit", params={"format": "jsonl"}).text
    assert setup["state"] == "ready" and f"secret-length:{len(SECRET)}" in setup["log"]
    assert "printed:***" in setup["log"] and SECRET not in setup["log"]
    assert SECRET not in transcript and SECRET not in audit
    for path in (env_agentic.ff.settings.data_dir / "logs").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_a_failing_setup_fails_the_task_quoting_its_log(env_agentic: Agentic) -> None:
    env_agentic.gitea.push_branch(
        "acme",
        "widget",
        "main",
        {
            "ci/broken.sh": (
                'echo "compiling the world"\necho "fatal: toolchain-xyz missing" >&2\nexit 7\n'
            )
        },
    )
    declare(env_agentic, {"setupScript": "ci/broken.sh"})
    task_id = env_agentic.mention("@ccweb-bot please build it")
    detail = env_agentic.finished(task_id)
    assert detail["task"]["state"] == "failed"
    assert detail["task"]["errorCode"] == "environment_setup_failed"
    answers = wait_for(
        lambda: [
            c["body"] for c in env_agentic.bot_comments() if "environment_setup_failed" in c["body"]
        ],
        what="the failure's answer",
    )
    assert "fatal: toolchain-xyz missing" in answers[-1]
    assert "exit status 7" in answers[-1]
    assert env_agentic.model.requests == []  # no turn was started
    with env_agentic.ff.admin() as admin:
        setup = admin.get(REPO).json()["setup"]
    assert setup["state"] == "failed" and "compiling the world" in setup["log"]
    page = ui_page(env_agentic.ff.url, f"/ui/tasks/{task_id}")
    assert 'id="environment-log"' in page and "toolchain-xyz missing" in page
    # The repository's page: the last setup, failed, with its log's end and its task.
    repo_page = ui_page(env_agentic.ff.url, PAGE)
    setup_part = repo_page.split('id="setup-state"', 1)[1]
    assert "s-failed" in setup_part[:200] and task_id in setup_part[:600]
    assert "toolchain-xyz missing" in repo_page.split('id="setup-log"', 1)[1]


def test_a_changed_environment_waits_for_the_running_turn_then_replaces_it(
    env_agentic: Agentic,
) -> None:
    declare(env_agentic, {"packages": ["hello"], "variables": {"GREETING_STYLE": "old"}})

    def change_then_print() -> str:
        # Asked while the turn runs (its app-server is up): the environment changes now.
        declare(env_agentic, {"packages": ["hello"], "variables": {"GREETING_STYLE": "new"}}, 2)
        return 'echo "style:$GREETING_STYLE"'

    first = shell_turn(env_agentic, change_then_print)
    assert "style:old" in first.output  # the running turn kept its system
    second = shell_turn(env_agentic, 'echo "style:$GREETING_STYLE"\nhello')
    assert "style:new" in second.output and "Hello, world!" in second.output


def test_a_root_that_cannot_be_built_fails_the_task_once_until_set_again(
    env_agentic: Agentic,
) -> None:
    # A name Debian does not have: mmdebstrap resolves the list, then stops.
    declare(env_agentic, {"packages": ["hello", "forgeflow-no-such-package"]})
    task_id = env_agentic.mention("@ccweb-bot please build it")
    detail = env_agentic.finished(task_id, timeout=300)
    assert detail["task"]["errorCode"] == "environment_setup_failed"
    assert "forgeflow-no-such-package" in detail["task"]["executionError"]
    with env_agentic.ff.admin() as admin:
        root = admin.get(REPO).json()["root"]
    assert root["state"] == "failed" and "mmdebstrap failed" in root["log"]
    # The next mention fails at once with the same log: nothing was built again.
    again = env_agentic.finished(env_agentic.mention("@ccweb-bot again"))
    assert again["task"]["errorCode"] == "environment_setup_failed"
    with env_agentic.ff.admin() as admin:
        assert admin.get(REPO).json()["root"]["startedAt"] == root["startedAt"]
    assert env_agentic.model.requests == []


def test_an_old_root_is_removed_once_no_jail_uses_it(
    env_agentic: Agentic, env_roots: Path, sqlite_url: str
) -> None:
    shared, old = key_of("hello"), key_of("hello", "forgeflow-old-list")
    old_path = env_roots / old.key
    if old_path.exists():  # left by an earlier run that stopped half-way
        shutil.rmtree(old_path)
    # The old list's root without a second build: a hard-linked copy of the shared one
    # (cp -al: seconds, no download), which forgeflow finds ready as it finds a root
    # another forgeflow built. Removing it unlinks its names only: the shared root stays.
    subprocess.run(["cp", "-al", str(env_roots / shared.key), str(old_path)], check=True)
    declare(env_agentic, {"packages": ["hello", "forgeflow-old-list"]})
    # Another forgeflow sharing the roots folder and the database.
    other = Environments.from_settings(Store(sqlite_url), env_agentic.ff.settings, ())
    swept: list[list[str]] = []

    def change_then_sweep() -> str:
        declare(env_agentic, {"packages": ["hello"]}, 2)
        # The turn's jail runs on the old root, which no environment names any more.
        with ThreadPoolExecutor(1) as pool:
            swept.append(pool.submit(asyncio.run, other.sweep()).result())
        swept.append(["still there"] if (old_path / "usr").is_dir() else [])
        return "hello"

    first = shell_turn(env_agentic, change_then_sweep)
    assert "Hello, world!" in first.output
    assert swept == [[], ["still there"]]  # not removed under the running jail
    row = asyncio.run(other.store.read(lambda c: q.root(c, old.key)))
    assert row is not None and row.state == "ready"
    # The next turn runs on the new root; the old app-server ends, and its root goes.
    second = shell_turn(env_agentic, "hello")
    assert "Hello, world!" in second.output
    wait_for(lambda: not old_path.exists(), what="the old root removed")

    def removed() -> RootState | None:
        found = asyncio.run(other.store.read(lambda c: q.root(c, old.key)))
        return found if found is not None and found.state == "removed" else None

    gone = wait_for(removed, what="the old root's row saying removed")
    assert gone.removed_at is not None
    assert (env_roots / shared.key / "usr" / "bin" / "hello").is_file()  # shared root intact
    assert not [p for p in env_roots.iterdir() if p.name.startswith(f".{old.key}.")]
    with env_agentic.ff.admin() as admin:
        events = admin.get(
            "/api/gitea-workflow/audit", params={"action": "environment.root_removed"}
        ).json()["items"]
    assert [e["metadata"]["rootKey"] for e in events] == [old.key]
    page = ui_page(env_agentic.ff.url, "/ui/repos")
    assert old.key in page and "s-removed" in page
    other.store.close()


POISON = """
for p in /usr/bin/ff-poison /usr/lib/ff-poison /etc/ff-poison /ff-poison; do
  touch "$p" 2>/dev/null && echo "wrote:$p"
done
echo poisoned >> /usr/bin/hello 2>/dev/null && echo wrote:hello
mount -o remount,rw /usr 2>/dev/null && echo wrote:remount
echo poison-tried
"""


def test_neither_a_setup_nor_a_turn_can_write_the_shared_root(
    env_agentic: Agentic, env_roots: Path
) -> None:
    # The root of ["hello"] is every repository's that lists hello: a setup (the
    # repository's script) or a turn writing into it would reach the others' jails.
    root = env_roots / key_of("hello").key
    before = (root / "usr" / "bin" / "hello").read_bytes()
    env_agentic.gitea.push_branch("acme", "widget", "main", {"ci/poison.sh": POISON})
    declare(env_agentic, {"packages": ["hello"], "setupScript": "ci/poison.sh"})
    turn = shell_turn(env_agentic, POISON)
    with env_agentic.ff.admin() as admin:
        setup = admin.get(REPO).json()["setup"]
    assert "poison-tried" in setup["log"] and "wrote:" not in setup["log"], setup["log"]
    assert "poison-tried" in turn.output and "wrote:" not in turn.output, turn.output
    assert (root / "usr" / "bin" / "hello").read_bytes() == before
    assert not [p for p in (root / "usr" / "bin", root / "usr" / "lib", root / "etc", root)
                if (p / "ff-poison").exists()]  # fmt: skip
