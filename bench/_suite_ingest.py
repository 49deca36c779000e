"""(a) of bench/suite.py: ingest of forgeflow vs the bare baseline vs Probot.

bench/ingest.py's machinery, with a third server: a minimal Probot app
(bench/probot/app.js, `createNodeMiddleware`, an `issue_comment.created` handler that
persists nothing) on Node, fed the same signed request pool (Gitea sends the GitHub
headers Probot reads: X-GitHub-Event, X-GitHub-Delivery, X-Hub-Signature-256). Probot
answers a verified delivery 200, the other two 202; each counts its own answer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ingest
import servers
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from loadgen import write_requests

KINDS = ("forgeflow", "baseline", "probot")


def settings(quick: bool, nice: int) -> argparse.Namespace:
    """bench/ingest.py's options; quick mode: one shorter round, fewer repeats."""
    duration = 5.0 if quick else 15.0
    warmup = 200 if quick else 300
    return argparse.Namespace(
        rounds=1 if quick else 3,
        duration=duration,
        rate=200.0,
        connections=32,
        fixed_conns=16,
        warmup=warmup,
        # Saturation is a closed loop: the pool must outlast the fastest server (the
        # baseline, ≈ 7,000/s here); generating it costs ≈ 1 ms per delivery.
        pool=warmup + round((7_000 if quick else 10_000) * duration),
        role="ingress",
        quiet_below=0.3,
        quiet_wait=5.0 if quick else 60.0,
        nice=nice,
        attempts=1 if quick else 2,
    )


def run(work: Path, src: str, quick: bool, nice: int) -> dict[str, Any]:
    args = settings(quick, nice)
    probot_version = servers.setup_probot()
    emu = GiteaEmulator(work / "git").start()
    runs: list[dict[str, Any]] = []
    try:
        token = emu.add_user(ingest.BOT)
        emu.add_user(ingest.AUTHOR)
        emu.add_repo(ingest.OWNER, ingest.REPO)
        emu.set_permission(ingest.OWNER, ingest.REPO, ingest.AUTHOR, "write")
        emu.set_permission(ingest.OWNER, ingest.REPO, ingest.BOT, "admin")
        t0 = time.perf_counter()
        pool_file = work / "requests.bin"
        size = write_requests(pool_file, args.pool, ingest.build_pool(emu, args.pool))
        print(
            f"  {args.pool} signed deliveries in {time.perf_counter() - t0:.0f} s", file=sys.stderr
        )
        emu_info = {"url": emu.url, "token": token, "src": src}
        for rnd in range(args.rounds):
            for mode in ("fixed", "saturate"):
                order = list(KINDS[rnd % 3 :] + KINDS[: rnd % 3])  # rotate who goes first
                for kind in order:
                    res = ingest.measure(kind, mode, args, pool_file, work, emu_info)
                    res["round"] = rnd + 1
                    runs.append(res)
                    print(
                        f"  {kind} {mode}: {res['accepted_per_s']:.0f}/s, p99 {res['p99_ms']} ms",
                        file=sys.stderr,
                    )
    finally:
        emu.stop()
    return {
        "settings": {**vars(args), "avg_request_bytes": round(size / args.pool)},
        "probot_version": probot_version,
        "summary": summarise(runs),
        "verified": all(r["verification"]["ok"] for r in runs),
        "runs": runs,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per server: medians over the rounds of each figure."""
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        mine = [r for r in runs if r["server"] == kind]
        row: dict[str, float] = {}
        for mode, keys in (
            ("saturate", ("accepted_per_s", "p50_ms", "p99_ms", "server_cpu_cores")),
            ("fixed", ("accepted_per_s", "p50_ms", "p99_ms", "max_ms")),
        ):
            for key in keys:
                values = [r[key] for r in mine if r["mode"] == mode and r[key] is not None]
                if values:
                    row[f"{mode}_{key}"] = round(statistics.median(values), 2)
        row["other_cpu_cores_max"] = max((r["other_cpu_cores"] for r in mine), default=0.0)
        out[kind] = row
    return out
