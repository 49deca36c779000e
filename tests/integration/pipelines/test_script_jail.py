"""Where ``pipeline.bashScript`` runs: a jail around the run's scratch folder when the
run has no repository, the repository's read-only jail for a draft space, and its time
limit ends everything the script started (real bubblewrap, real git)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from forgeflow.domain import modes
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.store import Store, sessions
from tests.integration.pipelines.harness import Harness, harness, run_async
from tests.support.pipelines import dag_doc


def _script(key: str, script: str, **extras: Any) -> dict[str, Any]:
    spec = {"kind": "listen", "bodyKey": "pipeline.bashScript", "outputKey": "s"}
    return dag_doc("t>s", key=key, s={**spec, "extras": {"script": script, **extras}})


def _run(store: Store, tmp_path: Path, scenario: Any) -> None:
    async def _main() -> None:
        async with harness(store, tmp_path) as h:
            await scenario(h)

    run_async(_main)


def _alive(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


def test_a_script_without_a_repository_sees_only_its_scratch_folder_and_dies_at_its_limit(
    store: Store, tmp_path: Path
) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not for scripts\n")
    marker = f"ff-marker-{uuid.uuid4().hex}"
    look = _script(
        "look",
        f"hostname; cat {secret} 2>&1; ls {tmp_path / 'workspaces'} 2>&1; pwd; echo $HOME",
    )
    # A background child and a grandchild: the time limit must end them all.
    slow = _script(
        "slow",
        f"(exec -a {marker} sleep 300) & bash -c 'exec -a {marker} sleep 300' & wait",
        timeoutSeconds=1,
    )

    async def scenario(h: Harness) -> None:
        await h.add(look)
        await h.add(slow)
        row = await h.run("look")
        assert row.status == "succeeded", row.error
        lines = row.state["s"]["stdout"].splitlines()
        scratch = str(tmp_path / "scratch" / row.run_id)
        assert lines[0] == "forgeflow-agent", lines
        assert "No such file or directory" in lines[1], lines
        assert "No such file or directory" in lines[2], lines
        assert lines[3:] == [scratch, "/home/agent"], lines
        row = await h.run("slow", timeout=30)
        assert row.status == "failed" and row.error_code in {
            "script_timeout",
            "step_timeout",
        }, row
        await h.wait(lambda: _none_alive(marker), what="the script's processes end")

    _run(store, tmp_path, scenario)
    assert not _alive(marker)


async def _none_alive(marker: str) -> bool:
    return not _alive(marker)


def test_a_script_on_a_review_space_gets_a_read_only_repository(
    store: Store, tmp_path: Path
) -> None:
    clone = tmp_path / "workspaces" / "default" / "acme" / "widget"
    clone.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    (clone / "tracked.txt").write_text("x\n")
    subprocess.run(["git", "-C", str(clone), "add", "tracked.txt"], check=True)
    resource = ResourceRef(RepoRef("acme", "widget"), ResourceKind.ISSUE, 5)
    doc = _script("draft", "git ls-files; touch written 2>&1 | sed 's/.*: //'; echo ok")
    node = next(n for n in doc["nodes"] if n["id"] == "s")
    node["inputs"] = {"repo": "acme/widget"}

    async def scenario(h: Harness) -> None:
        space = await store.write(
            lambda c: sessions.open_space(c, resource, mode=modes.REVIEW, run_id="r1")
        )
        node["extras"]["spaceId"] = space.session_key
        await h.add(doc)
        row = await h.run("draft")
        assert row.status == "succeeded", row.error
        out = row.state["s"]["stdout"].splitlines()
        assert out == ["tracked.txt", "Read-only file system", "ok"], out

    _run(store, tmp_path, scenario)
    assert not (clone / "written").exists()


def test_dep_audit_lists_the_manifests_with_git_in_the_jail(store: Store, tmp_path: Path) -> None:
    builtin = Path(modes.__file__).parents[1] / "pipelines" / "builtin" / "dep_audit.yaml"
    nodes = yaml.safe_load(builtin.read_text())["nodes"]
    step = next(n for n in nodes if n["id"] == "manifests")
    clone = tmp_path / "workspaces" / "default" / "acme" / "widget"
    (clone / "web").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    for name in ("pyproject.toml", "web/package.json", "notes.txt"):
        (clone / name).write_text("{}\n")
    subprocess.run(["git", "-C", str(clone), "add", "."], check=True)
    doc = _script("audit", step["extras"]["script"], timeoutSeconds=60)
    next(n for n in doc["nodes"] if n["id"] == "s")["inputs"] = {"repo": "acme/widget"}

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("audit")
        assert row.status == "succeeded", row.error
        assert row.state["s"]["stdout"].splitlines() == ["pyproject.toml", "web/package.json"]

    _run(store, tmp_path, scenario)
