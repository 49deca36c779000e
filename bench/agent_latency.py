"""Agent jail benchmark: mention → the agent's first model request, jailed vs not.

    .venv/bin/python bench/agent_latency.py [--rounds 5] [--repos 10 --issues 10]

In this process: the Gitea emulator and the scripted Responses-API model (every turn
posts its answer through the Gitea MCP tool). Two real `forgeflow serve` (SQLite) run the
pinned `codex app-server`, FORGEFLOW_SANDBOX=bwrap and =none, rounds alternating between
them. Latency: time.monotonic() just before the emulator's post_comment → `received_at`
of the model's next request. A round, on a fresh repository: new issue (clone + app-server
start), follow-up (thread loaded), new issue on the active repository, then, once the
app-server stopped for idleness (pgid file gone), a follow-up (new app-server + resume).
Idle scenario: --repos × --issues mentions at once (jailed); after all tasks end and
idle + 10 s, no pgid file and no app-server process may be left.
Writes bench/results/agent-latency-<timestamp>.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _dispatch_support import OWNER, TERMINAL, Serve, World, wait_for
from forgeflow.agent import jail
from forgeflow.agent.appserver import pgid_file
from forgeflow.agent.jsonrpc import Json, RpcProcess
from forgeflow.agent.provider import to_toml
from forgeflow_testkit.agents import answering_agent, read_turn
from forgeflow_testkit.codex_home import codex_config, write_codex_home
from forgeflow_testkit.model_server import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
MCP = str(Path(sys.executable).parent / "gitea-mcp")
SANDBOXES = ("bwrap", "none")
KINDS = {
    "new_repo": "new issue, new repository (clone + app-server start)",
    "new_issue": "new issue, active repository (app-server running)",
    "follow_up": "follow-up, thread loaded",
    "after_idle": "follow-up after idle stop (new app-server + thread/resume)",
}
STEPS = ("task.run", "session.", "turn.intent")  # audit rows (first of each) for the split
Result = dict[str, Any]


def new_serve(root: Path, name: str, world: World, model: ScriptedModel, **env: str) -> Serve:
    env |= write_codex_home(root / name / "codex-home", model.url).env()
    env |= {"FORGEFLOW_AGENT_RUNTIME": "codex", "FORGEFLOW_MODEL": "scripted-model"}
    env |= {"FORGEFLOW_CODEX_COMMAND": f"{CODEX} app-server", "FORGEFLOW_GITEA_MCP_COMMAND": MCP}
    serve = Serve(root / name, world.emu.url, world.bot_token, 0.0, extra_env=env)
    serve.start()
    return serve


def group_of(serve: Serve, repo: str) -> int | None:
    try:
        return int(pgid_file(serve.workdir / "data" / "run", f"{OWNER}/{repo}").read_text())
    except (OSError, ValueError):
        return None


def measure(serve: Serve, world: World, model: ScriptedModel, repo: str, issue: int) -> Result:
    """One mention, timed to the model's next request; waits for the task to end."""
    before, seen = group_of(serve, repo), len(model.requests)
    wall_minus_mono = time.time() - time.monotonic()
    t0 = time.monotonic()
    m = world.mention(repo, issue)
    req = model.wait_for_requests(seen + 1, timeout=180)[seen]
    state = serve.wait_terminal([m.task_id], 180)[m.task_id]
    world.emu.flush_deliveries()
    ask = read_turn(req)
    rows = serve.audit([m.task_id])[m.task_id]
    steps = {}
    for prefix in STEPS:
        at = next((t for a, t in rows if a.startswith(prefix)), None)
        if at is not None:
            steps[prefix] = round((at - wall_minus_mono - t0) * 1000, 1)
    time.sleep(0.2)
    return {
        "task": m.task_id,
        "state": state,
        "ms": round((req.received_at - t0) * 1000, 1),
        "first_request_is_the_turns": ask is not None and m.task_id in ask.marker,
        "session": next((a for a, _ in rows if a.startswith("session.")), None),
        "steps_ms": steps,
        "group_before": before,
        "group_after": group_of(serve, repo),
    }


def valid(kind: str, r: Result) -> bool:
    """The app-server was in the state the measure is about; the request was the turn's."""
    running = r["group_before"] is not None and r["group_before"] == r["group_after"]
    warm = kind in ("follow_up", "new_issue")
    return r["first_request_is_the_turns"] and (running if warm else r["group_before"] is None)


def summary(values: list[float]) -> Result:
    median = round(statistics.median(values), 1)
    return {"n": len(values), "median_ms": median, "min_ms": min(values), "max_ms": max(values)}


def latency(root: Path, world: World, model: ScriptedModel, rounds: int, idle: float) -> Result:
    env = {"FORGEFLOW_AGENT_IDLE_SECONDS": str(idle)}
    serves = {s: new_serve(root, s, world, model, FORGEFLOW_SANDBOX=s, **env) for s in SANDBOXES}
    raw: dict[str, list[Result]] = {sb: [] for sb in SANDBOXES}
    try:
        for sb, serve in serves.items():  # untimed: broker, gitea-mcp, first clone
            world.add_repo(f"{sb}-warmup", 1, serve.url)
            raw[sb].append({"warmup": measure(serve, world, model, f"{sb}-warmup", 1)})
        for k in range(rounds):
            for sb in SANDBOXES if k % 2 == 0 else SANDBOXES[::-1]:
                serve, repo = serves[sb], f"{sb}-r{k}"
                world.add_repo(repo, 2, serve.url)
                out = {"new_repo": measure(serve, world, model, repo, 1)}
                out["follow_up"] = measure(serve, world, model, repo, 1)
                out["new_issue"] = measure(serve, world, model, repo, 2)
                wait_for(lambda: group_of(serve, repo) is None, idle + 60, "idle stop", 0.05)  # noqa: B023
                out["after_idle"] = measure(serve, world, model, repo, 1)
                raw[sb].append(out)
                print(f"round {k} {sb}: { {x: r['ms'] for x, r in out.items()} }", file=sys.stderr)
    finally:
        for sb, serve in serves.items():
            raw[sb].append({"logs": log_findings(serve)})
            serve.stop()
    table: Result = {}
    for kind in KINDS:
        row: Result = {}
        for sb in SANDBOXES:
            runs = [r[kind] for r in raw[sb] if kind in r]
            row[sb] = summary([r["ms"] for r in runs])
            row[sb]["steps_median_ms"] = {
                s: statistics.median(r["steps_ms"].get(s, float("nan")) for r in runs)
                for s in STEPS
            }
            row[sb]["all_succeeded"] = all(r["state"] == "succeeded" for r in runs)
            row[sb]["all_valid"] = all(valid(kind, r) for r in runs)
        row["ratio"] = round(row["bwrap"]["median_ms"] / row["none"]["median_ms"], 3)
        row["diff_ms"] = round(row["bwrap"]["median_ms"] - row["none"]["median_ms"], 1)
        # A round runs both serves, seconds apart: the median of the rounds' differences
        # is less at the mercy of the machine's other load than the medians are.
        b, n = ([r[kind]["ms"] for r in raw[sb] if kind in r] for sb in SANDBOXES)
        diffs = [x - y for x, y in zip(b, n, strict=True)]
        row["paired_diff_median_ms"] = round(statistics.median(diffs), 1)
        table[kind] = row
    return {"idle_seconds": idle, "table": table, "raw": raw}


def offline(root: Path, world: World, model: ScriptedModel, rounds: int) -> Result:
    """A jail without network (FORGEFLOW_AGENT_NETWORK=off): its Codex reaches the
    brokers through forward.py and a Unix socket. The same measures as the jailed serve."""
    env = {"FORGEFLOW_SANDBOX": "bwrap", "FORGEFLOW_AGENT_NETWORK": "off"}
    serve = new_serve(root, "offline", world, model, **env)
    runs: dict[str, list[float]] = {"new_repo": [], "follow_up": [], "new_issue": []}
    try:
        world.add_repo("offline-warmup", 1, serve.url)
        measure(serve, world, model, "offline-warmup", 1)
        for k in range(rounds):
            repo = f"offline-r{k}"
            world.add_repo(repo, 2, serve.url)
            for kind, issue in (("new_repo", 1), ("follow_up", 1), ("new_issue", 2)):
                r = measure(serve, world, model, repo, issue)
                assert r["state"] == "succeeded", r
                runs[kind].append(r["ms"])
    finally:
        serve.stop()
    return {kind: summary(v) for kind, v in runs.items()}


def app_server_procs(pid: int) -> list[str]:
    """Processes under ``pid`` (walking /proc) whose command line names app-server."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            try:
                cmd = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "app-server" in cmd:
                found.append(f"{c}: {cmd[:160]}")
    return found


def running_groups(run_dir: Path) -> set[int]:
    """The pgids in <data_dir>/run/codex-*.pgid (a file may go while it is read)."""
    found = set()
    for path in run_dir.glob("codex-*.pgid"):
        with contextlib.suppress(OSError, ValueError):
            found.add(int(path.read_text()))
    return found


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def idle_scenario(
    root: Path, world: World, model: ScriptedModel, repos: int, issues: int, idle: float
) -> Result:
    env = {"FORGEFLOW_SANDBOX": "bwrap", "FORGEFLOW_AGENT_IDLE_SECONDS": str(idle)}
    serve = new_serve(root, "idle", world, model, **env)
    run_dir = serve.workdir / "data" / "run"
    names = [f"idle-r{i:02d}" for i in range(repos)]
    for name in names:
        world.add_repo(name, issues, serve.url)
    seen: set[int] = set()
    peak, peak_procs, states, checked = 0, 0, {}, 0.0
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(1) as pool:
            targets = [(r, i + 1) for r in names for i in range(issues)]
            posting = pool.submit(world.mention_all, targets)
            while True:  # poll the run dir every 0.1 s, the task states every 0.5 s
                groups = running_groups(run_dir)
                seen |= groups
                peak = max(peak, len(groups))
                if posting.done() and time.monotonic() - checked > 0.5:
                    checked = time.monotonic()
                    peak_procs = max(peak_procs, len(app_server_procs(serve.pid)))
                    states = serve.states(m.task_id for m in posting.result())
                    if len(states) == repos * issues and set(states.values()) <= TERMINAL:
                        break
                if time.monotonic() - t0 > 120 + 10 * repos * issues:
                    raise TimeoutError(f"idle scenario: {states}")
                time.sleep(0.1)
        ended, emptied = time.monotonic(), None
        while time.monotonic() < ended + idle + 10:
            if emptied is None and not list(run_dir.glob("codex-*.pgid")):
                emptied = round(time.monotonic() - ended, 1)
            time.sleep(0.1)
        out: Result = {
            "repos": repos,
            "issues_per_repo": issues,
            "idle_seconds": idle,
            "tasks": len(states),
            "states": {s: list(states.values()).count(s) for s in set(states.values())},
            "all_tasks_end_s": round(ended - t0, 1),
            "max_concurrent_app_servers": peak,
            "max_app_server_processes_sampled": peak_procs,
            "app_server_groups_started": len(seen),
            "run_dir_empty_after_s": emptied,
            "waited_after_end_s": round(time.monotonic() - ended, 1),
            "left_pgid_files": sorted(p.name for p in run_dir.glob("codex-*.pgid")),
            "left_app_server_processes": app_server_procs(serve.pid),
            "left_groups_alive": sorted(g for g in seen if group_alive(g)),
        }
        left = ("left_pgid_files", "left_app_server_processes", "left_groups_alive")
        out["left_after_idle"] = sum(len(out[k]) for k in left)
    finally:
        logs = log_findings(serve)
        serve.stop()
    out["logs"] = logs
    out["groups_alive_after_serve_stop"] = sorted(g for g in seen if group_alive(g))
    return out


def log_findings(serve: Serve) -> Result:
    """Lines of forgeflow's stderr and <data_dir>/logs/* that look like trouble."""
    found: Result = {}
    for f in [serve.workdir / "serve.log", *sorted((serve.workdir / "data" / "logs").glob("*"))]:
        lines = f.read_text(errors="replace").splitlines() if f.is_file() else []
        bad = [ln for ln in lines if any(w in ln.lower() for w in ("error", "warn", "trace"))]
        found[f.name] = {"lines": len(lines), "flagged": len(bad), "sample": bad[:5]}
    return found


def probes(root: Path, model: ScriptedModel, n: int) -> Result:
    """bwrap alone (`true` in the same jail) and codex start → its initialize answer."""
    home, work = root / "probe-home", root / "probe-work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(to_toml(codex_config(model.url)))
    host = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    times: dict[str, list[float]] = {}
    for what, argv in (("true", ["/usr/bin/true"]), ("codex_init", [str(CODEX), "app-server"])):
        spec = jail.JailSpec(home, (work,), jail.installation_paths(argv))
        runs = {"bwrap": (jail.bwrap_argv(spec, argv), {}), "none": (argv, jail.base_env(host))}
        for i in range(n):  # interleaved, the order alternating: the load varies
            for sb in SANDBOXES if i % 2 == 0 else SANDBOXES[::-1]:
                cmd, env = runs[sb]
                times.setdefault(f"{what}_{sb}", []).append(timed_start(cmd, env, what != "true"))
    return {k: summary(v) for k, v in times.items()}


def timed_start(cmd: list[str], env: dict[str, str], init: bool) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdin is not None and proc.stdout is not None
    if init:
        timer = threading.Timer(30, proc.kill)
        timer.start()
        params = {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {}}
        msg = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        while (line := proc.stdout.readline()) and b'"id":1' not in line.replace(b" ", b""):
            pass
        elapsed = time.monotonic() - t0
        timer.cancel()
        proc.kill()
    proc.wait()
    return round((elapsed if init else time.monotonic() - t0) * 1000, 1)


def floor(root: Path, world: World, model: ScriptedModel, n: int) -> Result:
    """The floor of the tool broker's goals: the same `codex app-server` and PyPI
    `gitea-mcp` driven directly, as forgeflow did before its broker. New issue: a thread
    started with the stdio MCP server, its turn started once the server is ready
    (thread/start → first model request). Warm turn: the next turn on that thread
    (turn/start → first model request)."""
    return asyncio.run(_floor(root, world, model, n))


async def _floor(root: Path, world: World, model: ScriptedModel, n: int) -> Result:
    home = write_codex_home(root / "floor-home", model.url)
    work = root / "floor-work"
    work.mkdir()
    world.add_repo("floor", n, None)
    events: asyncio.Queue[Json] = asyncio.Queue()

    async def on_message(msg: Json) -> None:
        await events.put(msg)

    env = {**os.environ, **home.env()}
    proc = await RpcProcess.spawn([str(CODEX), "app-server"], env=env, on_message=on_message)
    gitea = {"GITEA_URL": world.emu.url, "GITEA_TOKEN": world.bot_token}
    servers = {
        "gitea": {
            "command": MCP,
            "args": [],
            "env": {**gitea, "GITEA_HOST": world.emu.url, "GITEA_ACCESS_TOKEN": world.bot_token},
        }
    }
    new, warm = [], []
    try:
        init = {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {}}
        await proc.request("initialize", init, 60)
        await proc.notify("initialized")
        for i in range(1, n + 1):
            marker = (
                f"<!-- ccweb taskId=floor-{i} turnKey=floor-{i}:1 "
                f"resourceKey=default:{OWNER}/floor:issue:{i} kind=final -->"
            )
            text = f"Answer on issue {i}; end the comment with this line:\n{marker}"
            params = {"cwd": str(work), "approvalPolicy": "never", "sandbox": "danger-full-access"}
            seen, t0 = len(model.requests), time.monotonic()
            started = await proc.request(
                "thread/start", {**params, "config": {"mcp_servers": servers}}, 60
            )
            thread = started["thread"]["id"]
            await _wait(
                events,
                lambda m, t=thread: (
                    m.get("method") == "mcpServer/startupStatus/updated"
                    and m["params"].get("threadId") == t
                    and m["params"].get("status") == "ready"
                ),
            )
            for kind, times in (("new", new), ("warm", warm)):
                if kind == "warm":
                    seen, t0 = len(model.requests), time.monotonic()
                turn = {
                    "threadId": thread,
                    "input": [{"type": "text", "text": text, "text_elements": []}],
                }
                await proc.request("turn/start", turn, 60)
                req = (await asyncio.to_thread(model.wait_for_requests, seen + 1, 120))[seen]
                times.append(round((req.received_at - t0) * 1000, 1))
                await _wait(events, lambda m: m.get("method") == "turn/completed")
    finally:
        await proc.close()
    return {"new_issue": summary(new), "warm_turn": summary(warm)}


async def _wait(events: asyncio.Queue[Json], match: Any, timeout: float = 120) -> Json:
    async with asyncio.timeout(timeout):
        while True:
            msg = await events.get()
            if match(msg):
                return msg


def markdown(res: Result) -> str:
    t = res["latency"]["table"]
    lines = [
        "| mention → first model request | jailed (bwrap) median (min–max) "
        "| none median (min–max) | jailed / none | difference | paired difference |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, label in KINDS.items():
        b, n = (t[kind][sb] for sb in SANDBOXES)
        lines.append(
            f"| {label} | {b['median_ms']:.0f} ms ({b['min_ms']:.0f}–{b['max_ms']:.0f}) | "
            f"{n['median_ms']:.0f} ms ({n['min_ms']:.0f}–{n['max_ms']:.0f}) | "
            f"{t[kind]['ratio']:.2f} | {t[kind]['diff_ms']:+.0f} ms | "
            f"{t[kind]['paired_diff_median_ms']:+.0f} ms |"
        )
    lines += [
        "",
        "| medians, ms after the post | sandbox | task.run | session.thread_* "
        "| turn.intent | first model request |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        for sb in SANDBOXES:
            s = t[kind][sb]["steps_median_ms"]
            steps = " | ".join(f"{s[x]:.0f}" for x in STEPS)
            lines.append(f"| {kind} | {sb} | {steps} | {t[kind][sb]['median_ms']:.0f} |")
    p = res["probes"]
    lines += ["", "| probe, median ms | bwrap | none |", "| --- | ---: | ---: |"]
    for what in ("true", "codex_init"):
        lines.append(
            f"| {what} | {p[f'{what}_bwrap']['median_ms']} | {p[f'{what}_none']['median_ms']} |"
        )
    f = res["floor"]
    lines += [
        "",
        "| against the direct floor (same Codex, stdio gitea-mcp per thread) | forgeflow, jailed "
        "| floor | forgeflow / floor |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, ours, theirs in (
        ("new issue (active repository) vs thread + MCP ready + turn", "new_issue", "new_issue"),
        ("follow-up vs warm turn (turn/start → request)", "follow_up", "warm_turn"),
    ):
        a, b = t[ours]["bwrap"]["median_ms"], f[theirs]["median_ms"]
        lines.append(f"| {label} | {a:.0f} ms | {b:.0f} ms | {a / b:.2f} |")
    o = res["offline"]
    lines += [
        "",
        "| FORGEFLOW_AGENT_NETWORK=off, median ms | off | on (jailed) |",
        "| --- | ---: | ---: |",
    ]
    for kind in ("new_repo", "new_issue", "follow_up"):
        lines.append(
            f"| {KINDS[kind]} | {o[kind]['median_ms']:.0f} | {t[kind]['bwrap']['median_ms']:.0f} |"
        )
    if "idle" in res:
        i = res["idle"]
        lines.append(
            f"\nIdle: {i['tasks']} tasks ({i['repos']} repositories × {i['issues_per_repo']}, "
            f"{i['states']}), FORGEFLOW_AGENT_IDLE_SECONDS={i['idle_seconds']:g}: all ended "
            f"after {i['all_tasks_end_s']} s, at most {i['max_concurrent_app_servers']} "
            f"app-servers at once, run dir empty {i['run_dir_empty_after_s']} s after the last "
            f"task ended; left {i['waited_after_end_s']} s after it: {i['left_after_idle']}."
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds per sandbox")
    p.add_argument("--idle", type=float, default=3.0, help="FORGEFLOW_AGENT_IDLE_SECONDS")
    p.add_argument("--repos", type=int, default=10, help="idle scenario: repositories")
    p.add_argument("--issues", type=int, default=10, help="idle scenario: issues per repository")
    p.add_argument("--probes", type=int, default=10, help="runs of each start-up probe")
    p.add_argument("--no-idle-scenario", action="store_true")
    p.add_argument("--floor-rounds", type=int, default=5, help="issues of the direct floor")
    p.add_argument("--offline-rounds", type=int, default=5, help="rounds without network")
    # Not under /tmp: there Codex declines to create its helper binaries in CODEX_HOME,
    # which only the unjailed app-server (host paths) would then skip.
    p.add_argument("--workdir", default="/var/tmp", help="parent of the temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forgeflow-agent-latency-", dir=args.workdir))
    started = datetime.now(UTC)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    res: Result = {
        "started": started.isoformat(),
        "args": vars(args),
        "commit": git.stdout.decode().strip(),
        "forgeflow_imported_from": str(Path(jail.__file__).parents[2]),
        "uncommitted_src": dirty.stdout.decode().splitlines(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in lscpu if "Model name" in ln), "?"),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    world = World(root)
    model = ScriptedModel().start()
    answering_agent(model)
    try:
        res["probes"] = probes(root, model, args.probes)
        res["floor"] = floor(root, world, model, args.floor_rounds)
        res["offline"] = offline(root, world, model, args.offline_rounds)
        res["latency"] = latency(root, world, model, args.rounds, args.idle)
        if not args.no_idle_scenario:
            res["idle"] = idle_scenario(root, world, model, args.repos, args.issues, args.idle)
    finally:
        model.stop()
        world.stop()
        res["loadavg_end"] = os.getloadavg()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    t = res["latency"]["table"]
    res["goals"] = {
        "follow_up_ratio_le_1.10": t["follow_up"]["ratio"] <= 1.10,
        "new_repo_diff_le_300ms": t["new_repo"]["diff_ms"] <= 300,
        "new_issue_diff_le_300ms": t["new_issue"]["diff_ms"] <= 300,
        "none_left_after_idle": res.get("idle", {}).get("left_after_idle", 0) == 0,
        # The tool broker's goals, against the direct floor of the same run.
        "new_issue_le_0.25_floor": t["new_issue"]["bwrap"]["median_ms"]
        <= 0.25 * res["floor"]["new_issue"]["median_ms"],
        "follow_up_le_1.2_floor_warm_turn": t["follow_up"]["bwrap"]["median_ms"]
        <= 1.2 * res["floor"]["warm_turn"]["median_ms"],
    }
    out = ROOT / "bench" / "results" / f"agent-latency-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    print(json.dumps(res["goals"]))
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(res["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
