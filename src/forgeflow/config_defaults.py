"""The defaults of settings that depend on this host and installation: where the data
folder is, which Codex CLI a bare ``codex`` means, how many workspaces prepare at once.
``config.py`` keeps the settings themselves."""

from __future__ import annotations

import os
from pathlib import Path

# The checkout forgeflow is installed from (scripts/setup.sh installs it editable), and
# the Codex CLI that setup pinned there (tools/node/package-lock.json).
INSTALLATION = Path(__file__).resolve().parents[2]
PINNED_CODEX = INSTALLATION / "tools" / "node" / "node_modules" / ".bin" / "codex"


def default_data_dir() -> Path:
    """``.forgeflow`` in the checkout forgeflow is installed from (where scripts/serve.sh
    keeps its data), so ``.venv/bin/forgeflow doctor`` or ``migrate`` run from another
    folder look at the same database; ``./.forgeflow`` for an installation that is not a
    checkout."""
    if (INSTALLATION / "scripts" / "serve.sh").is_file():
        return INSTALLATION / ".forgeflow"
    return Path(".forgeflow")


def default_max_preparations() -> int:
    """How many tasks prepare their workspace (clone or fetch, worktree) at once: one
    per core this process may run on, and at least two.

    A clone or fetch is mostly CPU work on this host (git's pack indexing and checkout;
    with Gitea beside forgeflow, its pack too), and the webhook's answers need a share
    of the same cores: with one preparation per core, the event loop competes with
    about as many runnable git processes as there are cores instead of with one per new
    repository (185 of them in a burst on two cores, answers then took up to 7 s). Two
    at least, so that one slow clone does not hold up every other repository."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not every platform has CPU affinity
        cores = os.cpu_count() or 1
    return max(2, cores)
