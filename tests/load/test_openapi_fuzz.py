"""Schemathesis against a live forgeflow, from its own ``/openapi.json``.

The ``schemathesis run`` command (a separate process; traffic to 127.0.0.1 only) tests
every operation of a forgeflow running in this process that holds a few real tasks, a
repository and audit rows: the coverage phase (boundary and edge values of every
parameter) and the fuzzing phase (a bounded number of generated requests each), with the
bearer token (the document declares the ``bearerAuth`` scheme). Every schemathesis check
runs ("all": no 5xx; status code, content type, headers and body as declared; invalid
input refused; valid input accepted; 401 without the token; 405 with a true ``Allow``
for undeclared methods), except where tests/load/schemathesis.toml switches one off for
an operation and says why. Runs on both drivers: PostgreSQL refuses input that SQLite
takes (NUL characters, integers beyond its column types), which is where the fuzzer
found 500s. ``FORGEFLOW_FUZZ_SEED`` replays another seed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import ADMIN_TOKEN, WEBHOOK_SECRET, Running, run_forgeflow

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
EXAMPLES = 15  # fuzzing-phase examples per operation; the coverage phase adds its own
# No --checks option: schemathesis' default is every check, and an explicit list on the
# command line would override the per-operation exceptions of the config file.
CONFIG = Path(__file__).with_name("schemathesis.toml")


def _seed(ff: Running, tmp_path: Path) -> None:
    """Three accepted mentions (tasks, a repository, audit rows) and one operator action,
    so list and detail routes answer with real items for the schema check."""
    with GiteaEmulator(tmp_path / "gitea") as emu, httpx.Client(timeout=30) as client:
        emu.add_user("alice")
        emu.add_repo("acme", "widget")
        emu.set_permission("acme", "widget", "alice", "write")
        number = emu.add_issue("acme", "widget", title="seed", author="alice")
        for i in range(3):
            comment = emu.post_comment(
                "acme", "widget", number, author="alice", body=f"@ccweb-bot seed {i}"
            )
            payload = emu.comment_payload("acme", "widget", number, comment, sender="alice")
            headers, body = emu.build_delivery(
                "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
            )
            assert client.post(ff.webhook_url, content=body, headers=headers).status_code == 202
    with ff.admin() as admin:
        answer = admin.post("/api/gitea-workflow/control/pause", json={"requestId": "seed"})
        assert answer.status_code == 200, answer.text
        # One pipeline run, so the run list answers with a real item too.
        seed = {
            "key": "fuzz_seed",
            "name": "seed",
            "enabled": True,
            "nodes": [
                {"id": "trigger", "kind": "trigger", "bodyKey": "pipeline.trigger"},
                {"id": "done", "kind": "terminal"},
            ],
            "edges": [{"from": "trigger", "to": "done"}],
            "triggers": [{"type": "manual"}],
        }
        assert admin.post("/api/pipelines/templates", json=seed).status_code == 201
        answer = admin.post(
            "/api/pipelines/templates/fuzz_seed/runs", json={"requestId": "seed-run", "inputs": {}}
        )
        assert answer.status_code == 201, answer.text


@pytest.fixture
def live(tmp_path: Path, db_url: str) -> Iterator[Running]:
    # The fuzzer sends thousands of requests without the token from one address: past the
    # per-address allowance they would be refused unchecked (429), its own test elsewhere.
    allowance = {"auth_failures_allowed": 1_000_000}
    with run_forgeflow(tmp_path / "ff", db_url, trigger_permission="none", **allowance) as ff:
        _seed(ff, tmp_path)
        yield ff


def test_no_server_error_and_answers_match_the_schema(
    live: Running, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    seed = os.environ.get("FORGEFLOW_FUZZ_SEED", "20261130")
    command = [
        SCHEMATHESIS,
        "--config-file",
        str(CONFIG),
        "run",
        f"{live.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        seed,
        # One worker: with threads, Hypothesis' lambda descriptions hit CPython 3.11's
        # "AST constructor recursion depth mismatch" inside schemathesis' coverage phase.
        "--workers",
        "1",
        "--request-timeout",
        "30",
    ]
    started = time.monotonic()
    run = subprocess.run(
        command,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
        | {"NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    seconds = time.monotonic() - started
    output = run.stdout.replace(ADMIN_TOKEN, "[admin token]") + run.stderr
    cases = re.search(r"(\d+) generated, .*", output)
    figures = (
        f"openapi fuzz ({live.services.store.dialect}, seed {seed}): "
        f"{cases.group(0) if cases else 'no summary'} in {seconds:.1f} s, exit {run.returncode}"
    )
    record_property("figures", figures)
    print(figures)
    assert run.returncode == 0, output[-8000:]
    spec = httpx.get(f"{live.url}/openapi.json", timeout=30).json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    tested = re.search(r"Tested: (\d+)", output)
    assert tested is not None and int(tested.group(1)) == operations, output[-3000:]


# The exact inputs that answered 500 before the API layer checked them (found by this
# fuzzer; the NUL ones only on PostgreSQL, the large integers on both drivers).
FOUND: list[tuple[str, str, dict[str, str] | None]] = [
    ("GET", "/api/gitea-workflow/tasks?offset=9223372036854775808", None),
    ("GET", "/api/pipelines/runs?offset=138523034462713102204928", None),
    ("GET", "/api/gitea-workflow/audit?afterSeq=2147483648", None),
    # A valid RFC 3339 time whose UTC value falls before year 1.
    ("GET", "/api/gitea-workflow/audit?since=0001-01-01T00:00:00%2B05:00", None),
    ("GET", "/api/gitea-workflow/tasks?repoKey=a%00b", None),
    ("GET", "/api/gitea-workflow/tasks/a%00b", None),
    ("POST", "/api/gitea-workflow/tasks/a%00b/release", {"requestId": "r1"}),
    ("POST", "/api/gitea-workflow/control/pause", {"requestId": "p\u0000"}),
    ("POST", "/api/gitea-workflow/repos/x/disable", {"requestId": "d", "reason": "\u0000"}),
    ("POST", "/api/pipelines/runs/r/cancel", {"requestId": "c\u0000"}),
    ("POST", "/api/pipelines/runs/r/steps/s/approve", {"requestId": "a\u0000"}),
]


def test_inputs_the_fuzzer_broke_answer_400(live: Running) -> None:
    with live.admin() as admin:
        for method, path, body in FOUND:
            answer = admin.request(method, path, json=body)
            assert answer.status_code == 400, (method, path, answer.text)
            assert answer.json()["error"] == "invalid_request", answer.text


def test_405_names_every_method_of_the_path(live: Running) -> None:
    """GET and POST /api/pipelines/templates are two routes; Allow must name both."""
    with live.admin() as admin:
        answer = admin.delete("/api/pipelines/templates")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, POST"
