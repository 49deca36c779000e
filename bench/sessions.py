"""A session's thread beyond its worker (issue #27): a follow-up's time from its mention
to the model's first request when the worker must restore the thread (its jail home was
lost: the rollout comes from the database through a one-shot jail) against the same
follow-up when the worker has it on disk, in the same run; and the bytes a session's
kept thread adds per turn. Run by hand, never by pytest:

    .venv/bin/python bench/sessions.py --rounds 3       # ≈ 1 minute on 2 cores

Both follow-ups start a fresh app-server (the previous one went idle), so the ratio is
what the restore adds: the database read, the jail that writes the rollout, and
``thread/resume`` by path instead of by id.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    OWNER,
    ROOT,
    Serve,
    World,
    answering_model,
    codex_serve,
    machine,
    scratch,
    summary_ms,
    wait_for,
    write_result,
)
from latency import mention_to_request

Result = dict[str, Any]


def idle(serve: Serve) -> None:
    """Until no app-server runs: the next follow-up starts one from what is on disk."""
    run = serve.workdir / "data" / "run"
    wait_for(lambda: not list(run.glob("codex-*.pgid")) or None, 60, "the app-server idles")


def kept_bytes(serve: Serve, repo: str) -> int:
    rows = serve.query(
        "SELECT bytes FROM session_threads WHERE session_key LIKE ?", (f"%{OWNER}/{repo}:%",)
    )
    return int(rows[0][0]) if rows else 0


def run(root: Path, rounds: int, turns: int) -> Result:
    model = answering_model()
    world = World(root)
    idle_soon = {"FORGEFLOW_AGENT_IDLE_SECONDS": "1"}
    serve = codex_serve(world, root / "serve", root / "codex-home", model, **idle_soon)
    local: list[float] = []
    restored: list[float] = []
    per_turn: list[int] = []
    try:
        home_root = serve.workdir / "data" / "workspaces" / ".homes" / "default" / OWNER
        for k in range(rounds):
            repo = f"s{k}"
            world.add_repo(repo, 1, serve.url)
            sizes = []
            for _ in range(turns):  # untimed: the session's first turns
                mention_to_request(serve, world, model, repo, 1)
                sizes.append(kept_bytes(serve, repo))
            per_turn += [b - a for a, b in itertools.pairwise(sizes)]
            idle(serve)
            local.append(mention_to_request(serve, world, model, repo, 1))
            idle(serve)
            shutil.rmtree(home_root / repo)  # the worker lost the jail home
            restored.append(mention_to_request(serve, world, model, repo, 1))
            audit = serve.query(
                "SELECT count(*) FROM audit_events WHERE action = 'session.thread_restored'"
            )
            if int(audit[0][0]) != k + 1:
                raise RuntimeError(f"round {k}: the follow-up did not restore the thread")
    finally:
        serve.stop()
        world.stop()
        model.stop()
    out: Result = {"machine": machine(), "rounds": rounds, "turns_before": turns}
    out["follow_up_local"] = summary_ms(local)
    out["follow_up_restored"] = summary_ms(restored)
    out["restore_ratio_p50"] = round(
        out["follow_up_restored"]["p50_ms"] / out["follow_up_local"]["p50_ms"], 2
    )
    out["kept_bytes_per_turn"] = per_turn
    out["kept_bytes_per_turn_mean"] = round(sum(per_turn) / max(1, len(per_turn)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="sessions, each timed once each way")
    p.add_argument("--turns", type=int, default=3, help="turns before the timed follow-ups")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    # Not under /tmp: there Codex declines to make its helper binaries in CODEX_HOME.
    with scratch("forgeflow-sessions-", keep=args.keep, parent="/var/tmp") as root:
        res = run(root, args.rounds, args.turns)
    out = write_result("sessions", res)
    print(
        f"follow-up → first model request: local p50 {res['follow_up_local']['p50_ms']} ms,"
        f" restored p50 {res['follow_up_restored']['p50_ms']} ms"
        f" (×{res['restore_ratio_p50']}); kept bytes per turn ≈ {res['kept_bytes_per_turn_mean']}"
    )
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
