"""An environment per repository (issue #26): what a repository's environment costs its
turns, beside the same turns on the host's system, in the same run. Run by hand, never
by pytest:

    .venv/bin/python bench/environments.py --rounds 2      # ≈ 3 minutes on 2 cores

Each round starts a fresh, real ``forgeflow serve`` (SQLite, the pinned ``codex
app-server`` in its bubblewrap jail, the testkit's scripted model server, the Gitea
emulator in this process) with a roots folder of its own, so its root is built cold.
After one untimed mention (broker and tools up), two new repositories get the same
three mentions on one issue, timed from posting the comment to the model's first
request and to the task's end (its answer posted):

first        the first mention: clone, app-server start, turn; on the environment's
             repository also the root's build (``mmdebstrap``, package ``hello`` and
             forgeflow's base packages) and the setup script (one ``hello`` call);
next         a follow-up right after it, its app-server still running;
after idle   a follow-up once that app-server stopped (FORGEFLOW_AGENT_IDLE_SECONDS):
             a new app-server starts on the same system.

One repository has no environment (the host's system: the floor), the other declares
``{"packages": ["hello"], "setupScript": "ci/env-setup.sh"}``. The build's and the
setup's own durations come from forgeflow's rows (``environment_roots``,
``environment_setups``); the disk a root takes is ``du`` of its folder (hard links
counted once). ``--roots DIR`` uses a kept roots folder instead (a root found there is
not built again: a second run measures the warm case only). Writes
bench/results/environments-<timestamp>.json, prints its figures as one JSON line and a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ADMIN_TOKEN,
    OWNER,
    ROOT,
    SECRET,
    TERMINAL,
    Serve,
    World,
    answering_model,
    codex_serve,
    epoch,
    machine,
    scratch,
    summary_ms,
    wait_for,
    write_result,
)
from forgeflow.agent.envroot import BASE_PACKAGES, host_suite
from forgeflow.domain.environment import Environment, root_key
from forgeflow_testkit.agents import read_turn
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel
from sessions import idle

Result = dict[str, Any]
PACKAGES = ("hello",)
SETUP = "ci/env-setup.sh"
SETUP_TEXT = 'hello > "$HOME/setup-marker"\ncat "$HOME/setup-marker"\n'
KINDS = ("first", "next", "after_idle")
IDLE_SECONDS = 8  # long enough for "next" to find its app-server, short to wait out


@dataclass
class Turn:
    task_id: str
    request_s: float  # mention posted → the model's first request
    answer_s: float  # mention posted → the task ended (its answer posted)


def timed_turn(serve: Serve, world: World, model: ScriptedModel, repo: str, timeout: float) -> Turn:
    """One mention on issue 1 of ``repo``, timed; checks that its turn asked the model."""
    seen, t0 = len(model.requests), time.monotonic()
    m = world.mention(repo, 1)
    request = wait_for(lambda: first_request(serve, model, seen, m.task_id), timeout, repo, 0.05)
    state = serve.wait_terminal([m.task_id], timeout)[m.task_id]
    ended = time.monotonic()
    ask = read_turn(request)
    if state != "succeeded" or ask is None or m.task_id not in ask.marker:
        raise RuntimeError(f"task {m.task_id} on {repo}: {state}, first request {ask}")
    world.emu.flush_deliveries()
    time.sleep(0.2)
    return Turn(m.task_id, request.received_at - t0, ended - t0)


def first_request(
    serve: Serve, model: ScriptedModel, seen: int, task_id: str
) -> RecordedRequest | None:
    """The model's request after the first ``seen``; raises when the task ended before
    asking (a failed build or setup), naming its error."""
    asked = model.requests
    if len(asked) > seen:
        return asked[seen]
    rows = serve.query(
        "SELECT state, error_code, execution_error FROM tasks WHERE task_id = ?", [task_id]
    )
    if rows and rows[0][0] in TERMINAL:
        if len(asked := model.requests) > seen:  # asked, then ended, between the reads
            return asked[seen]
        raise RuntimeError(f"task {task_id} ended {rows[0][0]} before a turn: {rows[0][1:]}")
    return None


def add_repo(world: World, serve: Serve, name: str) -> None:
    """A repository holding the setup script (both do: the clones are alike), its hook
    added after the push so that no push delivery is in the way."""
    world.add_repo(name, 1, None)
    world.emu.push_branch(OWNER, name, "main", {SETUP: SETUP_TEXT}, message="setup script")
    url = serve.url + "/api/gitea/webhook"
    world.emu.add_hook(OWNER, name, url=url, secret=SECRET, events=None)


def declare(serve: Serve, repo: str) -> None:
    path = f"/api/gitea-workflow/repos/default:{OWNER}/{repo}/environment"
    environment = {"packages": list(PACKAGES), "setupScript": SETUP}
    body: Result = {"requestId": f"env-{repo}", "reason": "bench", "environment": environment}
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = httpx.put(serve.url + path, json=body, headers=auth, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"PUT {path}: {r.status_code} {r.text}")


def three_turns(
    serve: Serve, world: World, model: ScriptedModel, repo: str, timeout: float
) -> dict[str, Turn]:
    turns = {"first": timed_turn(serve, world, model, repo, timeout)}
    turns["next"] = timed_turn(serve, world, model, repo, 180)
    idle(serve)
    turns["after_idle"] = timed_turn(serve, world, model, repo, 180)
    return turns


def steps(serve: Serve, repo: str, key: str, first: Turn) -> Result:
    """The build's and the setup's durations from forgeflow's rows; checks that the
    setup ran once, in the first task, on the root, and said what ``hello`` says."""
    roots = serve.query(
        "SELECT state, started_at, finished_at, size_bytes FROM environment_roots"
        " WHERE root_key = ?",
        [key],
    )
    setups = serve.query(
        "SELECT state, started_at, finished_at, task_id, log, root_key FROM environment_setups"
        " WHERE repo_key = ?",
        [f"default:{OWNER}/{repo}"],
    )
    if len(setups) != 1:
        raise RuntimeError(f"{repo}: no setup row")
    state, started, finished, task_id, log, setup_root = setups[0]
    if state != "ready" or task_id != first.task_id or setup_root != key:
        raise RuntimeError(f"{repo}: setup {state} in {task_id} on {setup_root}: {log}")
    if "Hello, world!" not in (log or ""):
        raise RuntimeError(f"{repo}: the setup did not run hello: {log}")
    out: Result = {"setup_s": round(epoch(finished) - epoch(started), 3), "root_built": False}
    if roots:  # no row: the root was found ready in a kept folder
        r_state, r_started, r_finished, size = roots[0]
        if r_state != "ready":
            raise RuntimeError(f"root {key}: {r_state}")
        out |= {"root_built": True, "build_s": round(epoch(r_finished) - epoch(r_started), 3)}
        out["forgeflow_size_bytes"] = size
    return out


def disk(path: Path) -> Result:
    """What the root takes: ``du`` (each inode once) allocated and apparent, and how
    many Debian packages it holds."""

    def du(*flags: str) -> int:
        done = subprocess.run(
            ["du", "-s", "-x", "--block-size=1", *flags, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout.split()[0])

    listed = subprocess.run(
        ["dpkg-query", f"--admindir={path / 'var/lib/dpkg'}", "-W", "-f", "${Status}\n"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    installed = sum(1 for line in listed if line.endswith(" installed"))
    return {"du_bytes": du(), "du_apparent_bytes": du("--apparent-size"), "packages": installed}


def one_round(root: Path, k: int, model: ScriptedModel, roots: Path, key: str) -> Result:
    world = World(root / f"r{k}")
    serve = codex_serve(
        world,
        root / f"serve-{k}",
        root / "codex-home",
        model,
        FORGEFLOW_AGENT_IDLE_SECONDS=str(IDLE_SECONDS),
        FORGEFLOW_ENVIRONMENT_ROOTS=str(roots),
    )
    try:
        add_repo(world, serve, "warmup")  # untimed: broker, tools, the first app-server
        timed_turn(serve, world, model, "warmup", 180)
        idle(serve)
        add_repo(world, serve, "host")
        host = three_turns(serve, world, model, "host", 180)
        idle(serve)
        add_repo(world, serve, "env")
        declare(serve, "env")
        envs = three_turns(serve, world, model, "env", 2100)
        out = steps(serve, "env", key, envs["first"])
    finally:
        serve.stop()
        world.stop()
    out["disk"] = disk(roots / key)
    out["host"] = {kind: asdict(t) for kind, t in host.items()}
    out["env"] = {kind: asdict(t) for kind, t in envs.items()}
    return out


def run(root: Path, rounds: int, kept_roots: Path | None, keep: bool) -> Result:
    key = root_key(Environment(packages=PACKAGES), host_suite(), BASE_PACKAGES)
    assert key is not None
    model = answering_model()
    out: Result = {"machine": machine(), "rounds": rounds, "packages": list(PACKAGES)}
    out |= {"suite": host_suite(), "root_key": key.key, "kept_roots": str(kept_roots or "")}
    per_round: list[Result] = []
    try:
        for k in range(rounds):
            print(f"round {k + 1}/{rounds} …", file=sys.stderr, flush=True)
            roots = kept_roots or root / f"roots-{k}"
            per_round.append(one_round(root, k, model, roots, key.key))
            if kept_roots is None and not keep:  # one root on disk at a time
                shutil.rmtree(roots, ignore_errors=True)
    finally:
        model.stop()
    out["loadavg_1m_after"] = os.getloadavg()[0]
    out["per_round"] = per_round
    return out | figures(per_round)


def figures(per_round: list[Result]) -> Result:
    """p50s of each series over the rounds, and the environment ÷ the host's system."""
    out: Result = {}
    cold = [r for r in per_round if r["root_built"]]
    for side in ("host", "env"):
        for kind in KINDS:
            rows = cold if side == "env" and kind == "first" else per_round
            for what in ("request_s", "answer_s"):
                series = [r[side][kind][what] for r in rows]
                out[f"{side}_{kind}_{what[:-2]}"] = summary_ms(series) if series else None
    found = [r for r in per_round if not r["root_built"]]
    for what in ("request_s", "answer_s"):  # first turns on a root found ready
        series = [r["env"]["first"][what] for r in found]
        out[f"env_first_root_found_{what[:-2]}"] = summary_ms(series) if series else None
    for kind in KINDS:
        for what in ("request", "answer"):
            env, host = out[f"env_{kind}_{what}"], out[f"host_{kind}_{what}"]
            ratio = round(env["p50_ms"] / host["p50_ms"], 2) if env and host else None
            out[f"ratio_{kind}_{what}_p50"] = ratio
    out["build"] = summary_ms([r["build_s"] for r in cold]) if cold else None
    # The cold first answer less its build and setup: compare with the host's first.
    rest = [r["env"]["first"]["answer_s"] - r["build_s"] - r["setup_s"] for r in cold]
    out["env_first_answer_less_build_setup"] = summary_ms(rest) if rest else None
    out["setup"] = summary_ms([r["setup_s"] for r in per_round])
    out["disk"] = per_round[-1]["disk"]
    # What forgeflow records and shows operators (lstat sizes summed, links not merged).
    out["forgeflow_size_bytes"] = cold[-1]["forgeflow_size_bytes"] if cold else None
    return out


def ms(figure: Result | None) -> str:
    return "–" if figure is None else f"{figure['p50_ms']:,.0f} ms"


def markdown(res: Result) -> str:
    label = {"first": "first mention", "next": "follow-up, app-server running"}
    label["after_idle"] = "follow-up after idle"
    lines = [
        "| p50 over the rounds | host's system (floor) | environment `hello` | env ÷ host |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        for what, says in (("request", "first model request"), ("answer", "answer")):
            env, host = res[f"env_{kind}_{what}"], res[f"host_{kind}_{what}"]
            ratio = res[f"ratio_{kind}_{what}_p50"]
            cells = f"{ms(host)} | {ms(env)} | {'–' if ratio is None else f'{ratio}×'}"
            lines.append(f"| {label[kind]} → {says} | {cells} |")
    for what in ("request", "answer"):
        found = res[f"env_first_root_found_{what}"]
        if found is not None:
            lines.append(f"| first mention, root found ready → {what} | – | {ms(found)} | – |")
    rest = res["env_first_answer_less_build_setup"]
    if rest is not None:
        lines.append(f"| first mention → answer, less build and setup | – | {ms(rest)} | – |")
    d = res["disk"]
    lines.append("")
    lines.append(
        f"build {ms(res['build'])}, setup {ms(res['setup'])}; a root takes"
        f" {d['du_bytes'] / 1e6:,.0f} MB (du; apparent {d['du_apparent_bytes'] / 1e6:,.0f} MB),"
        f" {d['packages']} packages"
    )
    if res["forgeflow_size_bytes"] is not None:
        lines[-1] += f"; forgeflow's sizeBytes {res['forgeflow_size_bytes'] / 1e6:,.0f} MB"
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="fresh serves, each with a cold root")
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (and every round's root)"
    )
    p.add_argument("--roots", type=Path, help="a kept roots folder (a root there is reused)")
    args = p.parse_args()
    if shutil.which("mmdebstrap") is None:
        print("mmdebstrap is missing: run scripts/setup.sh", file=sys.stderr)
        return 2
    kept = args.roots.resolve() if args.roots else None
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
    # Not under /tmp: there Codex declines to make its helper binaries in CODEX_HOME.
    with scratch("forgeflow-environments-", keep=args.keep, parent="/var/tmp") as root:
        res = run(root, args.rounds, kept, args.keep)
    out = write_result("environments", res)
    print(json.dumps({k: v for k, v in res.items() if k != "per_round"}, separators=(",", ":")))
    print(markdown(res))
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
