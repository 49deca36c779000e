"""Where the time of bench/dispatch.py goes: the audit chain of a task from its
``webhook.accept`` row to the runtime's turn start, git's own trace2 timings of every
git process forgeflow runs, CPU accounting, and a py-spy sampling profile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from _dispatch_support import percentile

PY_SPY = str(Path(sys.executable).parent / "py-spy")

# The critical path of a task, as its audit rows show it: each step ends at the first
# row (after the previous step's) whose action is listed. Receipt rows (comment.*) are
# left out: the receipt is posted concurrently with the workspace steps.
CHAIN: tuple[tuple[tuple[str, ...], str], ...] = (
    (("task.claim",), "wake → candidates query → claim txn"),
    (
        ("workspace.fetch", "workspace.clone", "workspace.fetch_skipped"),
        "prepare_repo: clone + session checks, git fetch/clone or skip",
    ),
    (("workspace.status",), "prepare_session: worktree checks + git status"),
    (("task.run",), "receipt (posted beside the git work) + → running"),
    (
        ("session.thread_start", "session.thread_resume", "session.thread_reuse"),
        "ensure_session + bind thread",
    ),
    (("turn.intent",), "prompt (await Gitea context) + turn intent row"),
    (("turn.start",), "start_turn + turn.start row"),
)
TRACE_STEP = "turn.start row → runtime emits start"


def chain(audit: list[tuple[str, float]], turn_start: float) -> list[tuple[str, float, float]]:
    """(step, began, ended) along CHAIN from ``webhook.accept`` to the turn start."""
    at = next((t for a, t in audit if a == "webhook.accept"), None)
    if at is None:
        return []
    out: list[tuple[str, float, float]] = []
    rest = [(a, t) for a, t in audit if t >= at]
    for actions, label in CHAIN:
        hit = next((i for i, (a, _) in enumerate(rest) if a in actions), None)
        if hit is None:
            continue
        t = rest[hit][1]
        out.append((label, at, t))
        at, rest = t, rest[hit + 1 :]
    out.append((TRACE_STEP, at, turn_start))
    return out


def rank(chains: list[list[tuple[str, float, float]]]) -> list[dict[str, Any]]:
    """Mean/p50/p99 of each step across tasks, largest mean first, with its share."""
    values: dict[str, list[float]] = defaultdict(list)
    for c in chains:
        for label, t0, t1 in c:
            values[label].append(t1 - t0)
    n = max(len(chains), 1)
    total = sum(sum(v) for v in values.values()) / n
    rows: list[dict[str, Any]] = []
    for label, v in values.items():
        mean = sum(v) / n
        rows.append(
            {
                "step": label,
                "mean_ms": round(mean * 1000, 1),
                "p50_ms": round(percentile(v, 50) * 1000, 1),
                "p99_ms": round(percentile(v, 99) * 1000, 1),
                "share": round(mean / total, 3) if total > 0 else 0.0,
            }
        )
    rows.sort(key=lambda r: -float(r["mean_ms"]))
    return rows


# -- git trace2 --------------------------------------------------------------------------


def git_wrapper(root: Path) -> tuple[Path, Path]:
    """A ``git`` first on PATH that turns on trace2 event logging (one file per process)
    and execs the real git; returns (bin directory, trace directory)."""
    real = next(
        str(Path(d) / "git")
        for d in os.environ.get("PATH", "/usr/bin").split(os.pathsep)
        if d and (Path(d) / "git").is_file()
    )
    bin_dir, trace_dir = root / "gitbin", root / "git-trace2"
    bin_dir.mkdir(parents=True, exist_ok=True)
    trace_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "git"
    script.write_text(
        f'#!/bin/sh\nGIT_TRACE2_EVENT="{trace_dir}"\nexport GIT_TRACE2_EVENT\nexec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return bin_dir, trace_dir


@dataclass(frozen=True)
class GitProc:
    command: str  # e.g. "status", "fetch", "worktree list"
    start: float
    seconds: float
    children: int  # git subprocesses it started (remote-http, index-pack, ...)


def _git_command(argv: list[str]) -> str:
    """The subcommand of a git argv ("worktree list" for worktree), global options skipped."""
    words: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-c", "-C"):
            skip = True
        elif not a.startswith("-"):
            words.append(a)
    if not words:
        return "git"
    return " ".join(words[:2]) if words[0] in ("worktree", "remote") else words[0]


def read_git_trace(trace_dir: Path) -> list[GitProc]:
    """Top-level git processes (not their git children) with wall time from trace2."""
    procs: dict[str, dict[str, Any]] = {}
    for path in trace_dir.iterdir():
        for line in path.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            p = procs.setdefault(e["sid"], {})
            if e["event"] == "start":
                p["start"] = datetime.fromisoformat(e["time"]).timestamp() - e["t_abs"]
                p["command"] = _git_command(e["argv"][1:])
            elif e["event"] == "atexit":
                p["seconds"] = e["t_abs"]
    kids = Counter(sid.rsplit("/", 1)[0] for sid in procs if "/" in sid)
    return sorted(
        (
            GitProc(p["command"], p["start"], p.get("seconds", 0.0), kids[sid])
            for sid, p in procs.items()
            if "/" not in sid and "start" in p and "command" in p
        ),
        key=lambda g: g.start,
    )


def git_by_step(
    procs: list[GitProc], chains: list[list[tuple[str, float, float]]]
) -> list[dict[str, Any]]:
    """Per critical-path step: git processes per task and their wall time, by command."""
    steps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in chains:
        for label, t0, t1 in c:
            for g in procs:
                if t0 <= g.start < t1:
                    steps[label][g.command].append(g.seconds)
    n = max(len(chains), 1)
    out = []
    for label, commands in steps.items():
        count = sum(len(v) for v in commands.values())
        out.append(
            {
                "step": label,
                "git_per_task": round(count / n, 2),
                "git_ms_per_task": round(sum(sum(v) for v in commands.values()) / n * 1000, 1),
                "commands": {
                    cmd: {
                        "per_task": round(len(v) / n, 2),
                        "mean_ms": round(sum(v) / len(v) * 1e3, 1),
                    }
                    for cmd, v in sorted(commands.items(), key=lambda kv: -sum(kv[1]))
                },
            }
        )
    return out


# -- CPU and py-spy ------------------------------------------------------------------------


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def machine_busy() -> float:
    """CPU seconds all processors of the machine have been busy since boot."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class CpuMeter:
    """CPU seconds spent between start and stop by the serve process, the git processes
    it ran, this process (the Gitea emulator, mostly) and its children (git http-backend;
    py-spy too when it runs), and by everything else on the machine ("foreign")."""

    def __init__(self, serve_pid: int) -> None:
        self.pid = serve_pid
        self.t0 = time.monotonic()
        self.serve0 = proc_cpu(serve_pid)
        self.me0 = os.times()
        self.busy0 = machine_busy()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        serve = proc_cpu(self.pid)
        me = os.times()
        out = {
            "wall_s": round(wall, 2),
            "serve_rss_mb": _rss_mb(self.pid),
            "emulator_rss_mb": _rss_mb(os.getpid()),
            "serve_python_s": serve[0] - self.serve0[0],
            "serve_git_children_s": serve[1] - self.serve0[1],
            "emulator_process_s": me.user + me.system - self.me0.user - self.me0.system,
            "emulator_git_children_s": me.children_user + me.children_system
            - self.me0.children_user - self.me0.children_system,
        }  # fmt: skip
        ours = sum(v for k, v in out.items() if k.endswith("_s") and k != "wall_s")
        out["foreign_s"] = max(machine_busy() - self.busy0 - ours, 0.0)
        out["loadavg_1m"] = loadavg()
        return {k: round(v, 2) for k, v in out.items()}


class PySpy:
    """``py-spy record`` of the serve process in collapsed-stack form (non-blocking)."""

    def __init__(self, pid: int, out: Path, rate: int = 400) -> None:
        self.pid, self.out, self.rate = pid, out, rate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [PY_SPY, "record", "--pid", str(self.pid), "--format", "raw",
             "--output", str(self.out), "--rate", str(self.rate), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(0.5)  # let it attach

    def stop(self, top: int = 15) -> dict[str, Any]:
        if self.proc is None:
            return {"error": "not started"}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if not self.out.exists():
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            return {"error": err[-500:]}
        return summarise_stacks(self.out.read_text().splitlines(), top)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# Inclusive CPU of these frames (in disjoint threads or call trees) says where it goes.
AREAS = (
    ("spawning git (GitRunner.run, event-loop thread)", "GitRunner.run "),
    ("database writes (Database.write_sync, writer thread)", "Database.write_sync "),
    ("database reads (Database.read_sync, reader threads)", "Database.read_sync "),
    ("Gitea REST calls (GiteaClient._request)", "GiteaClient._request "),
    ("webhook ingress (WebhookIngress.handle)", "WebhookIngress.handle "),
)


def _frame_name(frame: str) -> str:
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where.rsplit(':', 1)[0]})"


def summarise_stacks(lines: list[str], top: int) -> dict[str, Any]:
    """Self and inclusive sample shares from collapsed stacks ("a;b;c 12")."""
    self_n: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";") if " (" in f]
        if frames:
            self_n[frames[-1]] += n
        for f in set(frames):
            incl[f] += n

    def share(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "share": round(n / total, 3)} for f, n in c.most_common(top)]

    package = Counter[str]()
    for f, n in self_n.items():
        where = f.rsplit("(", 1)[-1].rstrip(")")
        package[where.split("/", 1)[0].split(".py", 1)[0]] += n
    ours = Counter({f: n for f, n in incl.items() if "(forgeflow" in f})
    areas = {
        area: round(sum(n for f, n in incl.items() if f.startswith(prefix)) / total, 3)
        for area, prefix in AREAS
    } if total else {}  # fmt: skip
    return {
        "samples": total,
        "areas": areas,
        "self_by_package": share(package),
        "self": share(self_n),
        "inclusive_forgeflow": share(ours),
    }
