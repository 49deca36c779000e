"""Concurrent first deliveries and parallel copies: the database keeps the keys unique."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import func, select

from forgeflow.store.schema import repositories, tasks, webhook_deliveries
from tests.support.forgeflow import WEBHOOK_SECRET
from tests.support.world import World


def _count(world: World, table: object, *where: object) -> int:
    return int(
        world.ff.services.store.db.read_sync(
            lambda c: c.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
        )
    )


def _signed(
    world: World, repo: str, index: int, comment_id: int, body: str
) -> tuple[dict[str, str], bytes]:
    payload = world.gitea.comment_payload(
        "acme",
        repo,
        index,
        {"id": comment_id, "body": body, "user": {"login": "alice"}},
        sender="alice",
    )
    return world.gitea.build_delivery("acme", repo, "issue_comment", payload, secret=WEBHOOK_SECRET)


def _post_all(url: str, requests: list[tuple[dict[str, str], bytes]]) -> list[httpx.Response]:
    def post(req: tuple[dict[str, str], bytes]) -> httpx.Response:
        return httpx.post(url, headers=req[0], content=req[1], timeout=60)

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(post, requests))


def test_fifty_concurrent_first_deliveries_register_one_repository(world: World) -> None:
    world.gitea.add_repo("acme", "fresh")
    world.gitea.set_permission("acme", "fresh", "alice", "write")
    world.gitea.set_permission("acme", "fresh", "ccweb-bot", "admin")
    issue = world.gitea.add_issue("acme", "fresh", title="t", author="alice")
    reqs = [_signed(world, "fresh", issue, 900_000 + i, f"@ccweb-bot job {i}") for i in range(50)]
    responses = _post_all(world.ff.webhook_url, reqs)
    assert [r.status_code for r in responses] == [202] * 50, [r.text for r in responses][:3]
    assert _count(world, repositories, repositories.c.repo_key == "default:acme/fresh") == 1
    assert _count(world, tasks, tasks.c.repo_key == "default:acme/fresh") == 50
    assert len({r.json()["taskId"] for r in responses}) == 50


def test_twenty_parallel_copies_make_one_task(world: World) -> None:
    req = _signed(world, "widget", world.issue, 777_001, "@ccweb-bot once")
    responses = _post_all(world.ff.webhook_url, [req] * 20)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 19 + [202]
    assert len({r.json()["taskId"] for r in responses}) == 1
    assert _count(world, tasks) == 1
    assert _count(world, webhook_deliveries) == 1
    accepted = next(r for r in responses if r.status_code == 202)
    assert all(json.loads(r.text)["status"] == "duplicate" for r in responses if r is not accepted)
