"""Which of a conversation's attachments reach the model as images, and what an image
is (pure; the fetching is tasks/images.py's).

Only attachments Gitea lists on the issue and its comments are taken (``assets``: they
belong to that repository by construction); a Markdown link is never followed, so a
link to another repository's attachment or to any other URL reaches nothing. The
mention's own attachments come first, then the issue's, then the newest comments', at
most ``max_count``, each at most ``max_bytes`` as Gitea states its size and again as
read. Whether a file is an image is decided by its first bytes, never by its name or
a content type a server sends.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

# Gitea's attachment UUIDs (models/repo/attachment.go: gouuid.New().String()).
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Names worth downloading to look at: the magic bytes decide, the name only spares
# fetching a PDF or a log to find out.
_IMAGE_NAME_RE = re.compile(r"\.(png|jpe?g|gif|webp)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Listed:
    """One attachment as Gitea lists it, with where it was attached."""

    uuid: str
    name: str
    size: int
    where: str  # "mention", "issue" or "comment"
    created: datetime | None = None


@dataclass(frozen=True, slots=True)
class Bounds:
    """How many images, how large each, and all of them together (bytes)."""

    count: int
    each: int
    total: int


def chosen(
    mention: Sequence[Listed],
    issue: Sequence[Listed],
    comments: Sequence[Sequence[Listed]],
    bounds: Bounds,
    *,
    seen_at: datetime | None = None,
) -> tuple[list[Listed], list[tuple[Listed, str]]]:
    """The attachments to fetch, in order, and the skipped ones with why. ``seen_at``:
    when the session's thread last saw the conversation; what was attached before was
    sent with that turn and is not sent again (the mention's own always is)."""
    ordered = [*mention, *issue]
    for listed in reversed(comments):  # newest comments first
        ordered += listed
    take: list[Listed] = []
    skipped: list[tuple[Listed, str]] = []
    seen: set[str] = set()
    total = 0
    for item in ordered:
        if item.uuid in seen or _sent_before(item, seen_at):
            continue
        seen.add(item.uuid)
        why = _why_not(item, bounds.each)
        if why is None and len(take) >= bounds.count:
            why = f"more than {bounds.count} images"
        if why is None and total + item.size > bounds.total:
            why = f"more than {bounds.total} bytes of images"
        if why is None:
            take.append(item)
            total += item.size
        elif why != "not an image name":
            skipped.append((item, why))
    return take, skipped


def _sent_before(item: Listed, seen_at: datetime | None) -> bool:
    if seen_at is None or item.where == "mention" or item.created is None:
        return False
    return item.created <= seen_at


def _why_not(item: Listed, max_bytes: int) -> str | None:
    if _UUID_RE.fullmatch(item.uuid) is None:
        return "not a Gitea attachment id"
    if _IMAGE_NAME_RE.search(item.name) is None:
        return "not an image name"
    if item.size > max_bytes:
        return f"larger than {max_bytes} bytes"
    return None


def image_type(data: bytes) -> str | None:
    """The image's media type from its magic bytes (PNG, JPEG, GIF, WebP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def data_url(media_type: str, data: bytes) -> str:
    """The image as Codex's ``image`` input item carries it: nothing to fetch."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def shown_name(name: str) -> str:
    """An attachment's name as an audit row keeps it: printable and bounded."""
    flat = "".join(c if c.isprintable() else "?" for c in name)
    return flat[:120]
