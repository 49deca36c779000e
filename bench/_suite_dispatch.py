"""(b) and (c) of bench/suite.py, on bench/dispatch.py's own scenarios.

(b) 202 → turn start, one mention at a time (dispatch.latency: warm and cold), beside
    its baseline: how long the 202 itself took (comment posted → 202 received), i.e.
    the part of the path that a server without a scheduler also pays.
(c) The cross-repository scaling curve: N repositories × 1 task with fixed-length turns,
    N in 1, 10, 50, 100, 200, each on a fresh `forgeflow serve`; the baseline is the
    ideal makespan, one turn's length (every repository runs in parallel).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dispatch
from _dispatch_support import Mention, Serve, World, summary_ms


class Serves:
    """One `forgeflow serve` at a time, as bench/dispatch.py runs them."""

    def __init__(self, world: World, root: Path) -> None:
        self.world = world
        self.root = root
        self.live: list[Serve] = []

    def __call__(self, name: str, turn: float, **env: str) -> Serve:
        self.close()
        s = Serve(self.root / name, self.world.emu.url, self.world.bot_token, turn, extra_env=env)
        self.live.append(s)
        s.start()
        return s

    def close(self) -> None:
        while self.live:
            self.live.pop().stop()


class TimedWorld(World):
    """The dispatch benchmark's world, remembering every mention (sent and 202 times)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.mentions: list[Mention] = []

    def mention(self, repo: str, issue: int, text: str = "do it") -> Mention:
        m = super().mention(repo, issue, text)
        self.mentions.append(m)
        return m


def latency(world: TimedWorld, root: Path, n: int, issues: int, cold_n: int) -> dict[str, Any]:
    serves = Serves(world, root)
    before = len(world.mentions)
    try:
        out = dispatch.latency(world, serves, n, issues, cold_n)
    finally:
        serves.close()
    # The 202 itself (comment posted → forgeflow's 202 back at the emulator), for the same
    # mentions: the share of (b) that any webhook server pays before work can start.
    out["posting"] = summary_ms([m.accepted - m.sent for m in world.mentions[before:]])
    out["turn_s"] = 0.2  # dispatch.latency's turn length
    return out


def scaling_curve(world: World, root: Path, sizes: list[int], turn: float) -> dict[str, Any]:
    serves = Serves(world, root)
    points = []
    try:
        for n in sizes:
            t0 = time.monotonic()
            serve = serves(f"curve-{n}", turn)
            repos = [f"c{n}-{i:03d}" for i in range(n)]
            for r in repos:
                world.add_repo(r, 1, serve.url)
            cold = dispatch.scaling_round(serve, world, repos, turn)
            points.append(
                {
                    "repos": n,
                    "succeeded": cold["succeeded"],
                    "makespan_s": cold["makespan_s"],
                    "ratio": cold["ratio"],
                    "last_start_s": cold["last_start_s"],
                    "posting_s": cold["posting_s"],
                    "cpu_ms_per_task": cold["cpu_ms_per_task"],
                    "latency": cold["latency"],
                    "wall_s": round(time.monotonic() - t0, 1),
                }
            )
    finally:
        serves.close()
    return {"turn_s": turn, "ideal_s": turn, "points": points}
