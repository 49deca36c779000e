"""Retrying a failed or cancelled run on a real store (SQLite and PostgreSQL): only the
failed, cancelled and skipped-by-failure steps run again; succeeded steps keep their
outputs and state-bag writes; an interrupted ``idempotent: false`` step needs a
confirmation; a retry that dies halfway leaves the run as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection

from forgeflow.pipelines import retry, runs
from forgeflow.pipelines.runs import PipelineError
from forgeflow.store import Store, audit
from tests.integration.pipelines.harness import Harness, harness, run_async
from tests.support.pipelines import dag_doc


def run(store: Store, tmp_path: Path, scenario: Any) -> None:
    async def _main() -> None:
        async with harness(store, tmp_path) as h:
            await scenario(h)

    run_async(_main)


async def _retry(h: Harness, run_id: str, confirm: bool = False) -> list[str]:
    _, chosen = await h.store.write(
        lambda c: retry.retry_run(c, run_id, actor="admin:alice", confirm_interrupted=confirm)
    )
    return chosen.labels() + chosen.items()


def _chain() -> dict[str, Any]:
    """a succeeds and writes ``first``; b fails on its first attempt; c after b."""
    return dag_doc(
        "t>a a>b b>c c>end",
        a={
            "kind": "listen",
            "bodyKey": "test.record",
            "outputKey": "first",
            "inputs": {"value": "kept", "sleep": 0},
        },
        b={
            "kind": "listen",
            "bodyKey": "test.flaky",
            "outputKey": "second",
            "inputs": {"fails": 1},
        },
        c={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "third",
            "inputs": {"value": "{{ second.attempt }}"},
        },
    )


def test_a_failed_run_runs_only_its_failed_and_skipped_steps_again(
    store: Store, tmp_path: Path
) -> None:
    async def scenario(h: Harness) -> None:
        await h.add(_chain())
        failed = await h.run("p")
        run_id = failed.run_id
        assert (failed.status, failed.error_code) == ("failed", "flaky")
        before = await h.steps(run_id)
        assert [before[s].status for s in "abc"] == ["succeeded", "failed", "skipped"]
        assert await _retry(h, run_id) == ["b", "c", "end"]
        done = await h.finished(run_id)
        assert done.status == "succeeded", done.error
        after = await h.steps(run_id)
        # a ran once: same row, same output, same finish time.
        assert [n for n, *_ in h.intervals] == ["a"]
        assert after["a"].attempt == 1
        assert after["a"].finished_at == before["a"].finished_at
        assert (after["b"].attempt, after["b"].retry_base) == (2, 1)
        assert done.state["first"] == "kept"
        assert done.state["third"] == 2
        rows = await h.store.read(
            lambda c: audit.query(c, audit.AuditQuery(action="pipeline.run.retry"))
        )
        assert len(rows) == 1
        assert rows[0].actor == "admin:alice"
        assert rows[0].metadata["steps"] == ["b", "c", "end"]
        assert rows[0].metadata["fromStatus"] == "failed"

    run(store, tmp_path, scenario)


def test_only_a_failed_or_cancelled_run_is_retried(store: Store, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        await h.add(dag_doc("t>a a>end"))
        ok = await h.run("p")
        assert ok.status == "succeeded"
        with pytest.raises(PipelineError) as caught:
            await _retry(h, ok.run_id)
        assert (caught.value.code, caught.value.status) == ("run_not_retryable", 409)
        with pytest.raises(PipelineError) as missing:
            await _retry(h, "run-nope")
        assert (missing.value.code, missing.value.status) == ("run_not_found", 404)

    run(store, tmp_path, scenario)


def test_an_interrupted_non_idempotent_step_needs_a_confirmation(
    store: Store, tmp_path: Path
) -> None:
    doc = dag_doc(
        "t>b b>end",
        b={"kind": "listen", "bodyKey": "test.block", "extras": {"idempotent": False}},
    )

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        run_id = await h.start("p")

        async def _running() -> bool:
            return await h.step_status(run_id, "b") == "running"

        await h.wait(_running, what="b running")
        await h.store.write(lambda c: runs.cancel_run(c, run_id, actor="admin:x", reason=None))
        row = await h.finished(run_id)
        assert row.status == "cancelled"
        with pytest.raises(PipelineError) as caught:
            await _retry(h, run_id)
        assert caught.value.code == "interrupted_needs_confirmation"
        assert caught.value.extra["steps"] == ["b"]
        assert "b:" in caught.value.message
        assert (await h.get(run_id)).status == "cancelled"  # nothing moved
        h.released.set()
        assert await _retry(h, run_id, confirm=True) == ["b", "end"]
        done = await h.finished(run_id)
        assert done.status == "succeeded"
        assert (await h.steps(run_id))["b"].output == "released"

    run(store, tmp_path, scenario)


def test_a_foreach_runs_again_only_its_unfinished_items(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>each each>end",
        each={
            "kind": "forEach",
            "bodyKey": "test.flaky",
            "outputKey": "results",
            "extras": {"iterableKey": "inputs.items", "itemKey": "it", "maxConcurrency": 1},
            "inputs": {"fails": "{{ it }}"},
        },
    )
    doc["inputs"] = [{"name": "items", "type": "array"}]

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        failed = await h.run("p", inputs={"items": [0, 1, 0]})
        run_id = failed.run_id
        assert failed.status == "failed"
        before = await h.steps(run_id)
        assert [before[f"each#{i}"].status for i in range(3)] == [
            "succeeded",
            "failed",
            "skipped",
        ]
        assert await _retry(h, run_id) == ["each", "end", "each#1", "each#2"]
        done = await h.finished(run_id)
        assert done.status == "succeeded", done.error
        assert done.state["results"] == [{"attempt": 1}, {"attempt": 2}, {"attempt": 1}]
        assert [(s, a) for s, a, _ in h.attempts] == [
            ("each", 1),
            ("each", 1),
            ("each", 2),
            ("each", 1),
        ]

    run(store, tmp_path, scenario)


def test_retry_attempts_count_again_from_the_retry(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>b b>end",
        b={
            "kind": "listen",
            "bodyKey": "test.flaky",
            "inputs": {"fails": 3},
            "retry": {"attempts": 2, "backoff": "linear", "delaySeconds": 0},
        },
    )

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        failed = await h.run("p")
        assert (await h.steps(failed.run_id))["b"].attempt == 2
        await _retry(h, failed.run_id)
        done = await h.finished(failed.run_id)
        # Attempt 3 fails, and the node's second try of this retry (attempt 4) succeeds.
        assert done.status == "succeeded", done.error
        assert (await h.steps(failed.run_id))["b"].output == {"attempt": 4}

    run(store, tmp_path, scenario)


def test_a_retry_that_dies_halfway_leaves_the_run_as_it_was(store: Store, tmp_path: Path) -> None:
    class Crash(Exception):
        pass

    def _retry_then_crash(conn: Connection, run_id: str) -> None:
        retry.retry_run(conn, run_id, actor="admin:alice", confirm_interrupted=False)
        raise Crash

    async def scenario(h: Harness) -> None:
        await h.add(_chain())
        failed = await h.run("p")
        run_id = failed.run_id
        before = await h.steps(run_id)
        with pytest.raises(Crash):
            await h.store.write(lambda c: _retry_then_crash(c, run_id))
        assert await h.get(run_id) == failed
        assert await h.steps(run_id) == before
        rows = await h.store.read(
            lambda c: audit.query(c, audit.AuditQuery(action="pipeline.run.retry"))
        )
        assert rows == []
        # And the retry still works afterwards.
        assert await _retry(h, run_id) == ["b", "c", "end"]
        assert (await h.finished(run_id)).status == "succeeded"

    run(store, tmp_path, scenario)
