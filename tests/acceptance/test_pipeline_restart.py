"""A real ``forgeflow serve`` killed with ``kill -9`` in the middle of two runs: after
the restart the interrupted idempotent step runs again and its run goes on, and the
step declared ``idempotent: false`` fails its run instead of running twice."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.support.cluster import wait_for
from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.process import clean_env, free_port, start_serve, wait_healthy

TEMPLATE = """
key: {key}
name: Slow then fast
enabled: true
nodes:
  - {{id: start, kind: trigger}}
  - {{id: slow, kind: listen, bodyKey: pipeline.bashScript, outputKey: slow,
     extras: {{script: "echo started >> runs.txt; sleep 2; echo slept", idempotent: {idem}}}}}
  - {{id: after, kind: listen, bodyKey: pipeline.bashScript, outputKey: after,
     extras: {{script: "echo after"}}}}
  - {{id: done, kind: terminal}}
edges:
  - {{from: start, to: slow}}
  - {{from: slow, to: after}}
  - {{from: after, to: done}}
triggers: [{{type: manual}}]
"""


def _serve(env: dict[str, str], log: Path, url: str) -> subprocess.Popen[bytes]:
    proc = start_serve(env, stderr_path=log)
    wait_healthy(url, proc)
    return proc


def _run(admin: httpx.Client, run_id: str) -> dict[str, Any]:
    run: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
    return run


def _step(run: dict[str, Any], step_id: str) -> dict[str, Any]:
    return next(s for s in run["steps"] if s["stepId"] == step_id)


def test_kill_9_mid_run_then_the_runs_continue_or_fail_safely(tmp_path: Path, db_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(
        FORGEFLOW_DATA_DIR=str(tmp_path / "data"),
        FORGEFLOW_DATABASE_URL=db_url,
        FORGEFLOW_PORT=str(port),
        FORGEFLOW_ADMIN_TOKEN=ADMIN_TOKEN,
        FORGEFLOW_POLL_SECONDS="0.2",
    )
    log = tmp_path / "serve.log"
    proc = _serve(env, log, url)
    admin = httpx.Client(
        base_url=url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    try:
        runs = {}
        for key, idem in (("again", "true"), ("once", "false")):
            doc = TEMPLATE.format(key=key, idem=idem)
            r = admin.post(
                "/api/pipelines/templates", content=doc, headers={"Content-Type": "text/yaml"}
            )
            assert r.status_code == 201, r.text
            r = admin.post(f"/api/pipelines/templates/{key}/runs", json={"requestId": key})
            runs[key] = r.json()["run"]["runId"]
        wait_for(
            lambda: all(
                _step(_run(admin, rid), "slow")["status"] == "running" for rid in runs.values()
            ),
            what="both slow steps running",
        )
        # "running" is recorded before the jail starts the script: kill only once each
        # script has written its line, the effect the assertions below count.
        workdir = tmp_path / "data" / "pipelines"
        wait_for(
            lambda: all((workdir / rid / "runs.txt").is_file() for rid in runs.values()),
            what="both slow scripts started",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc = _serve(env, log, url)
        done = {
            key: wait_for(lambda rid=rid: (x := _run(admin, rid))["status"] != "running" and x)
            for key, rid in runs.items()
        }
    finally:
        admin.close()
        proc.terminate()
        proc.wait(timeout=30)

    again = done["again"]
    assert again["status"] == "succeeded", again
    slow = _step(again, "slow")
    assert (slow["status"], slow["attempt"]) == ("succeeded", 2)
    assert again["state"]["slow"]["stdout"] == "slept"
    assert again["state"]["after"]["stdout"] == "after"
    assert (workdir / again["runId"] / "runs.txt").read_text() == "started\nstarted\n"

    once = done["once"]
    assert (once["status"], once["errorCode"]) == ("failed", "interrupted_non_idempotent")
    assert _step(once, "slow")["status"] == "failed" and _step(once, "slow")["attempt"] == 1
    assert _step(once, "after")["status"] == "skipped"
    assert (workdir / once["runId"] / "runs.txt").read_text() == "started\n"
