"""Resident memory of `forgeflow serve` with all its descendants after 100 sessions on
10 repositories (issue 22), with forgeflow's own Gitea tools and with the PyPI
`gitea-mcp` as the opt-in external server, in one run. Run by hand, never by pytest:

    .venv/bin/python bench/memory.py            # ≈ 3–6 minutes on 2 cores

The same jailed `forgeflow serve` (SQLite, the pinned `codex app-server` in bubblewrap,
the testkit's scripted model server answering through the Gitea tools, the testkit's
Gitea emulator in this process) runs twice: `own` (the default: no Gitea MCP server to
install) and `external` (FORGEFLOW_GITEA_MCP_COMMAND names `gitea-mcp`, how every
set-up ran before). Each gets 10 repositories of 10 issues and one mention on every
issue, posted at once; app-servers stop after FORGEFLOW_AGENT_IDLE_SECONDS (`--idle`).

Every 250 ms a sampler walks /proc from the serve's pid down and sums VmRSS and PSS
(smaps_rollup: shared pages counted once across the app-servers) over the serve and
every descendant (git, bwrap, the app-servers, the Gitea MCP server), and notes each
Gitea MCP process it sees. Reported: at start, at the peak while the sessions run, and
once idle (every app-server stopped by its idle timer). A session counts only when its
task succeeded and its issue holds exactly one final comment of the bot with the task's
marker (a verified reply).

Writes bench/results/memory-<timestamp>.json, prints a Markdown table, exits 1 when a
session did not answer.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    BOT,
    GITEA_MCP,
    OWNER,
    ROOT,
    Mention,
    Serve,
    World,
    answering_model,
    codex_serve,
    machine,
    scratch,
    wait_for,
    write_result,
)
from forgeflow_testkit.model_server import ScriptedModel

Result = dict[str, Any]
VARIANTS = ("own", "external")


@dataclass(frozen=True)
class Proc:
    pid: int
    argv: str
    rss_kb: int
    pss_kb: int


def kb(path: Path, key: str) -> int:
    """A ``key: N kB`` line of a /proc status-like file (0 when the kernel has none: a
    zombie has no VmRSS)."""
    for line in path.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def tree(root: int) -> list[Proc]:
    """``root`` and every descendant, from one pass over /proc; a process that ends while
    it is read is left out, and so is a fork of ``root`` caught before its exec (the
    serve's own argv: its pages are the serve's, shared, and it is gone a moment later)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below, todo = [root], [root]
    while todo:
        pid = todo.pop()
        kids = [c for c, p in parent.items() if p == pid]
        below += kids
        todo += kids
    out: list[Proc] = []
    for pid in below:
        base = Path(f"/proc/{pid}")
        try:
            argv = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if out and out[0].pid == root and argv == out[0].argv:
                continue
            out.append(
                Proc(pid, argv, kb(base / "status", "VmRSS:"), kb(base / "smaps_rollup", "Pss:"))
            )
        except OSError:
            continue
    return out


def is_mcp(p: Proc) -> bool:
    return GITEA_MCP in p.argv


def kind(p: Proc) -> str:
    """What a process is, by its program's name (a Python script's by the script's)."""
    words = [Path(w).name for w in p.argv.split()[:2]] or ["?"]
    return words[1] if words[0].startswith("python") and len(words) > 1 else words[0]


def by_kind(procs: list[Proc]) -> dict[str, Result]:
    """Count, VmRSS and PSS (MB) per kind of process, the largest first."""
    out: dict[str, Result] = {}
    for p in procs:
        row = out.setdefault(kind(p), {"n": 0, "rss_mb": 0.0, "pss_mb": 0.0})
        row["n"] += 1
        row["rss_mb"] += p.rss_kb / 1024
        row["pss_mb"] += p.pss_kb / 1024
    ordered = sorted(out.items(), key=lambda kv: -kv[1]["pss_mb"])
    return {
        k: {**v, "rss_mb": round(v["rss_mb"]), "pss_mb": round(v["pss_mb"])} for k, v in ordered
    }


@dataclass(frozen=True)
class Reading:
    """The tree's memory at one moment, in MB."""

    rss_mb: float
    pss_mb: float
    serve_rss_mb: float  # the serve's own process
    mcp_rss_mb: float  # the Gitea MCP processes among them
    processes: int

    @classmethod
    def of(cls, procs: list[Proc], serve_pid: int) -> Reading:
        def mb(kbs: list[int]) -> float:
            return round(sum(kbs) / 1024, 1)

        return cls(
            rss_mb=mb([p.rss_kb for p in procs]),
            pss_mb=mb([p.pss_kb for p in procs]),
            serve_rss_mb=mb([p.rss_kb for p in procs if p.pid == serve_pid]),
            mcp_rss_mb=mb([p.rss_kb for p in procs if is_mcp(p)]),
            processes=len(procs),
        )


@dataclass
class Sampler:
    """Samples the serve's tree every 250 ms in a thread: the reading with the most
    resident memory, the Gitea MCP processes seen, the most app-servers at once."""

    serve: Serve
    peak: Reading | None = None
    peak_kinds: dict[str, Result] = field(default_factory=dict)
    mcp_pids: set[int] = field(default_factory=set)
    most_mcp: int = 0
    most_app_servers: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            procs = tree(self.serve.pid)
            mcp = {p.pid for p in procs if is_mcp(p)}
            self.mcp_pids |= mcp
            self.most_mcp = max(self.most_mcp, len(mcp))
            self.most_app_servers = max(self.most_app_servers, len(app_servers(self.serve)))
            now = Reading.of(procs, self.serve.pid)
            if self.peak is None or now.rss_mb > self.peak.rss_mb:
                self.peak, self.peak_kinds = now, by_kind(procs)
            self.samples += 1


def app_servers(serve: Serve) -> list[Path]:
    """One pgid file per running app-server (the acceptance tests count them so)."""
    return list((serve.workdir / "data" / "run").glob("codex-*.pgid"))


def replies(world: World, mentions: list[Mention]) -> int:
    """Mentions whose issue holds exactly one final comment of the bot with the task's
    marker."""
    verified = 0
    for m in mentions:
        finals = [
            c
            for c in world.emu.comments(OWNER, m.repo, m.issue)
            if c["user"]["login"] == BOT
            and "kind=final" in c["body"]
            and f"taskId={m.task_id} " in c["body"]
        ]
        verified += len(finals) == 1
    return verified


def unanswered(serve: Serve, task_ids: list[str]) -> list[Result]:
    """What became of the tasks that did not succeed: state, error and their audit trail
    (a session that fails under load is a finding, not noise)."""
    out = []
    for task_id in task_ids:
        sql = "SELECT state, attempt, error_code, execution_error, reply_error FROM tasks"
        state, attempt, code, error, reply = serve.query(f"{sql} WHERE task_id = ?", [task_id])[0]
        trail = [a for a, _ in serve.audit(task_id)]
        row = {"task": task_id, "state": state, "attempt": attempt, "error_code": code}
        out.append(row | {"error": error, "reply_error": reply, "audit": trail})
    return out


def variant(
    world: World, root: Path, model: ScriptedModel, name: str, args: argparse.Namespace
) -> Result:
    """One serve, ``args.repos`` repositories of ``args.issues`` issues, a mention on each
    issue posted at once; its memory at start, at the peak, and once idle."""
    env = {"FORGEFLOW_AGENT_IDLE_SECONDS": str(args.idle)}
    if name == "external":
        env["FORGEFLOW_GITEA_MCP_COMMAND"] = GITEA_MCP
    out: Result = {"loadavg_1m_start": machine()["loadavg_1m"]}
    serve = codex_serve(world, root / f"memory-{name}", root / f"codex-home-{name}", model, **env)
    try:
        time.sleep(1.0)  # settled after start-up
        out["start"] = vars(Reading.of(tree(serve.pid), serve.pid))
        repos = [f"mem-{name}-{r:02d}" for r in range(args.repos)]
        for repo in repos:
            world.add_repo(repo, args.issues, serve.url)
        with Sampler(serve) as sampler:
            t0 = time.monotonic()
            # Issue by issue across the repositories: every repository has work at once.
            mentions = [world.mention(r, i) for i in range(1, args.issues + 1) for r in repos]
            states = serve.wait_terminal([m.task_id for m in mentions], 300 + 10 * len(mentions))
            out["sessions_s"] = round(time.monotonic() - t0, 1)
            world.emu.flush_deliveries()
            wait_for(
                lambda: not app_servers(serve), args.idle + 120, "the idle app-servers stop", 0.2
            )
            out["idle_after_s"] = round(time.monotonic() - t0, 1)
        time.sleep(2.0)  # the last jail's processes reaped
        out["idle"] = vars(Reading.of(tree(serve.pid), serve.pid))
        out["idle_by_kind"] = by_kind(tree(serve.pid))
        out["unanswered"] = unanswered(serve, [t for t, st in states.items() if st != "succeeded"])
        if out["unanswered"]:
            out["serve_log_tail"] = serve.log()[-3000:]
    finally:
        serve.stop()
    assert sampler.peak is not None
    out |= {
        "sessions": len(mentions),
        "succeeded": sum(s == "succeeded" for s in states.values()),
        "verified_replies": replies(world, mentions),
        "peak": vars(sampler.peak),
        "peak_by_kind": sampler.peak_kinds,
        "samples": sampler.samples,
        "mcp_processes_seen": len(sampler.mcp_pids),
        "most_mcp_at_once": sampler.most_mcp,
        "most_app_servers_at_once": sampler.most_app_servers,
        "loadavg_1m_end": machine()["loadavg_1m"],
    }
    return out


def run(args: argparse.Namespace, root: Path) -> Result:
    res: Result = {"machine": machine(), "args": vars(args)}
    world = World(root)
    model = answering_model()
    try:
        for name in VARIANTS:
            print(f"{name} …", file=sys.stderr, flush=True)
            res[name] = variant(world, root, model, name, args)
    finally:
        model.stop()
        world.stop()
    res["machine"]["loadavg_1m_end"] = machine()["loadavg_1m"]
    return res


def markdown(res: Result) -> str:
    m, own, ext = res["machine"], res["own"], res["external"]
    lines = [
        f"{m['at']}, commit {m['commit']}{' (src/ modified)' if m['uncommitted_src'] else ''}, "
        f"{m['cpu']}, {m['cores']} cores, load average {m['loadavg_1m']:.2f} → "
        f"{m['loadavg_1m_end']:.2f} (own {own['loadavg_1m_start']:.2f} → "
        f"{own['loadavg_1m_end']:.2f}, external {ext['loadavg_1m_start']:.2f} → "
        f"{ext['loadavg_1m_end']:.2f})",
        "",
        "| serve + descendants | own tools | external gitea-mcp | own ÷ external | external − own"
        " |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for when in ("start", "peak", "idle"):
        for key, label in (
            ("rss_mb", "VmRSS"),
            ("pss_mb", "PSS"),
            ("mcp_rss_mb", "of which Gitea MCP, VmRSS"),
        ):
            a, b = own[when][key], ext[when][key]
            ratio = f"{a / b:.2f}×" if a and b else "–"
            lines.append(
                f"| {when}: {label} | {a:,.0f} MB | {b:,.0f} MB | {ratio} | {b - a:+,.0f} MB |"
            )
        a, b = own[when]["processes"], ext[when]["processes"]
        lines.append(f"| {when}: processes | {a} | {b} | – | {b - a:+} |")
    for key, label in (
        ("mcp_processes_seen", "Gitea MCP processes seen"),
        ("most_app_servers_at_once", "app-servers at once, most"),
        ("sessions_s", "mentions posted → every task ended (s)"),
    ):
        lines.append(f"| {label} | {own[key]} | {ext[key]} | – | – |")
    for v in (own, ext):
        v["answered"] = f"{v['verified_replies']}/{v['sessions']} ({v['succeeded']} succeeded)"
    lines.append(f"| verified replies | {own['answered']} | {ext['answered']} | – | – |")
    lines.append("")
    for name, v in (("own", own), ("external", ext)):
        for u in v["unanswered"]:
            lines.append(f"- {name}: task {u['task']} ended {u['state']} ({u['error_code']})")
        kinds = ", ".join(
            f"{k} {r['n']}× {r['rss_mb']:,}/{r['pss_mb']:,} MB"
            for k, r in v["peak_by_kind"].items()
        )
        lines.append(f"- at the peak, {name} (processes, VmRSS/PSS): {kinds}")
    return "\n".join(lines)


def answered(res: Result) -> bool:
    return all(
        res[v]["verified_replies"] == res[v]["succeeded"] == res[v]["sessions"] for v in VARIANTS
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repos", type=int, default=10, help="repositories per serve")
    p.add_argument(
        "--issues", type=int, default=10, help="issues (one session each) per repository"
    )
    p.add_argument("--idle", type=float, default=5.0, help="FORGEFLOW_AGENT_IDLE_SECONDS")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    # Not under /tmp: there Codex declines to make its helper binaries in CODEX_HOME.
    with scratch("forgeflow-memory-", keep=args.keep, parent="/var/tmp") as root:
        res = run(args, root)
    out = write_result("memory", res)
    print(markdown(res))
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0 if answered(res) else 1


if __name__ == "__main__":
    sys.exit(main())
