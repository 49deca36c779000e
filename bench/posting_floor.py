"""How long the Gitea emulator alone takes to post the dispatch benchmark's mentions.

Run by hand (never by pytest):

    .venv/bin/python bench/posting_floor.py [--repos 100] [--rounds 3]

The 100-repository scenario of bench/dispatch.py posts one mention on each of 100
repositories from 16 threads; its goal (makespan ≤ 1.5 × a 2 s turn) needs every turn
started within 1 s of the first 202. Here the receiver is bench/floor_app.py (HMAC, JSON,
the mention check and forgeflow's acceptance SQL on raw sqlite3, nothing else), so the
time is what posting costs before forgeflow's scheduler does anything. Prints, per
round, the posting time and the CPU of the emulator's process and of the receiver.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _dispatch_profile as prof
import servers
from _dispatch_support import BOT, WEBHOOK_SECRET, World


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--repos", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ff-posting-") as tmp:
        root = Path(tmp)
        (root / "floor").mkdir()
        src = str(Path(__file__).resolve().parent.parent / "src")
        receiver = servers.start_floor(root / "floor", secret=WEBHOOK_SECRET, bot=BOT, src=src)
        world = World(root)
        try:
            repos = [f"p{i:03d}" for i in range(args.repos)]
            for name in repos:
                world.add_repo(name, 1, receiver.url)
            for n in range(1, args.rounds + 1):
                meter = prof.CpuMeter(receiver.proc.pid)
                mentions = world.mention_all([(name, 1) for name in repos])
                cpu = meter.stop()
                first = min(m.accepted for m in mentions)
                posting = max(m.accepted for m in mentions) - first
                print(
                    f"round {n}: {len(mentions)} mentions posted in {posting:.3f} s; "
                    f"CPU s: emulator process {cpu['emulator_process_s']}, "
                    f"receiver {cpu['serve_python_s']}, others {cpu['foreign_s']}"
                )
                world.emu.flush_deliveries()
        finally:
            world.stop()
            servers.stop(receiver)


if __name__ == "__main__":
    main()
