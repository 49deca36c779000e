"""The engine on SQLite and PostgreSQL: kinds, state, retries, failures, cancellation."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from forgeflow.pipelines import steps
from forgeflow.pipelines.kinds import NODE_ROW
from forgeflow.pipelines.runs import PipelineError
from forgeflow.store import Store
from tests.integration.pipelines.harness import Harness, harness, max_overlap, run_async
from tests.support.pipelines import dag_doc


def run(store: Store, tmp_path: Path, scenario: Any, **engine: Any) -> None:
    async def _main() -> None:
        async with harness(store, tmp_path, **engine) as h:
            await scenario(h)

    run_async(_main)


def test_happy_path_renders_inputs_and_fills_the_state_bag(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>a a>b b>end",
        a={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "a",
            "inputs": {"value": {"n": "{{ inputs.n }}", "text": "n={{inputs.n}}"}},
        },
        b={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "b",
            "inputs": {"value": "{{ a.text }} and {{ event.who }}"},
        },
    )
    doc["inputs"] = [{"name": "n", "type": "integer", "required": True}]

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p", inputs={"n": 3}, event={"who": "alice"})
        assert row.status == "succeeded", row.error
        assert row.state["a"] == {"n": 3, "text": "n=3"}
        assert row.state["b"] == "n=3 and alice"
        steps = await h.steps(row.run_id)
        assert {k: s.status for k, s in steps.items()} == {
            "t": "succeeded",
            "a": "succeeded",
            "b": "succeeded",
            "end": "succeeded",
        }
        assert steps["b"].input == {"value": "n=3 and alice"}
        assert steps["a"].attempt == 1

    run(store, tmp_path, scenario)


def test_parallel_branches_and_a_join_with_an_append_reducer(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>a t>b a>j b>j j>c c>end",
        a={
            "kind": "listen",
            "bodyKey": "test.record",
            "outputKey": "found",
            "inputs": {"sleep": 0.4, "value": "from-a"},
        },
        b={
            "kind": "listen",
            "bodyKey": "test.record",
            "outputKey": "found",
            "inputs": {"sleep": 0.3, "value": ["from-b1", "from-b2"]},
        },
        j="join",
        c={
            "kind": "listen",
            "bodyKey": "test.record",
            "outputKey": "count",
            "inputs": {"sleep": 0, "value": "{{ found | length }}"},
        },
    )
    doc["reducers"] = {"found": "append"}

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p")
        assert row.status == "succeeded", row.error
        assert sorted(row.state["found"]) == ["from-a", "from-b1", "from-b2"]
        assert row.state["count"] == 3  # a lone placeholder keeps its type
        spans = {name: (s, e) for name, s, e in h.intervals}
        assert max_overlap([i for i in h.intervals if i[0] in "ab"]) == 2
        steps = await h.steps(row.run_id)
        join_started = steps["j"].started_at
        assert join_started >= max(steps["a"].finished_at, steps["b"].finished_at)
        assert spans["c"][0] >= max(spans["a"][1], spans["b"][1])

    run(store, tmp_path, scenario)


def test_router_takes_one_branch_and_skips_the_other(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>r r>fix:bug r>write:docs r>other:other fix>merge write>merge other>merge merge>end",
        r={
            "kind": "router",
            "bodyKey": "pipeline.condition",
            "outputKey": "route",
            "extras": {
                "switchKey": "inputs.label",
                "cases": {"bug": "bug", "docs": "docs"},
                "default": "other",
            },
        },
        fix={"kind": "listen", "bodyKey": "test.echo", "inputs": {"value": "fixed"}},
        write={"kind": "listen", "bodyKey": "test.echo", "inputs": {"value": "written"}},
        other={"kind": "listen", "bodyKey": "test.echo", "inputs": {"value": "other"}},
        merge={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "merged",
            "inputs": {"value": "merged after {{ route }}"},
        },
    )
    doc["inputs"] = [{"name": "label", "type": "string"}]

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p", inputs={"label": "This is a BUG report"})
        assert row.status == "succeeded", row.error
        assert row.state["merged"] == "merged after bug"
        steps = await h.steps(row.run_id)
        assert steps["r"].routes == ["bug"]
        assert [steps[n].status for n in ("fix", "write", "other", "merge")] == [
            "succeeded",
            "skipped",
            "skipped",
            "succeeded",
        ]
        row = await h.run("p", inputs={"label": "question"})
        steps = await h.steps(row.run_id)
        assert row.state["route"] == "other"
        assert [steps[n].status for n in ("fix", "write", "other")] == [
            "skipped",
            "skipped",
            "succeeded",
        ]

    run(store, tmp_path, scenario)


def test_foreach_keeps_its_bound_and_the_input_order(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>each each>end",
        each={
            "kind": "forEach",
            "bodyKey": "test.record",
            "outputKey": "results",
            "extras": {"iterableKey": "inputs.items", "itemKey": "it", "maxConcurrency": 2},
            "inputs": {"sleep": "{{ 0.3 - it * 0.04 }}", "value": "{{ it * 10 }}"},
        },
    )
    doc["inputs"] = [{"name": "items", "type": "array"}]

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p", inputs={"items": [0, 1, 2, 3, 4, 5]})
        assert row.status == "succeeded", row.error
        assert row.state["results"] == [0, 10, 20, 30, 40, 50]
        assert max_overlap(h.intervals) == 2
        steps = await h.steps(row.run_id)
        assert [steps[f"each#{i}"].item for i in range(6)] == [0, 1, 2, 3, 4, 5]
        assert steps["each"].output == [0, 10, 20, 30, 40, 50]
        empty = await h.run("p", inputs={"items": []})
        assert empty.status == "succeeded" and empty.state["results"] == []

    run(store, tmp_path, scenario)


def test_run_limits_max_concurrent_steps_and_max_steps(store: Store, tmp_path: Path) -> None:
    wide = dag_doc(
        "t>a t>b t>c t>d",
        **{
            n: {"kind": "listen", "bodyKey": "test.record", "inputs": {"sleep": 0.3}}
            for n in "abcd"
        },
    )
    wide["config"] = {"maxConcurrentSteps": 2}
    long = dag_doc("t>a a>b b>c", key="long")
    long["config"] = {"maxSteps": 3}

    async def scenario(h: Harness) -> None:
        await h.add(wide)
        await h.add(long)
        row = await h.run("p")
        assert row.status == "succeeded"
        assert len(h.intervals) == 4 and max_overlap(h.intervals) == 2
        row = await h.run("long")
        assert (row.status, row.error_code) == ("failed", "max_steps_exceeded")
        steps = await h.steps(row.run_id)
        assert [steps[n].status for n in "tabc"] == [
            "succeeded",
            "succeeded",
            "succeeded",
            "skipped",
        ]

    run(store, tmp_path, scenario)


def test_retries_back_off_then_succeed_or_fail_the_run(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>a a>end",
        a={
            "kind": "listen",
            "bodyKey": "test.flaky",
            "outputKey": "a",
            "inputs": {"fails": "{{ inputs.fails }}"},
            "retry": {"attempts": 3, "backoff": "linear", "delaySeconds": 0.2},
        },
    )
    doc["inputs"] = [{"name": "fails", "type": "integer"}]

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p", inputs={"fails": 2})
        assert row.status == "succeeded", row.error
        assert row.state["a"] == {"attempt": 3}
        times = [t for _, _, t in h.attempts]
        assert [a for _, a, _ in h.attempts] == [1, 2, 3]
        assert times[1] - times[0] >= 0.2 and times[2] - times[1] >= 0.4  # linear: 1×, 2×
        h.attempts.clear()
        row = await h.run("p", inputs={"fails": 5})
        assert (row.status, row.error_code) == ("failed", "flaky")
        assert "attempt 3 failed" in row.error
        assert len(h.attempts) == 3
        steps = await h.steps(row.run_id)
        assert (steps["a"].status, steps["a"].attempt) == ("failed", 3)
        assert steps["end"].status == "skipped"

    run(store, tmp_path, scenario)


def test_continue_on_fail_keeps_the_error_in_state(store: Store, tmp_path: Path) -> None:
    doc = dag_doc(
        "t>bad t>good bad>after good>after after>end",
        bad={
            "kind": "listen",
            "bodyKey": "test.fail",
            "continueOnFail": True,
            "inputs": {"message": "disk full"},
        },
        good={"kind": "listen", "bodyKey": "test.echo", "inputs": {"value": 1}},
        after={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "after",
            "inputs": {"value": "{{ _stepErrors.bad }}"},
        },
    )

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        row = await h.run("p")
        assert row.status == "succeeded", row.error
        assert row.state["_stepErrors"] == {"bad": "RuntimeError: disk full"}
        assert row.state["after"] == "RuntimeError: disk full"
        steps = await h.steps(row.run_id)
        assert (steps["bad"].status, steps["bad"].error_code) == ("failed", "body_error")

    run(store, tmp_path, scenario)


def test_cancel_skips_pending_and_cancels_running_and_suspended(
    store: Store, tmp_path: Path
) -> None:
    doc = dag_doc(
        "t>slow t>gate slow>after after>end gate>end",
        slow={"kind": "listen", "bodyKey": "test.block"},
        gate={"kind": "listen", "bodyKey": "human.gate"},
    )

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        run_id = await h.start("p")

        async def _ready() -> bool:
            steps = await h.steps(run_id)
            return steps["slow"].status == "running" and steps["gate"].status == "suspended"

        await h.wait(_ready, what="slow running and gate suspended")
        await h.engine.cancel(run_id, actor="admin:test", reason="no longer needed")
        row = await h.get(run_id)
        assert (row.status, row.error_code) == ("cancelled", "cancelled")
        steps = await h.steps(run_id)
        assert {n: steps[n].status for n in ("slow", "gate", "after", "end")} == {
            "slow": "cancelled",
            "gate": "cancelled",
            "after": "skipped",
            "end": "skipped",
        }

        async def _stopped() -> bool:
            return h.cancelled == ["slow"]

        await h.wait(_stopped, timeout=30, what="the running body was cancelled")
        again = await h.engine.cancel(run_id)
        assert again.status == "cancelled"

    run(store, tmp_path, scenario)


def test_dedupe_disabled_templates_and_unregistered_bodies(store: Store, tmp_path: Path) -> None:
    doc = dag_doc("t>a a>end", a={"kind": "listen", "bodyKey": "no.such.body"})
    off = dag_doc("t>a", key="off")
    off["enabled"] = False

    async def scenario(h: Harness) -> None:
        await h.add(doc)
        await h.add(off)
        first = await h.engine.start("p", dedupe_key="evt-1")
        second = await h.engine.start("p", dedupe_key="evt-1")
        assert first.created and not second.created
        assert second.run.run_id == first.run.run_id
        row = await h.finished(first.run.run_id)
        assert (row.status, row.error_code) == ("failed", "unregistered_body")
        steps = await h.steps(row.run_id)
        assert steps["a"].error == "no body is registered under 'no.such.body'"
        with pytest.raises(PipelineError) as caught:
            await h.engine.start("off")
        assert caught.value.code == "template_disabled"
        with pytest.raises(PipelineError) as caught:
            await h.engine.start("nope")
        assert caught.value.code == "template_not_found"

    run(store, tmp_path, scenario)


def test_suspended_step_timeout_fails_a_gate_but_not_an_approval_step(
    store: Store, tmp_path: Path
) -> None:
    gate = dag_doc("t>g g>end", key="gate", g={"kind": "listen", "bodyKey": "human.gate"})
    gate["config"] = {"suspendedStepTimeout": 0.3}
    approval = dag_doc(
        "t>g g>end",
        key="approval",
        g={
            "kind": "listen",
            "bodyKey": "orchestration.awaitApproval",
            "extras": {"awaitApproval": True},
        },
    )
    approval["config"] = {"suspendedStepTimeout": 0.3}

    async def scenario(h: Harness) -> None:
        await h.add(gate)
        await h.add(approval)
        waiting = await h.start("approval")
        row = await h.run("gate", timeout=10)
        assert (row.status, row.error_code) == ("failed", "suspended_timeout")
        assert (await h.steps(row.run_id))["g"].status == "failed"
        await asyncio.sleep(0.5)
        assert await h.step_status(waiting, "g") == "suspended"
        status, answer = await h.engine.decide(waiting, "g", approve=True, actor="admin:bob")
        assert status == 200 and answer["decision"] == "approved"
        row = await h.finished(waiting)
        assert row.status == "succeeded"

    run(store, tmp_path, scenario)


def test_a_child_that_ended_without_waking_its_parent_still_wakes_it(
    store: Store, tmp_path: Path
) -> None:
    """The crash case: a child run ends in a transaction whose process dies before the
    next one wakes the parent's call step (an hour's poll). The engine notices the
    finished child and wakes the step itself."""
    child = dag_doc(
        "t>g", key="child", g={"kind": "listen", "bodyKey": "human.gate", "outputKey": "gate"}
    )
    parent = dag_doc(
        "t>call call>end",
        call={
            "kind": "listen",
            "bodyKey": "flow.callPipeline",
            "outputKey": "child",
            "extras": {"templateKey": "child", "pollSeconds": 3600},
        },
    )

    async def scenario(h: Harness) -> None:
        for doc in (child, parent):
            await h.add(doc)
        parent_id = await h.start("p")

        async def waiting_child() -> str | None:
            call = (await h.steps(parent_id))["call"]
            child_id = ((call.suspend or {}).get("data") or {}).get("childRunId")
            if call.status != "suspended" or not child_id:
                return None
            gate = (await h.steps(child_id)).get("g")
            return str(child_id) if gate is not None and gate.status == "suspended" else None

        child_id = await h.wait(waiting_child, what="the child's gate waits")
        # The decision as the dying process made it: committed, and nobody woken.
        status, _ = await h.store.write(
            partial(
                steps.decide,
                run_id=child_id,
                step_id="g",
                item_index=NODE_ROW,
                approve=True,
                actor="admin:bob",
                reason=None,
            )
        )
        assert status == 200 and (await h.get(child_id)).status == "succeeded"
        row = await h.finished(parent_id, timeout=30)
        assert row.status == "succeeded", row.error
        assert row.state["child"]["gate"]["decision"] == "approved"

    run(store, tmp_path, scenario)


def test_call_pipeline_runs_a_child_and_outputs_its_state(store: Store, tmp_path: Path) -> None:
    child = dag_doc(
        "t>work",
        key="child",
        work={
            "kind": "listen",
            "bodyKey": "test.echo",
            "outputKey": "answer",
            "inputs": {"value": "child saw {{ inputs.q }}"},
        },
    )
    child["inputs"] = [{"name": "q", "type": "string"}]
    parent = dag_doc(
        "t>call call>end",
        call={
            "kind": "listen",
            "bodyKey": "flow.callPipeline",
            "outputKey": "child",
            "inputs": {"q": "{{ inputs.q }}"},
            # An hour's poll: only the child's wake-up can end the call within the test.
            "extras": {"templateKey": "child", "pollSeconds": 3600},
        },
    )
    parent["inputs"] = [{"name": "q", "type": "string"}]
    selfish = dag_doc(
        "t>call",
        key="selfish",
        call={
            "kind": "listen",
            "bodyKey": "flow.callPipeline",
            "extras": {"templateKey": "selfish"},
        },
    )

    async def scenario(h: Harness) -> None:
        for doc in (child, parent, selfish):
            await h.add(doc)
        row = await h.run("p", inputs={"q": "why"}, timeout=60)  # woken, not polled
        assert row.status == "succeeded", row.error
        assert row.state["child"]["answer"] == "child saw why"
        steps = await h.steps(row.run_id)
        child_id = steps["call"].suspend["data"]["childRunId"]
        child_row = await h.get(child_id)
        assert (child_row.parent_run_id, child_row.trigger_type) == (
            row.run_id,
            "pipeline",
        )
        row = await h.run("selfish")
        assert (row.status, row.error_code) == ("failed", "recursive_pipeline")

    run(store, tmp_path, scenario)


HOSTILE = "$(touch PWNED1); `touch PWNED2`; \"dq\" 'sq' ${HOME}\nline2; rm -rf / #"


def test_bash_script_gets_state_values_only_as_environment(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGEFLOW_ADMIN_TOKEN", "never-reaches-a-script")
    doc = dag_doc(
        "t>s s>end",
        s={
            "kind": "listen",
            "bodyKey": "pipeline.bashScript",
            "outputKey": "s",
            "inputs": {"evil": "{{ inputs.evil }}", "data": {"list": "{{ inputs.list }}"}},
            "extras": {
                "script": 'printf "%s" "$FF_EVIL" > evil.txt; printf "%s" "$FF_DATA" '
                '> data.txt; env > env.txt; echo "done in $(basename $PWD)"'
            },
        },
    )
    doc["inputs"] = [{"name": "evil", "type": "string"}, {"name": "list", "type": "array"}]
    failing = dag_doc(
        "t>s",
        key="failing",
        s={
            "kind": "listen",
            "bodyKey": "pipeline.bashScript",
            "extras": {"script": "echo oops >&2; exit 3"},
        },
    )
    slow = dag_doc(
        "t>s",
        key="slow",
        s={
            "kind": "listen",
            "bodyKey": "pipeline.bashScript",
            "extras": {"script": "sleep 5", "timeoutSeconds": 0.3},
        },
    )

    async def scenario(h: Harness) -> None:
        for d in (doc, failing, slow):
            await h.add(d)
        row = await h.run("p", inputs={"evil": HOSTILE, "list": ["a'b", "c\nd"]})
        assert row.status == "succeeded", row.error
        workdir = tmp_path / "scratch" / row.run_id
        assert (workdir / "evil.txt").read_text() == HOSTILE
        assert (workdir / "data.txt").read_text() == '{"list": ["a\'b", "c\\nd"]}'
        assert not list(workdir.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
        env = (workdir / "env.txt").read_text()
        assert "FORGEFLOW_" not in env and "never-reaches-a-script" not in env
        assert row.state["s"]["stdout"] == f"done in {row.run_id}"
        row = await h.run("failing")
        assert (row.status, row.error_code) == ("failed", "script_failed")
        assert "exit code 3: oops" in row.error
        row = await h.run("slow")
        assert (row.status, row.error_code) == ("failed", "step_timeout")

    run(store, tmp_path, scenario)
