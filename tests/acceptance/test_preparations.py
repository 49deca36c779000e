"""The bound on concurrent preparations (FORGEFLOW_MAX_PREPARATIONS), seen from outside
a real ``forgeflow serve``: the git processes it runs, its metrics and its audit trail.

First mentions on six new repositories arrive together; every first mention clones. The
emulator holds each clone's pack request for a second, so clones overlap for as long as
the bound lets them, and a task waiting for a place waits longer than its lease's
lifetime: the lease must be renewed meanwhile, or the process's own recovery would take
the task back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import Cluster, hook, make_cluster, wait_for

REPOS = tuple(f"fresh{i}" for i in range(6))
LIMIT = 2
LEASE_TTL = 1.5
PACK_DELAY = 1.0  # seconds the emulator holds every clone's pack request


@pytest.fixture
def cluster(gitea: GiteaEmulator, tmp_path: Path, db_url: str) -> Iterator[Cluster]:
    c = make_cluster(gitea, tmp_path, db_url, repos=REPOS)
    try:
        yield c
    finally:
        c.stop()


class GitClones:
    """Every 5 ms, the git processes that fill a repository's mirror from Gitea (a new
    repository's clone: ``git fetch <url> +refs/heads/*:refs/heads/*`` in the mirror)
    that are children of the serve process (git runs in a session of its own, but is
    still the serve's child)."""

    def __init__(self, pid: int) -> None:
        self._children = Path(f"/proc/{pid}/task/{pid}/children")
        self.seen: set[int] = set()
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            clones = {pid for pid in self._child_pids() if _fills_mirror(_argv(pid))}
            self.seen |= clones
            self.most = max(self.most, len(clones))

    def _child_pids(self) -> list[int]:
        try:
            return [int(p) for p in self._children.read_text().split()]
        except OSError:
            return []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _fills_mirror(argv: list[str]) -> bool:
    return "fetch" in argv and "+refs/heads/*:refs/heads/*" in argv


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # it ended between the listing and this read
        return []


def _preparations(cluster: Cluster) -> dict[str, float]:
    """The serve's forgeflow_preparations gauges, by state, and its limit."""
    out: dict[str, float] = {}
    for line in httpx.get(cluster.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("forgeflow_preparations{state="):
            state = line.split('"')[1]
            out[state] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("forgeflow_preparations_limit "):
            out["limit"] = float(line.rsplit(" ", 1)[1])
    return out


def _detail(cluster: Cluster, task_id: str) -> dict[str, Any]:
    with cluster.admin() as admin:
        detail: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        return detail


def _at(detail: dict[str, Any], action: str) -> datetime:
    (event,) = [e for e in detail["audit"] if e["action"] == action]
    return datetime.fromisoformat(event["timestamp"])


def test_at_most_the_limit_of_preparations_clone_at_once(cluster: Cluster) -> None:
    cluster.start(
        FORGEFLOW_MAX_PREPARATIONS=str(LIMIT),
        FORGEFLOW_LEASE_TTL_SECONDS=str(LEASE_TTL),
        FORGEFLOW_TEST_TURN_SECONDS="0.2",
    )
    hook(cluster, REPOS)
    issues = {
        repo: cluster.gitea.add_issue("acme", repo, title="t", author="alice") for repo in REPOS
    }
    cluster.gitea.fail_next(
        "POST", r"/git-upload-pack$", status=0, count=len(REPOS), delay=PACK_DELAY
    )
    assert cluster.proc is not None
    clones = GitClones(cluster.proc.pid)
    gauges: list[dict[str, float]] = []
    try:
        tasks = [cluster.mention(issues[repo], repo=repo) for repo in REPOS]

        # While the first clones are held, the others wait for a place, claimed.
        def crowded() -> bool:
            gauges.append(_preparations(cluster))
            return gauges[-1].get("working") == LIMIT and gauges[-1].get("waiting", 0) >= 1

        wait_for(crowded, timeout=30, what="preparations waiting beside the working ones")
        wait_for(lambda: all(_detail(cluster, t)["terminal"] for t in tasks), timeout=120)
    finally:
        clones.stop()
    assert gauges[-1]["limit"] == LIMIT
    details = [_detail(cluster, t) for t in tasks]
    assert [d["task"]["state"] for d in details] == ["succeeded"] * len(REPOS)
    assert len(clones.seen) == len(REPOS)  # one clone per new repository, each observed
    assert clones.most == LIMIT  # they overlapped, but never more than the limit
    for d in details:  # claimed once, never recovered: the waiting tasks kept their lease
        actions = [e["action"] for e in d["audit"]]
        assert actions.count("task.claim") == 1, actions
        assert "task.recover" not in actions, actions
    waited = max(
        (_at(d, "workspace.clone") - _at(d, "task.claim")).total_seconds() for d in details
    )
    assert waited > LEASE_TTL + PACK_DELAY  # some task waited longer than a lease lives
