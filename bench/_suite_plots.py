"""PNG plots of bench/suite.py (matplotlib, Agg backend): one per benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on the benchmark machine; must precede pyplot
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

COLORS = {"forgeflow": "#1f77b4", "baseline": "#7f7f7f", "probot": "#2ca02c", "goal": "#d62728"}


def _save(fig: Any, out: Path, name: str) -> str:
    path = out / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return name


def _bars(ax: Axes, labels: list[str], values: list[float], colors: list[str], fmt: str) -> None:
    bars = ax.bar(labels, values, color=colors)
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(
            fmt.format(v),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )


def ingest(r: dict[str, Any], out: Path) -> str:
    s = r["summary"]
    kinds = [k for k in ("forgeflow", "baseline", "probot") if k in s]
    colors = [COLORS[k] for k in kinds]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    _bars(a1, kinds, [s[k].get("saturate_accepted_per_s", 0) for k in kinds], colors, "{:.0f}")
    a1.set_yscale("log")
    a1.set_title("accepted/s at saturation (32 connections)")
    x = range(len(kinds))
    w = 0.38
    p50 = [s[k].get("fixed_p50_ms", 0) for k in kinds]
    p99 = [s[k].get("fixed_p99_ms", 0) for k in kinds]
    a2.bar([i - w / 2 for i in x], p50, w, label="p50", color=colors, alpha=0.55)
    a2.bar([i + w / 2 for i in x], p99, w, label="p99", color=colors)
    a2.set_xticks(list(x), kinds)
    a2.set_yscale("log")
    a2.set_ylabel("ms")
    a2.set_title(f"latency at {r['settings']['rate']:.0f} req/s offered (p50 light, p99 dark)")
    return _save(fig, out, "ingest.png")


def latency(r: dict[str, Any], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = [
        ("202 itself", r["posting"]),
        ("warm 202→start", r["warm"]),
        ("cold 202→start", r["cold"]),
    ]
    labels = [n for n, _ in rows]
    x = range(len(rows))
    ax.bar(
        [i - 0.2 for i in x],
        [v["p50_ms"] for _, v in rows],
        0.4,
        label="p50",
        color=[COLORS["baseline"], COLORS["forgeflow"], COLORS["forgeflow"]],
        alpha=0.55,
    )
    ax.bar(
        [i + 0.2 for i in x],
        [v["p99_ms"] for _, v in rows],
        0.4,
        label="p99",
        color=[COLORS["baseline"], COLORS["forgeflow"], COLORS["forgeflow"]],
    )
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("ms")
    ax.set_title("202 → turn start, one mention at a time (p50 light, p99 dark)")
    return _save(fig, out, "latency.png")


def scaling(r: dict[str, Any], out: Path) -> str:
    pts = r["points"]
    n = [p["repos"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        n,
        [p["makespan_s"] for p in pts],
        "o-",
        color=COLORS["forgeflow"],
        label="forgeflow: makespan",
    )
    ax.plot(
        n,
        [p["last_start_s"] for p in pts],
        "s--",
        color=COLORS["forgeflow"],
        alpha=0.6,
        label="forgeflow: last turn start",
    )
    ax.plot(
        n,
        [r["ideal_s"]] * len(n),
        "-",
        color=COLORS["baseline"],
        label=f"ideal: one turn ({r['ideal_s']:g} s)",
    )
    ax.set_xlabel("repositories (1 task each)")
    ax.set_ylabel("seconds after the first 202")
    ax.set_title("Cross-repository scaling")
    ax.legend()
    return _save(fig, out, "scaling.png")


def cluster(r: dict[str, Any], out: Path) -> str:
    runs = r["runs"]
    names = [x["name"] for x in runs]
    colors = [
        COLORS["baseline"] if x["database"] == "sqlite" else COLORS["forgeflow"] for x in runs
    ]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    _bars(a1, names, [x["makespan_s"] for x in runs], colors, "{:.1f}")
    a1.axhline(runs[0]["ideal_s"], color=COLORS["goal"], ls=":", label="ideal")
    a1.set_ylabel("makespan, s")
    a1.legend()
    _bars(a2, names, [x["tasks_per_s"] for x in runs], colors, "{:.2f}")
    a2.set_ylabel("tasks/s")
    for ax in (a1, a2):
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"{r['repos']} repos × {r['per_repo']} tasks, {r['turn_s']:g} s turns")
    return _save(fig, out, "cluster.png")


def restart(r: dict[str, Any], out: Path) -> str:
    e, s = r["empty"], r["seeded"]
    labels = ["empty: /readyz", f"{r['tasks']} queued: /readyz", "first claim", "first turn"]
    values = [e["readyz_s"], s["readyz_s"], s["first_claim_s"], s["first_turn_start_s"]]
    colors = [COLORS["baseline"]] + [COLORS["forgeflow"]] * 3
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, labels, values, colors, "{:.2f} s")
    ax.axhline(r["goal_s"], color=COLORS["goal"], ls=":", label=f"goal {r['goal_s']:g} s")
    ax.set_ylabel("seconds after exec")
    ax.set_title("Restart: exec → ready → first claim")
    ax.legend()
    return _save(fig, out, "restart.png")


def memory(r: dict[str, Any], out: Path) -> str:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    e, s = r["empty"]["memory_mb"], r["seeded"]["memory_mb"]
    labels = ["empty RSS", "empty HWM", "seeded RSS", "seeded HWM"]
    colors = [COLORS["baseline"]] * 2 + [COLORS["forgeflow"]] * 2
    _bars(a1, labels, [e["VmRSS"], e["VmHWM"], s["VmRSS"], s["VmHWM"]], colors, "{:.0f}")
    a1.axhline(r["goal_mb"], color=COLORS["goal"], ls=":", label=f"goal {r['goal_mb']:g} MB")
    a1.set_ylabel("MB")
    a1.legend()
    for name, color in (("empty", COLORS["baseline"]), ("seeded", COLORS["forgeflow"])):
        pts = r[name]["rss_samples"]
        a2.plot([p[0] for p in pts], [p[1] for p in pts], color=color, label=name)
    a2.set_xlabel("seconds after exec")
    a2.set_ylabel("VmRSS, MB")
    a2.legend()
    fig.suptitle("Resident memory of the serve process")
    return _save(fig, out, "memory.png")
