"""What ``git status --porcelain=v2 --branch -z`` says about a checkout, parsed.

One git process gives both the changed paths and the ``HEAD`` commit and branch, which
used to take three (``rev-parse HEAD``, ``status``, ``symbolic-ref``): on the path from a
mention to its turn, starting a process costs more than git's own work.
"""

from __future__ import annotations

from dataclasses import dataclass

from forgeflow.domain.json import JsonObject

# The arguments of the one status call; callers add nothing (the output format is parsed).
STATUS_ARGS = (
    "status",
    "--porcelain=v2",
    "--branch",
    "-z",
    "--untracked-files=all",
    "--ignored=no",
)

_SUMMARY_LIMIT = 20


@dataclass(frozen=True)
class WorktreeStatus:
    clean: bool
    modified: list[str]
    untracked: list[str]
    unmerged: list[str]
    head: str  # the commit HEAD names, "" before the first commit
    branch: str = "HEAD"  # the checked-out branch's short name, "HEAD" when detached

    def summary(self) -> JsonObject:
        """A bounded, JSON-ready description for the audit log and the next prompt."""
        return {
            "clean": self.clean,
            "head": self.head,
            "counts": {
                "modified": len(self.modified),
                "untracked": len(self.untracked),
                "unmerged": len(self.unmerged),
            },
            "modified": [*self.modified[:_SUMMARY_LIMIT]],
            "untracked": [*self.untracked[:_SUMMARY_LIMIT]],
            "unmerged": [*self.unmerged[:_SUMMARY_LIMIT]],
        }


def parse_status(out: str) -> WorktreeStatus:
    """Parse the NUL-separated output of ``git`` + :data:`STATUS_ARGS`.

    Entries (git-status(1), "Porcelain Format Version 2"): ``# branch.oid <sha>``,
    ``# branch.head <name>``, ``1 <XY> …7 fields… <path>`` (changed), ``2 …8 fields…
    <path>`` followed by its source path (renamed or copied), ``u …9 fields… <path>``
    (unmerged), ``? <path>`` (untracked). Paths may hold spaces, never NUL.
    """
    modified: list[str] = []
    untracked: list[str] = []
    unmerged: list[str] = []
    head, branch = "", "HEAD"
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        kind = entry[:2]
        if entry.startswith("# branch.oid "):
            oid = entry.removeprefix("# branch.oid ")
            head = "" if oid == "(initial)" else oid
        elif entry.startswith("# branch.head "):
            name = entry.removeprefix("# branch.head ")
            branch = "HEAD" if name == "(detached)" else name
        elif kind == "1 ":
            modified.append(entry.split(" ", 8)[-1])
        elif kind == "2 ":
            modified.append(entry.split(" ", 9)[-1])
            i += 1  # the rename's or copy's source path comes next
        elif kind == "u ":
            unmerged.append(entry.split(" ", 10)[-1])
        elif kind == "? ":
            untracked.append(entry[2:])
    clean = not (modified or untracked or unmerged)
    return WorktreeStatus(clean, modified, untracked, unmerged, head, branch)
