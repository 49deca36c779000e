"""Steps whose engine went away: another node takes them over once their lease expired
(idempotent ones run again, ``idempotent: false`` ones fail the run)."""

from __future__ import annotations

from pathlib import Path

from forgeflow.store import Store
from tests.integration.pipelines.harness import harness, run_async
from tests.support.pipelines import dag_doc


def test_an_expired_lease_is_taken_over_by_another_node(store: Store, tmp_path: Path) -> None:
    again = dag_doc("t>b b>end", key="again", b={"kind": "listen", "bodyKey": "test.block"})
    once = dag_doc(
        "t>b b>end",
        key="once",
        b={"kind": "listen", "bodyKey": "test.block", "extras": {"idempotent": False}},
    )

    async def scenario() -> None:
        async with harness(store, tmp_path, owner="node-a/1", lease_ttl=0.6) as a:
            await a.add(again)
            await a.add(once)
            ids = [await a.start("again"), await a.start("once")]

            async def _running() -> bool:
                return all([await a.step_status(i, "b") == "running" for i in ids])

            await a.wait(_running, what="both blocked")
        # Node a is gone (its bodies were cancelled, the rows still say running).
        async with harness(store, tmp_path, owner="node-b/1") as b:
            b.released.set()
            first = await b.finished(ids[0], timeout=10)
            second = await b.finished(ids[1], timeout=10)
            assert first.status == "succeeded"
            steps = await b.steps(ids[0])
            assert (steps["b"].attempt, steps["b"].output) == (2, "released")
            assert (second.status, second.error_code) == (
                "failed",
                "interrupted_non_idempotent",
            )
            assert (await b.steps(ids[1]))["b"].attempt == 1

    run_async(scenario)
