"""Dispatch and latency benchmark: the guard-rails of forgeflow's scheduling, each beside
its floor, in one run on this machine. Run by hand, never by pytest:

    .venv/bin/python bench/latency.py            # ≈ 6 minutes on 2 cores

A Gitea emulator (the testkit's) runs in this process; every scenario starts a fresh,
real `forgeflow serve` on SQLite. Unless said otherwise its agent is the testkit's
scripted runtime, whose turns only wait FORGEFLOW_TEST_TURN_SECONDS and write their
start and end (time.time()) to a trace file.

warm     202 → turn start, one mention at a time on a cloned repository whose sessions
         exist; floor: the 202 itself (comment posted → forgeflow's 202 back).
serial   10 mentions on one repository posted back to back, 2 s turns: no two turns may
         overlap; floor: 10 × the turn.
restart  `serve` started on a database with 10,000 queued tasks (queued through the
         webhook by a `--role ingress` serve): exec → first claim; floor: the same with 1.
burst    first mentions on 200 new repositories, sent at once from 32 connections as
         Gitea's hook queue would: every answer within 2 s, and, until every task has
         ended, a delivery sent again every ~50 ms (the webhook probe) is answered
         within 2 s while the clones run; floor: the same burst against `--role
         ingress` (acceptance alone). `--max-preparations N` sets the serve's
         FORGEFLOW_MAX_PREPARATIONS (a large N: unbounded, as before the bound).
codex    the real path: the pinned `codex app-server` in its bubblewrap jail, driven by
         the testkit's scripted model server; mention → the model's first request. Floor:
         the same app-server and gitea-mcp driven directly (new thread; warm turn).
steps    a no-op pipeline step of forgeflow's engine against a DBOS step, both on
         SQLite; DBOS (PyPI `dbos`) runs in a virtual environment of its own that this
         script makes once (FORGEFLOW_BENCH_DBOS_PYTHON names another interpreter).

Writes bench/results/latency-<timestamp>.json, prints a Markdown table, exits 1 when a
guard-rail is missed. `--only warm,serial` runs some scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from common import (
    CODEX,
    GITEA_MCP,
    OWNER,
    ROOT,
    USER,
    Mention,
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
from forgeflow.agent.jsonrpc import Json, RpcProcess
from forgeflow.agent.oneshot import JailRunner
from forgeflow.pipelines import templates
from forgeflow.pipelines.adapters import LocalWorkspace
from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.definition import load_definition
from forgeflow.pipelines.engine import PipelineEngine
from forgeflow.pipelines.kinds import RunStatus
from forgeflow.pipelines.registry import PipelineBodyRegistry, StepContext
from forgeflow.store import Store
from forgeflow.store import pipelines as pipeline_store
from forgeflow_testkit.agents import read_turn
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.model_server import ScriptedModel

Result = dict[str, Any]


def new_serve(world: World, root: Path, name: str, turn: float, *args: str, **env: str) -> Serve:
    env["FORGEFLOW_TEST_TURN_SECONDS"] = str(turn)
    return Serve(root / name, world.emu.url, world.bot_token, env, args).start()


def finish(serve: Serve, world: World, m: Mention) -> float:
    """Wait for the task to succeed and the emulator's hooks to drain; 202 → turn start."""
    state = serve.wait_terminal([m.task_id], 60)[m.task_id]
    if state != "succeeded":
        raise RuntimeError(f"task {m.task_id} ended {state}")
    world.emu.flush_deliveries()
    time.sleep(0.1)
    return serve.turn_times()[m.task_id][0] - m.accepted


def warm(world: World, root: Path, n: int) -> Result:
    serve = new_serve(world, root, "warm", 0.2)
    try:
        world.add_repo("warm", 5, serve.url)
        for issue in range(1, 6):  # untimed: the clone and each issue's session worktree
            finish(serve, world, world.mention("warm", issue))
        to_start, to_202 = [], []
        for k in range(n):
            m = world.mention("warm", 1 + k % 5)
            to_202.append(m.accepted - m.sent)
            to_start.append(finish(serve, world, m))
    finally:
        serve.stop()
    return {"turn_start": summary_ms(to_start), "floor_202": summary_ms(to_202)}


def serial(world: World, root: Path, count: int, turn: float) -> Result:
    serve = new_serve(world, root, "serial", turn)
    try:
        world.add_repo("serial", count + 1, serve.url)
        finish(serve, world, world.mention("serial", count + 1))  # untimed: the clone
        ms = [world.mention("serial", i) for i in range(1, count + 1)]
        states = serve.wait_terminal([m.task_id for m in ms], 60 + 4 * turn * count)
        turns = serve.turn_times()
    finally:
        serve.stop()
    spans = [(turns[m.task_id][0], turns[m.task_id][1] or 0.0) for m in ms]
    by_start = sorted(spans)
    makespan = max(e for _, e in spans) - ms[0].accepted
    return {
        "succeeded": sum(s == "succeeded" for s in states.values()),
        "tasks": count,
        "overlaps": sum(b[0] < a[1] for a, b in itertools.pairwise(by_start)),
        "fifo": spans == by_start,
        "makespan_s": round(makespan, 3),
        "floor_s": count * turn,
        "overhead": round(makespan / (count * turn) - 1, 4),
    }


def post_all(url: str, requests: list[tuple[dict[str, str], bytes]], conns: int) -> list[Result]:
    """POST every delivery from `conns` threads, each on its own keep-alive connection;
    each answer's status and time from send to answer, with the send's offset."""
    host, port = url.removeprefix("http://").split(":")
    t0 = time.monotonic()

    def worker(share: list[tuple[dict[str, str], bytes]]) -> list[Result]:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        out = []
        for headers, body in share:
            sent = time.monotonic()
            conn.request("POST", "/api/gitea/webhook", body, headers)
            answer = conn.getresponse()
            answer.read()
            done = time.monotonic()
            out.append({"status": answer.status, "at_s": sent - t0, "s": done - sent})
        conn.close()
        return out

    with ThreadPoolExecutor(conns) as pool:
        shares = pool.map(worker, [requests[i::conns] for i in range(conns)])
        return [r for share in shares for r in share]


def restart(world: World, root: Path, queued: int) -> Result:
    """Queue `queued` tasks (and 1 for the floor) through `--role ingress`, then time a
    `serve` on each database from its exec to the first claim."""
    repos = [f"q{i:03d}" for i in range(100)]
    for name in repos:
        world.add_repo(name, 10, None)
    targets = [(r, 1 + (k // 100) % 10) for k, r in zip(range(queued), itertools.cycle(repos))]
    out: Result = {"queued": queued}
    for name, batch in (("floor", targets[:1]), ("full", targets)):
        seeder = new_serve(world, root, f"restart-{name}", 0.2, "--role", "ingress")
        t0 = time.monotonic()
        requests = [world.signed(r, i, f"queued {k}") for k, (r, i) in enumerate(batch)]
        answers = post_all(seeder.url, requests, 8)
        seeder.stop()
        assert all(a["status"] == 202 for a in answers), {a["status"] for a in answers}
        out[f"seeding_{name}_s"] = round(time.monotonic() - t0, 1)
        serve = Serve(seeder.workdir, world.emu.url, world.bot_token, seeder.extra_env)
        serve.start(wait=False)
        try:
            out[name] = round(first_claim(serve) - serve.started, 3)
        finally:
            serve.stop()
    out["ratio"] = round(out["full"] / out["floor"], 2)
    out["imports"] = imports_seconds()
    return out


def imports_seconds() -> float:
    """Median of 3: a fresh interpreter importing what `serve` imports before it starts."""
    modules = ("forgeflow.cli", "forgeflow.services", "forgeflow.api.app", "forgeflow.tasks")
    probe = "import contextlib, importlib\n"
    probe += f"for m in {modules!r}:\n    with contextlib.suppress(ImportError):\n"
    probe += "        importlib.import_module(m)\n"
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", probe], check=True)
        times.append(time.monotonic() - t0)
    return round(statistics.median(times), 3)


def first_claim(serve: Serve) -> float:
    def found() -> float | None:
        if serve.proc is not None and serve.proc.poll() is not None:
            raise RuntimeError(f"forgeflow exited: {serve.log()}")
        if not serve.db_path.exists():
            return None
        sql = "SELECT min(timestamp) FROM audit_events WHERE action = 'task.claim'"
        stamp = serve.query(sql)[0][0]
        return None if stamp is None else epoch(stamp)

    return wait_for(found, 120, "first claim", step=0.01)


def cpu_seconds(pid: int) -> float:
    """CPU of a process and its waited-for children (git), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / 100


Request = tuple[dict[str, str], bytes]


class Sampler:
    """Every 50 ms: the serve's CPU seconds, how many children (git) it has, and how long
    three probes take to answer: its /healthz, the webhook (a delivery it already
    accepted, sent again: signature, parsing and the duplicate check, no new task) and
    the emulator's permission API (which each new mention's 202 waits for). Read per
    window: whose time a slow 202 was spent in, and whether acceptance stays responsive
    while the preparations run."""

    def __init__(self, serve: Serve, emulator: str, token: str, repo: str, again: Request) -> None:
        self.pid = serve.pid
        self.samples: list[tuple[float, float, int]] = []
        path = f"/api/v1/repos/{OWNER}/{repo}/collaborators/{USER}/permission"
        auth = {"Authorization": f"token {token}"}
        self.probes: dict[str, tuple[str, dict[str, str], bytes | None]] = {
            "healthz": (serve.url + "/healthz", {}, None),
            "webhook": (serve.url + "/api/gitea/webhook", *again),
            "gitea": (emulator + path, auth, None),
        }
        self.waits: dict[str, list[tuple[float, float]]] = {name: [] for name in self.probes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        with httpx.Client(timeout=30) as http:
            while True:
                kids = len(children.read_text().split())
                self.samples.append((time.monotonic(), cpu_seconds(self.pid), kids))
                if self._stop.is_set():
                    return
                for name, (url, headers, body) in self.probes.items():
                    t0 = time.monotonic()
                    if body is None:
                        http.get(url, headers=headers).raise_for_status()
                    else:
                        http.post(url, headers=headers, content=body).raise_for_status()
                    self.waits[name].append((t0, time.monotonic() - t0))
                self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, start: float, end: float) -> Result:
        """Between two time.monotonic() readings: the serve's busy share of one core,
        its peak of children, the probes' waits."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        (t0, c0, _), (t1, c1, _) = inside[0], inside[-1]
        out: Result = {"serve_cores": round((c1 - c0) / (t1 - t0), 2) if t1 > t0 else None}
        out["peak_children"] = max(k for *_, k in inside)
        for name, waits in self.waits.items():
            mine = [w for at, w in waits if start <= at <= end]
            out[f"probe_{name}"] = summary_ms(mine) if mine else None
        return out


def burst(world: World, root: Path, count: int, turn: float, bound: str | None) -> Result:
    """``bound``: FORGEFLOW_MAX_PREPARATIONS for the serve (None: its default)."""
    out: Result = {"repos": count, "max_preparations": bound or "default"}
    env = {"FORGEFLOW_MAX_PREPARATIONS": bound} if bound else {}
    for name, args in (("floor", ("--role", "ingress")), ("forgeflow", ())):
        serve = new_serve(world, root, f"burst-{name}", turn, *args, **env)
        try:
            out[name] = burst_once(serve, world, name, count)
        finally:
            serve.stop()
    return out


def burst_once(serve: Serve, world: World, name: str, count: int) -> Result:
    """The burst against one serve; with tasks run (not the floor), until every task
    ended, with the probes running all along."""
    repos = [f"burst-{name}-{i:03d}" for i in range(count)]
    for r in [*repos, f"burst-{name}-probe"]:
        world.add_repo(r, 1, None)
    requests = [world.signed(r, 1, "first mention") for r in repos]
    # The webhook probe's delivery, accepted before the clock (its task is one more).
    again = world.signed(f"burst-{name}-probe", 1, "first mention")
    post_all(serve.url, [again], 1)
    row: Result = {}
    sampler = Sampler(serve, world.emu.url, world.bot_token, repos[0], again)
    t0 = time.monotonic()
    try:
        answers = post_all(serve.url, requests, 32)
        posted = time.monotonic()
        row |= summary_ms([a["s"] for a in answers])
        row |= {
            "not_202": sum(a["status"] != 202 for a in answers),
            "wall_s": round(posted - t0, 2),
        }
        slow = sorted(answers, key=lambda a: -a["s"])[:3]
        row["slowest"] = [(round(a["at_s"], 2), round(a["s"], 2)) for a in slow]
        if name == "forgeflow":  # every task must still end, and succeed
            row |= drain(serve, count + 1)
    finally:
        sampler.stop()
    row["posting"] = sampler.window(t0, posted)
    if name == "forgeflow":
        row["draining"] = sampler.window(posted, time.monotonic())
        row["all_ended_s"] = round(time.monotonic() - t0, 1)
    return row


def drain(serve: Serve, count: int) -> Result:
    """Wait for every task to end; how they ended and the serve's peak memory."""
    ids = [t for (t,) in serve.query("SELECT task_id FROM tasks")]
    states = serve.wait_terminal(ids, 300 + 2 * count)
    row: Result = {"succeeded": sum(s == "succeeded" for s in states.values())}
    sql = "SELECT state, error_code, count(*) FROM tasks GROUP BY state, error_code"
    row["ended"] = [list(r) for r in serve.query(sql)]
    status = Path(f"/proc/{serve.pid}/status").read_text()
    peak = next(ln for ln in status.splitlines() if ln.startswith("VmHWM:"))
    row["serve_peak_rss_mb"] = round(int(peak.split()[1]) / 1024)
    return row


# -- the real Codex path ------------------------------------------------------------------


def mention_to_request(
    serve: Serve, world: World, model: ScriptedModel, repo: str, n: int
) -> float:
    """Seconds from posting a mention to the model's next request; waits for the task."""
    seen, t0 = len(model.requests), time.monotonic()
    m = world.mention(repo, n)
    request = model.wait_for_requests(seen + 1, timeout=180)[seen]
    state = serve.wait_terminal([m.task_id], 180)[m.task_id]
    ask = read_turn(request)
    if state != "succeeded" or ask is None or m.task_id not in ask.marker:
        raise RuntimeError(f"codex task {m.task_id}: {state}, first request {ask}")
    world.emu.flush_deliveries()
    time.sleep(0.2)
    return request.received_at - t0


def codex_path(
    world: World, root: Path, model: ScriptedModel, rounds: int, sandbox: str
) -> dict[str, list[float]]:
    """forgeflow with ``FORGEFLOW_SANDBOX=sandbox``: new repository, follow-up, new issue
    on the active repository, mention → the model's first request."""
    times: dict[str, list[float]] = {"new_repo": [], "follow_up": [], "new_issue": []}
    home = root / f"codex-home-{sandbox}"
    serve = codex_serve(world, root / f"codex-{sandbox}", home, model, sandbox=sandbox)
    try:
        warmup = f"cx-warmup-{sandbox}"
        world.add_repo(warmup, 1, serve.url)  # untimed: broker, gitea-mcp, clone
        mention_to_request(serve, world, model, warmup, 1)
        for k in range(rounds):
            name = f"cx{k}-{sandbox}"
            world.add_repo(name, 2, serve.url)
            for kind, issue in (("new_repo", 1), ("follow_up", 1), ("new_issue", 2)):
                times[kind].append(mention_to_request(serve, world, model, name, issue))
    finally:
        serve.stop()
    return times


def codex(world: World, root: Path, rounds: int) -> Result:
    """Jailed forgeflow against the same forgeflow unjailed (``none``) in the same run,
    and against the direct floor, with one scripted model answering all."""
    model = answering_model()
    try:
        times = codex_path(world, root, model, rounds, "bwrap")
        unjailed = codex_path(world, root, model, rounds, "none")
        floor = asyncio.run(direct_floor(root, world, model, rounds))
    finally:
        model.stop()
    out: Result = {k: summary_ms(v) for k, v in times.items()}
    out |= {f"none_{k}": summary_ms(v) for k, v in unjailed.items()}
    out["jail_follow_up_overhead_pct"] = round(
        100 * (out["follow_up"]["p50_ms"] / out["none_follow_up"]["p50_ms"] - 1), 1
    )
    out["jail_new_issue_extra_ms"] = round(
        out["new_issue"]["p50_ms"] - out["none_new_issue"]["p50_ms"], 1
    )
    out |= {f"floor_{k}": summary_ms(v) for k, v in floor.items()}
    out["ratio_new_issue"] = round(
        out["new_issue"]["p50_ms"] / out["floor_new_thread"]["p50_ms"], 2
    )
    out["ratio_follow_up"] = round(out["follow_up"]["p50_ms"] / out["floor_warm_turn"]["p50_ms"], 2)
    return out


async def direct_floor(
    root: Path, world: World, model: ScriptedModel, n: int
) -> dict[str, list[float]]:
    """The same `codex app-server` and PyPI `gitea-mcp` driven directly, unjailed: a new
    thread with a stdio MCP server of its own, its turn started once that server is ready
    (thread/start → first model request), then a warm turn on it (turn/start → request)."""
    home = write_codex_home(root / "floor-home", model.url)
    work = root / "floor-work"
    work.mkdir()
    world.add_repo("floor", n, None)
    events: asyncio.Queue[Json] = asyncio.Queue()
    proc = await RpcProcess.spawn(
        [str(CODEX), "app-server"], env={**os.environ, **home.env()}, on_message=events.put
    )
    tokens = {"GITEA_URL": world.emu.url, "GITEA_TOKEN": world.bot_token}
    tokens |= {"GITEA_HOST": world.emu.url, "GITEA_ACCESS_TOKEN": world.bot_token}
    servers = {"gitea": {"command": GITEA_MCP, "args": [], "env": tokens}}
    out: dict[str, list[float]] = {"new_thread": [], "warm_turn": []}
    try:
        init = {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {}}
        await proc.request("initialize", init, 60)
        await proc.notify("initialized")
        for i in range(1, n + 1):
            key = f"resourceKey=default:{OWNER}/floor:issue:{i}"
            marker = f"<!-- ccweb taskId=floor-{i} turnKey=floor-{i}:1 {key} kind=final -->"
            text = f"Answer on issue {i}; end the comment with this line:\n{marker}"
            params = {"cwd": str(work), "approvalPolicy": "never", "sandbox": "danger-full-access"}
            seen, t0 = len(model.requests), time.monotonic()
            started = await proc.request(
                "thread/start", {**params, "config": {"mcp_servers": servers}}, 60
            )
            thread = started["thread"]["id"]
            await until(events, partial(mcp_ready, thread=thread))
            for kind in ("new_thread", "warm_turn"):
                if kind == "warm_turn":
                    seen, t0 = len(model.requests), time.monotonic()
                turn = {
                    "threadId": thread,
                    "input": [{"type": "text", "text": text, "text_elements": []}],
                }
                await proc.request("turn/start", turn, 60)
                request = (await asyncio.to_thread(model.wait_for_requests, seen + 1, 120))[seen]
                out[kind].append(request.received_at - t0)
                await until(events, lambda m: m.get("method") == "turn/completed")
    finally:
        await proc.close()
    return out


def mcp_ready(msg: Json, thread: str) -> bool:
    params = msg.get("params") or {}
    return (
        msg.get("method") == "mcpServer/startupStatus/updated"
        and params.get("threadId") == thread
        and params.get("status") == "ready"
    )


async def until(events: asyncio.Queue[Json], match: Callable[[Json], bool]) -> Json:
    async with asyncio.timeout(120):
        while not match(msg := await events.get()):
            pass
        return msg


# -- pipeline steps against DBOS ----------------------------------------------------------

DBOS_VERSION = "3.4.0"
DBOS_CHILD = r"""
import json, logging, sys, time
from importlib.metadata import version
from dbos import DBOS
path, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
logging.getLogger("dbos").setLevel(logging.WARNING)
DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{path}",
             "run_admin_server": False, "log_level": "WARNING"})

@DBOS.step()
def noop(i: int) -> int:
    return i

@DBOS.workflow()
def chain(n: int) -> int:
    for i in range(n):
        noop(i)
    return n

DBOS.launch()
chain(min(n, 10))  # warm-up
times = []
for _ in range(repeat):
    t = time.perf_counter()
    chain(n)
    times.append(time.perf_counter() - t)
DBOS.destroy()
print(json.dumps({"times": times, "version": version("dbos")}))
"""


def dbos_python() -> str:
    """An interpreter with `dbos`: FORGEFLOW_BENCH_DBOS_PYTHON, or a virtual environment
    made once under /var/tmp (dbos is no dependency of forgeflow, nor of its tests)."""
    if given := os.environ.get("FORGEFLOW_BENCH_DBOS_PYTHON"):
        return given
    venv = Path(f"/var/tmp/forgeflow-bench-dbos-{DBOS_VERSION}")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, f"dbos=={DBOS_VERSION}"], check=True)
    return str(python)


def dbos_times(n: int, repeat: int, folder: Path) -> list[float]:
    folder.mkdir(parents=True, exist_ok=True)
    argv = [dbos_python(), "-c", DBOS_CHILD, str(folder / "dbos.sqlite"), str(n), str(repeat)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, cwd=folder, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"dbos child failed:\n{done.stderr[-2000:]}")
    times: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["times"]
    return times


def chain_template(n: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "kind": "trigger"}]
    nodes += [{"id": f"s{i}", "kind": "listen", "bodyKey": "bench.noop"} for i in range(n)]
    nodes.append({"id": "end", "kind": "terminal"})
    edges = [{"from": a["id"], "to": b["id"]} for a, b in itertools.pairwise(nodes)]
    return {
        "key": "chain",
        "name": "chain",
        "enabled": True,
        "config": {"maxSteps": 10 * n + 10},
        "nodes": nodes,
        "edges": edges,
        "triggers": [{"type": "manual"}],
    }


async def forgeflow_times(n: int, repeat: int, folder: Path) -> list[float]:
    """Runs of trigger → n no-op steps → terminal through the real PipelineEngine on a
    fresh SQLite file; the clock runs from engine.start to the commit ending the run."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Queue[float] = asyncio.Queue()

    def on_run_ended() -> None:
        # The store's public after-commit hook, on the writer thread right after the
        # commit that ended a run: the clock stops there (no polling reads competing
        # with the writer). One run at a time, so the run that ended is the one started.
        loop.call_soon_threadsafe(ended.put_nowait, time.perf_counter())

    async def noop(ctx: StepContext) -> None:
        return None

    store = Store(f"sqlite:///{folder / 'forgeflow.db'}")
    store.migrate()
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    registry.register("bench.noop", noop)
    workspace = LocalWorkspace(
        str(folder / "ws"), str(folder / "scratch"), jail_runner=JailRunner(folder / "ws")
    )
    engine = PipelineEngine(
        store,
        registry,
        owner="bench/1",
        node_prefix="bench/",
        workspace=workspace,
        poll_seconds=1.0,
        lease_ttl=60.0,
    )
    unsubscribe = store.db.subscribe(pipeline_store.RUN_ENDED, on_run_ended)
    times = []
    try:
        loaded = load_definition(chain_template(n), bodies=registry.keys())
        await store.write(lambda c: templates.create(c, loaded, actor="bench"))
        await engine.start_loop()
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            started = await engine.start("chain")
            t1 = await asyncio.wait_for(ended.get(), timeout=600)
            await check_run(store, started.run.run_id, n)
            if i:  # the first run warms caches and thread pools
                times.append(t1 - t0)
    finally:
        unsubscribe()
        await engine.stop()
        store.close()
    return times


async def check_run(store: Store, run_id: str, n: int) -> None:
    """The run that ended succeeded, every one of its n steps once."""
    run = await store.read(lambda c: pipeline_store.get_run(c, run_id))
    rows = await store.read(lambda c: pipeline_store.steps_of(c, run_id))
    ran = [r for r in rows if r.kind == "listen"]
    if run is None or run.status != RunStatus.SUCCEEDED:
        raise RuntimeError(f"run {run_id} ended {run and run.status}, not succeeded")
    if len(ran) != n or any(r.status != "succeeded" or r.attempt != 1 for r in ran):
        raise RuntimeError(f"run {run_id}: not every one of its {n} steps ran once")


def pipeline_steps(n: int, repeat: int, root: Path) -> Result:
    """DBOS before and after forgeflow, pooled: on a shared machine the load drifts, and
    bracketing keeps the drift from favouring either side. Medians per step."""
    dbos = dbos_times(n, repeat, root / "dbos-before")
    ours = asyncio.run(forgeflow_times(n, repeat, root))
    dbos += dbos_times(n, repeat, root / "dbos-after")
    ff_ms = statistics.median(ours) / n * 1000
    dbos_ms = statistics.median(dbos) / n * 1000
    return {
        "steps": n,
        "repeat": repeat,
        "dbos_version": DBOS_VERSION,
        "forgeflow_ms_per_step": round(ff_ms, 3),
        "dbos_ms_per_step": round(dbos_ms, 3),
        "ratio": round(ff_ms / dbos_ms, 2),
    }


# -- the run -------------------------------------------------------------------------------

SCENARIOS = ("warm", "serial", "restart", "burst", "codex", "steps")


def run(args: argparse.Namespace, root: Path) -> Result:
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    res: Result = {"machine": machine(), "args": vars(args)}
    world = World(root)
    try:
        for name in SCENARIOS:
            if name not in only:
                continue
            t0 = time.monotonic()
            print(f"{name} …", file=sys.stderr, flush=True)
            if name == "warm":
                res[name] = warm(world, root, args.warm_n)
            elif name == "serial":
                res[name] = serial(world, root, 10, 2.0)
            elif name == "restart":
                res[name] = restart(world, root, args.queued)
            elif name == "burst":
                res[name] = burst(world, root, args.burst, 2.0, args.max_preparations)
            elif name == "codex":
                res[name] = codex(world, root, args.codex_rounds)
            else:
                res[name] = pipeline_steps(args.steps, args.repeat, root)
            res[name]["scenario_s"] = round(time.monotonic() - t0, 1)
    finally:
        world.stop()
    res["machine"]["loadavg_1m_end"] = machine()["loadavg_1m"]
    return res


def rows(res: Result) -> list[tuple[str, str, str, str, str, bool | None]]:
    """(guard-rail, goal, figure, floor, ratio to the floor, met) of what ran."""
    out: list[tuple[str, str, str, str, str, bool | None]] = []
    if w := res.get("warm"):
        t, f = w["turn_start"], w["floor_202"]
        figure = f"p50 {t['p50_ms']} ms (p99 {t['p99_ms']})"
        floor = f"the 202 itself: p50 {f['p50_ms']} ms"
        ratio = f"{t['p50_ms'] / f['p50_ms']:.1f}×"
        out.append(
            ("warm 202 → turn start", "p50 ≤ 50 ms", figure, floor, ratio, t["p50_ms"] <= 50)
        )
    if s := res.get("serial"):
        figure = f"overhead {s['overhead']:.1%}, {s['overlaps']} overlaps, FIFO {s['fifo']}"
        floor = f"10 turns of 2 s: {s['floor_s']:g} s"
        met = s["overhead"] <= 0.05 and s["overlaps"] == 0 and s["succeeded"] == s["tasks"]
        ratio = f"{s['makespan_s'] / s['floor_s']:.3f}×"
        out.append(("ten tasks on one repository", "serial, ≤ 5 %", figure, floor, ratio, met))
    if r := res.get("restart"):
        figure = f"{r['full']} s"
        floor = f"1 queued: {r['floor']} s (importing forgeflow alone: {r['imports']} s)"
        met = r["full"] <= 2
        out.append(
            (
                f"restart, {r['queued']:,} queued → first claim",
                "≤ 2 s",
                figure,
                floor,
                f"{r['ratio']}×",
                met,
            )
        )
    if b := res.get("burst"):
        out.append(burst_row(b))
    if p := res.get("steps"):
        figure, floor = (
            f"{p['forgeflow_ms_per_step']} ms/step",
            f"DBOS {p['dbos_version']}: {p['dbos_ms_per_step']} ms/step",
        )
        out.append(
            (
                "pipeline step (SQLite)",
                "≤ 1.0× DBOS",
                figure,
                floor,
                f"{p['ratio']}×",
                p["ratio"] <= 1.0,
            )
        )
    if c := res.get("codex"):
        for what, ours, theirs, ratio in (
            ("Codex, jailed: new issue", "new_issue", "floor_new_thread", "ratio_new_issue"),
            ("Codex, jailed: follow-up", "follow_up", "floor_warm_turn", "ratio_follow_up"),
        ):
            figure = f"p50 {c[ours]['p50_ms']:.0f} ms"
            label = theirs.removeprefix("floor_").replace("_", " ")
            floor = f"direct {label}: p50 {c[theirs]['p50_ms']:.0f} ms"
            out.append((f"{what} → first model request", "–", figure, floor, f"{c[ratio]}×", None))
        figure = f"p50 {c['new_repo']['p50_ms']:.0f} ms"
        out.append(
            ("Codex, jailed: new repository → first model request", "–", figure, "–", "–", None)
        )
    return out


def burst_row(b: Result) -> tuple[str, str, str, str, str, bool | None]:
    """The burst's row: the 200 answers, and the webhook probe while the tasks ran."""
    f, g = b["forgeflow"], b["floor"]
    late, tasks = f["draining"]["probe_webhook"], b["repos"] + 1  # and the probe's task
    git = max(f["posting"]["peak_children"], f["draining"]["peak_children"])
    figure = (
        f"max {f['max_ms'] / 1000:.2f} s (p50 {f['p50_ms']:.0f} ms), {f['not_202']} not 202; "
        f"while the tasks ran ({f['all_ended_s']} s): webhook max {late['max_ms'] / 1000:.2f} s, "
        f"≤ {git} git processes; {f['succeeded']}/{tasks} succeeded"
    )
    floor = f"`--role ingress`: max {g['max_ms'] / 1000:.2f} s"
    slowest = max(f["max_ms"], late["max_ms"])
    met = slowest <= 2000 and f["not_202"] == 0 and f["succeeded"] == tasks
    name = f"burst of first mentions, {b['repos']} new repositories"
    if b["max_preparations"] != "default":
        name += f" (FORGEFLOW_MAX_PREPARATIONS={b['max_preparations']})"
    return (name, "every answer ≤ 2 s", figure, floor, f"{slowest / g['max_ms']:.1f}×", met)


def markdown(res: Result) -> str:
    m = res["machine"]
    lines = [
        f"{m['at']}, commit {m['commit']}{' (src/ modified)' if m['uncommitted_src'] else ''}, "
        f"{m['cpu']}, {m['cores']} cores, "
        f"load average {m['loadavg_1m']:.2f} → {m['loadavg_1m_end']:.2f}",
        "",
        "| guard-rail | goal | figure | floor | ÷ floor | met |",
        "| --- | --- | --- | --- | ---: | --- |",
    ]
    for name, goal, figure, floor, ratio, met in rows(res):
        verdict = "–" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {name} | {goal} | {figure} | {floor} | {ratio} | {verdict} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--warm-n", type=int, default=50, help="timed warm mentions")
    p.add_argument("--queued", type=int, default=10_000, help="queued tasks at the restart")
    p.add_argument("--burst", type=int, default=200, help="new repositories in the burst")
    p.add_argument(
        "--max-preparations",
        default=None,
        help="FORGEFLOW_MAX_PREPARATIONS of the burst's serve (default: its own default)",
    )
    p.add_argument("--codex-rounds", type=int, default=5, help="rounds of the Codex path")
    p.add_argument("--steps", type=int, default=100, help="pipeline steps per run")
    p.add_argument("--repeat", type=int, default=5, help="timed pipeline runs")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    # Not under /tmp: there Codex declines to make its helper binaries in CODEX_HOME.
    with scratch("forgeflow-latency-", keep=args.keep, parent="/var/tmp") as root:
        res = run(args, root)
    out = write_result("latency", res)
    print(markdown(res))
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(met is not False for *_, met in rows(res)) else 1


if __name__ == "__main__":
    sys.exit(main())
