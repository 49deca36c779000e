"""Agent jail benchmark: mention → the agent's first model request, jailed vs not.

Run by hand, never by pytest (about 5 minutes on 2 cores with the defaults):

    .venv/bin/python bench/agent_latency.py [--rounds 5] [--repos 10 --issues 10]

In this process: the Gitea emulator (bench/_dispatch_support.World) and the scripted
Responses-API model with `answering_agent` (every turn posts its answer through the
Gitea MCP tool). Two real `forgeflow serve` processes (SQLite, temp data dirs) run the
pinned `codex app-server`, one with FORGEFLOW_SANDBOX=bwrap and one with =none; the
rounds alternate between them. Latency = time.monotonic() just before the emulator's
post_comment → `received_at` of the model's next request. Each round, on a new
repository: new issue (cold: clone + app-server start), follow-up on it (thread loaded),
new issue on the now active repository, then, once the app-server stopped for idleness
(its pgid file gone), a follow-up (new app-server + thread/resume).
Then the idle scenario: --repos × --issues mentions at once (jailed), all tasks end,
wait idle + margin: no pgid file, no app-server process may be left.
Writes bench/results/agent-latency-<timestamp>.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
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

from _dispatch_support import OWNER, Serve, World, wait_for
from forgeflow.agent import jail
from forgeflow.agent.appserver import pgid_file
from forgeflow.agent.provider import to_toml
from forgeflow_testkit.agents import answering_agent, read_turn
from forgeflow_testkit.codex_home import codex_config, write_codex_home
from forgeflow_testkit.model_server import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
GITEA_MCP = Path(sys.executable).parent / "gitea-mcp"
SANDBOXES = ("bwrap", "none")
KINDS = {
    "new_repo": "new issue, new repository (clone + app-server start)",
    "new_issue": "new issue, active repository (app-server running)",
    "follow_up": "follow-up, thread loaded",
    "after_idle": "follow-up after idle stop (new app-server + thread/resume)",
}
STEPS = ("task.run", "session.", "turn.intent")  # audit rows, first of each, for the split
Result = dict[str, Any]


def new_serve(root: Path, name: str, world: World, model: ScriptedModel, **env: str) -> Serve:
    home = write_codex_home(root / name / "codex-home", model.url)
    env = {
        "FORGEFLOW_AGENT_RUNTIME": "codex",
        "FORGEFLOW_CODEX_COMMAND": f"{CODEX} app-server",
        "FORGEFLOW_GITEA_MCP_COMMAND": str(GITEA_MCP),
        "FORGEFLOW_MODEL": "scripted-model",
        **home.env(),
        **env,
    }
    serve = Serve(root / name, world.emu.url, world.bot_token, 0.0, extra_env=env)
    serve.start()
    return serve


def group_of(serve: Serve, repo: str) -> int | None:
    path = pgid_file(serve.workdir / "data" / "run", f"{OWNER}/{repo}")
    try:
        return int(path.read_text().strip())
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
    steps: dict[str, float] = {}
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


def round_of(serve: Serve, world: World, model: ScriptedModel, repo: str, idle: float) -> Result:
    world.add_repo(repo, 2, serve.url)
    out = {"new_repo": measure(serve, world, model, repo, 1)}
    out["follow_up"] = measure(serve, world, model, repo, 1)
    out["new_issue"] = measure(serve, world, model, repo, 2)
    wait_for(lambda: group_of(serve, repo) is None, idle + 60, f"{repo} idle stop", 0.05)
    out["after_idle"] = measure(serve, world, model, repo, 1)
    return out


def summary(values: list[float]) -> Result:
    return {
        "n": len(values),
        "median_ms": round(statistics.median(values), 1),
        "min_ms": min(values),
        "max_ms": max(values),
    }


def latency(root: Path, world: World, model: ScriptedModel, rounds: int, idle: float) -> Result:
    env = {"FORGEFLOW_AGENT_IDLE_SECONDS": str(idle)}
    serves = {
        sb: new_serve(root, sb, world, model, FORGEFLOW_SANDBOX=sb, **env) for sb in SANDBOXES
    }
    raw: dict[str, list[Result]] = {sb: [] for sb in SANDBOXES}
    try:
        for sb, serve in serves.items():  # untimed: broker, gitea-mcp, first clone
            world.add_repo(f"{sb}-warmup", 1, serve.url)
            raw[sb].append({"warmup": measure(serve, world, model, f"{sb}-warmup", 1)})
        for k in range(rounds):
            order = SANDBOXES if k % 2 == 0 else SANDBOXES[::-1]
            for sb in order:
                raw[sb].append(round_of(serves[sb], world, model, f"{sb}-r{k}", idle))
                ms = {kind: r["ms"] for kind, r in raw[sb][-1].items()}
                print(f"round {k} {sb}: {ms}", file=sys.stderr)
    finally:
        for sb, serve in serves.items():
            raw[sb].append({"logs": log_findings(serve)})
            serve.stop()
    out: Result = {"idle_seconds": idle, "raw": raw, "table": {}}
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
            row[sb]["valid"] = all(valid(kind, r) for r in runs)
        row["ratio"] = round(row["bwrap"]["median_ms"] / row["none"]["median_ms"], 3)
        row["diff_ms"] = round(row["bwrap"]["median_ms"] - row["none"]["median_ms"], 1)
        out["table"][kind] = row
    return out


def valid(kind: str, r: Result) -> bool:
    """The app-server was in the state the measure is about, and the request the turn's."""
    running = r["group_before"] is not None and r["group_before"] == r["group_after"]
    warm = kind in ("follow_up", "new_issue")
    return r["first_request_is_the_turns"] and (running if warm else r["group_before"] is None)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def app_server_procs(pid: int) -> list[str]:
    out = []
    for p in descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "app-server" in cmd:
            out.append(f"{p}: {cmd[:120]}")
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def idle_scenario(
    root: Path, world: World, model: ScriptedModel, repos: int, issues: int, idle: float
) -> Result:
    serve = new_serve(
        root,
        "idle",
        world,
        model,
        FORGEFLOW_SANDBOX="bwrap",
        FORGEFLOW_AGENT_IDLE_SECONDS=str(idle),
    )
    run_dir = serve.workdir / "data" / "run"
    names = [f"idle-r{i:02d}" for i in range(repos)]
    for name in names:
        world.add_repo(name, issues, serve.url)
    seen: set[int] = set()
    peak, peak_procs, states = 0, 0, {}
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(1) as pool:
            posting = pool.submit(
                world.mention_all, [(r, i + 1) for r in names for i in range(issues)]
            )
            last_states = 0.0
            while True:
                groups = {int(p.read_text() or 0) for p in run_dir.glob("codex-*.pgid")}
                seen |= groups - {0}
                peak = max(peak, len(groups))
                if time.monotonic() - last_states > 0.5 and posting.done():
                    last_states = time.monotonic()
                    peak_procs = max(peak_procs, len(app_server_procs(serve.pid)))
                    states = serve.states(m.task_id for m in posting.result())
                    if len(states) == repos * issues and all(
                        s in {"succeeded", "succeeded_with_rest_fallback", "failed", "failed_reply"}
                        for s in states.values()
                    ):
                        break
                if time.monotonic() - t0 > 60 + 10 * repos * issues:
                    raise TimeoutError(f"idle scenario: {states}")
                time.sleep(0.1)
        ended = time.monotonic()
        emptied = None
        while time.monotonic() < ended + idle + 10:
            if emptied is None and not list(run_dir.glob("codex-*.pgid")):
                emptied = time.monotonic() - ended
            time.sleep(0.1)
        left_files = sorted(p.name for p in run_dir.glob("codex-*.pgid"))
        left_procs = app_server_procs(serve.pid)
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
            "run_dir_empty_after_s": None if emptied is None else round(emptied, 1),
            "waited_after_end_s": round(time.monotonic() - ended, 1),
            "left_pgid_files": left_files,
            "left_app_server_processes": left_procs,
            "left_groups_alive": sorted(g for g in seen if group_alive(g)),
        }
        out["left_after_idle"] = len(left_files) + len(left_procs) + len(out["left_groups_alive"])
    finally:
        logs = log_findings(serve)
        serve.stop()
    out["logs"] = logs
    out["groups_alive_after_serve_stop"] = sorted(g for g in seen if group_alive(g))
    return out


def log_findings(serve: Serve) -> Result:
    """Lines of forgeflow's stderr and <data_dir>/logs/* that look like trouble."""
    found: Result = {}
    files = [serve.workdir / "serve.log", *sorted((serve.workdir / "data" / "logs").glob("*"))]
    for f in files:
        if f.is_file():
            lines = f.read_text(errors="replace").splitlines()
            bad = [ln for ln in lines if any(w in ln.lower() for w in ("error", "warn", "trace"))]
            found[f.name] = {"lines": len(lines), "flagged": len(bad), "sample": bad[:5]}
    return found


def probes(root: Path, model: ScriptedModel, n: int) -> Result:
    """bwrap alone (`true` in the same jail) and codex start → initialize answer."""
    home, work = root / "probe-home", root / "probe-work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(to_toml(codex_config(model.url)))
    host = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    out: Result = {}
    for what, argv in (("true", ["/usr/bin/true"]), ("codex_init", [str(CODEX), "app-server"])):
        spec = jail.JailSpec(home, (work,), jail.installation_paths(argv))
        for sb, cmd, env in (
            ("bwrap", jail.bwrap_argv(spec, argv), {}),
            ("none", argv, jail.base_env(host)),
        ):
            times = [timed_start(cmd, env, what == "codex_init") for _ in range(n)]
            out[f"{what}_{sb}"] = summary(times)
    return out


def timed_start(cmd: list[str], env: dict[str, str], init: bool) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdin is not None and proc.stdout is not None
    if init:
        timer = threading.Timer(30, proc.kill)
        timer.start()
        msg = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        msg["params"] = {"clientInfo": {"name": "bench", "version": "0"}, "capabilities": {}}
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        while b'"id":1' not in (line := proc.stdout.readline()).replace(b" ", b"") and line:
            pass
        elapsed = time.monotonic() - t0
        timer.cancel()
        proc.kill()
    else:
        proc.wait()
        elapsed = time.monotonic() - t0
    proc.wait()
    return round(elapsed * 1000, 1)


def markdown(res: Result) -> str:
    t = res["latency"]["table"]
    lines = [
        "| mention → first model request | jailed (bwrap) median (min–max) | none median "
        "(min–max) | jailed / none | difference |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, label in KINDS.items():
        b, n = t[kind]["bwrap"], t[kind]["none"]
        lines.append(
            f"| {label} | {b['median_ms']:.0f} ms ({b['min_ms']:.0f}–{b['max_ms']:.0f}) "
            f"| {n['median_ms']:.0f} ms ({n['min_ms']:.0f}–{n['max_ms']:.0f}) "
            f"| {t[kind]['ratio']:.2f} | {t[kind]['diff_ms']:+.0f} ms |"
        )
    lines += [
        "",
        "| where the time goes (medians, ms from the post) | sandbox | task.run "
        "(prepared) | session ready | turn.intent | first request |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        for sb in SANDBOXES:
            s = t[kind][sb]["steps_median_ms"]
            lines.append(
                f"| {kind} | {sb} | {s['task.run']:.0f} | {s['session.']:.0f} "
                f"| {s['turn.intent']:.0f} | {t[kind][sb]['median_ms']:.0f} |"
            )
    if "idle" in res:
        i = res["idle"]
        lines += [
            "",
            f"Idle: {i['tasks']} tasks ({i['repos']} repositories × {i['issues_per_repo']}), "
            f"FORGEFLOW_AGENT_IDLE_SECONDS={i['idle_seconds']:g}: all ended after "
            f"{i['all_tasks_end_s']} s, at most {i['max_concurrent_app_servers']} app-servers "
            f"at once, run dir empty {i['run_dir_empty_after_s']} s after the last task "
            f"ended; left after {i['waited_after_end_s']} s: {i['left_after_idle']}.",
        ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds per sandbox")
    p.add_argument("--idle", type=float, default=3.0, help="FORGEFLOW_AGENT_IDLE_SECONDS")
    p.add_argument("--repos", type=int, default=10, help="idle scenario: repositories")
    p.add_argument("--issues", type=int, default=10, help="idle scenario: issues per repository")
    p.add_argument("--probes", type=int, default=10, help="bwrap / codex start probes (each)")
    p.add_argument("--no-idle-scenario", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forgeflow-agent-latency-"))
    started = datetime.now(UTC)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    res: Result = {
        "started": started.isoformat(),
        "args": vars(args),
        "commit": git.stdout.decode().strip(),
        "cpu": next(
            (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln), "?"
        ),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    world = World(root)
    model = ScriptedModel().start()
    answering_agent(model)
    try:
        res["probes"] = probes(root, model, args.probes)
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
    }
    out = ROOT / "bench" / "results" / f"agent-latency-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    print(json.dumps({"probes": res["probes"], "goals": res["goals"]}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(res["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
