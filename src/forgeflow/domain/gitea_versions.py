"""What a Gitea version renders, from the text ``GET /version`` answers (pure).

Gitea answers ``1.22.6``, ``1.26.0+dev-123-gabcdef`` or ``1.26.0-rc1``; Forgejo answers
its own number with the Gitea release it is compatible with, ``9.0.3+gitea-1.22.0``
(forgejo's "Forgejo Semantic Version"). The Gitea release is what decides.

Suggested changes: a review comment's ```` ```suggestion ```` block is read by Gitea
from 1.26 on (``services/pull/suggestion.go`` ParseSuggestionBlocks, the pull request
review's "apply suggestion", added in 2026 after the 1.25 release branch; issue
go-gitea/gitea#14765). An older Gitea, and any Forgejo (compatible with Gitea 1.22 or
earlier), shows it as a code block labelled ``suggestion``, which reads as noise: the
review then says "Suggested replacement:" above a plain code block.
"""

from __future__ import annotations

import re

SUGGESTIONS_SINCE = (1, 26)

_GITEA_OF_FORGEJO = re.compile(r"\+gitea-(\d+)\.(\d+)")
_LEADING = re.compile(r"^v?(\d+)\.(\d+)")


def gitea_release(version: str) -> tuple[int, int] | None:
    """The Gitea (major, minor) a version text names, or None when it names none."""
    text = version.strip()
    found = _GITEA_OF_FORGEJO.search(text) or _LEADING.match(text)
    if found is None:
        return None
    return int(found[1]), int(found[2])


def renders_suggestions(version: str | None) -> bool:
    """Whether this Gitea turns a ```` ```suggestion ```` block into a suggested change;
    an unknown version does not (a plain code block reads right everywhere)."""
    release = gitea_release(version) if version else None
    return release is not None and release >= SUGGESTIONS_SINCE
