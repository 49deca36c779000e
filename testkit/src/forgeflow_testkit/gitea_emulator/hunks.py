"""The diff hunk of a code comment: the hunk of the file's diff (merge base to head)
that shows the line, cut after it to the line and the four before it (Gitea's
``CutDiffAroundLine`` with ``setting.UI.CodeCommentLines`` 4, then ``patch2diff``;
here the hunk's header is kept as it is, not recounted)."""

from __future__ import annotations

import re

from .gitrepo import GitRepo

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_CONTEXT_LINES = 4


def diff_hunk(git: GitRepo, base: str, head: str, path: str, line: int) -> str:
    """The hunk of ``path``'s diff that shows ``line`` (signed), cut after it."""
    if not base or not head or not path or line == 0:
        return ""
    text = git.run("diff", base, head, "--", path, check=False).stdout.decode(errors="replace")
    header, old, new = "", 0, 0
    kept: list[str] = []
    for raw in text.splitlines():
        match = _HUNK.match(raw)
        if match:
            header, kept = raw, []
            old, new = int(match[1]), int(match[2])
            continue
        if not header or raw.startswith("\\"):  # before the first hunk; "\ No newline"
            continue
        kept.append(raw)
        here = (raw[:1] != "+" and -old == line) or (raw[:1] != "-" and new == line)
        if here:
            return "\n".join([header, *kept[-(_CONTEXT_LINES + 1) :]])
        if raw[:1] != "+":
            old += 1
        if raw[:1] != "-":
            new += 1
    return ""
