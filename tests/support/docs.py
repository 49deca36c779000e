"""Reading the project's documentation for the tests that hold it to the code: a claim in
README.md or docs/ is a promise, so these helpers find what the docs name (settings,
routes, commands) without importing anything of forgeflow."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def read(name: str) -> str:
    """A documentation file by its path from the repository's root."""
    return (ROOT / name).read_text(encoding="utf-8")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` (header and rule rows too)."""
    rows = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            # An escaped pipe (\|) stays inside its cell.
            cells = re.split(r"(?<!\\)\|", stripped[1:-1])
            rows.append([cell.strip() for cell in cells])
    return rows


def code_spans(text: str) -> list[str]:
    """The text of every inline code span (single backticks) in ``text``."""
    return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


_METHOD = r"(?:GET|POST|PUT|PATCH|DELETE)"
_METHOD_SPAN = re.compile(rf"^({_METHOD}(?:/{_METHOD})*)\s+(\S+)")
_BARE = re.compile(r"^…?/[A-Za-z{<]\S*$")  # a path after a span with a method
_PAGE = re.compile(r"^…?/ui(/\S*)?$|^/$")  # a page of docs/ui.md
# Paths that are forgeflow's own from their first segment; any other "/x" in a section
# whose heading names a base (``/api/gitea-workflow/...``) is relative to that base.
ROOTS = ("/api", "/webhooks", "/healthz", "/readyz", "/metrics", "/openapi.json", "/ui")


def _rooted(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in ROOTS)


def _chunks(text: str) -> list[str]:
    """Table rows and paragraphs: a code span never crosses one, a method carries over
    to the bare paths after it within one (``POST /tasks/{id}/cancel``, ``/abort``)."""
    chunks: list[str] = []
    # A list item is a chunk of its own, like a paragraph.
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*] |\s*\d+\. )", text):
        lines = block.splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            chunks.extend(lines)
        else:
            chunks.append(" ".join(line.strip() for line in lines))
    return chunks


def _expand(path: str) -> list[str]:
    """``/a/enable|disable`` is two paths; a query and a trailing slash are dropped,
    ``<id>`` is written ``{id}``."""
    path = path.split("?", 1)[0].replace("\\|", "|")
    path = re.sub(r"<([^>]+)>", r"{\1}", path)
    paths = [""]
    for segment in path.strip("/").split("/"):
        paths = [f"{p}/{alt}" for p in paths for alt in segment.split("|")]
    return [p if p else "/" for p in paths]


def _splice(anchor: str, history: list[str], rest: str) -> str:
    """``…/runs/{runId}/cancel`` after ``/api/pipelines/runs/{runId}``: the rest replaces
    the anchor from its first segment on (the newest earlier path holding that segment);
    a single segment (``/enable`` after ``…/disable``) is the anchor's sibling."""
    parts = rest.strip("/").split("/")
    if len(parts) > 1:
        for earlier in [anchor, *reversed(history)]:
            segments = earlier.strip("/").split("/")
            if parts[0] in segments:
                keep = len(segments) - 1 - segments[::-1].index(parts[0])
                return "/" + "/".join(segments[:keep] + parts)
    return anchor.rsplit("/", 1)[0] + "/" + "/".join(parts)


def route_mentions(text: str, *, pages: bool = False) -> set[tuple[str, str]]:
    """Every (method, path) ``text`` names in code spans: ``GET /healthz``, ``GET/PUT
    /api/x``, ``…/x`` continuing the path before it, bare ``/x`` after a span with a
    method. With ``pages``, a bare ``/ui/...`` path is a page: ``GET``."""
    return {(method, path) for method, path, _query in _route_spans(text, pages)}


def route_queries(text: str) -> dict[tuple[str, str], set[str]]:
    """The query parameters ``text`` gives a route (``GET /tasks?state=&limit=``)."""
    found: dict[tuple[str, str], set[str]] = {}
    for method, path, query in _route_spans(text, False):
        if query:
            found.setdefault((method, path), set()).update(query)
    return found


def _route_spans(text: str, pages: bool) -> list[tuple[str, str, frozenset[str]]]:
    found: list[tuple[str, str, frozenset[str]]] = []
    history: list[str] = []
    base: str | None = None
    for chunk in _chunks(text):
        if chunk.startswith("#"):
            named = re.search(r"`(/api/[a-z-]+)/\.\.\.`", chunk)
            base = named.group(1) if named else None
        methods: list[str] = []
        anchor: str | None = None
        for span in re.findall(r"`([^`]+)`", chunk):
            span = span.strip()
            match = _METHOD_SPAN.match(span)
            if match:
                methods, raw = match.group(1).split("/"), match.group(2)
            elif (methods and _BARE.match(span)) or (pages and _PAGE.match(span)):
                raw = span
            else:
                continue
            query = frozenset(re.findall(r"[?&]([A-Za-z]+)=", raw))
            span_methods = methods or ["GET"]  # a bare page of docs/ui.md
            for path in _resolve(raw, bool(match), base, anchor, history):
                found.extend((m, path, query) for m in span_methods)
                history.append(path)
                if match:
                    anchor = path
    return found


def _resolve(
    raw: str, has_method: bool, base: str | None, anchor: str | None, history: list[str]
) -> list[str]:
    """The full paths a mention stands for."""
    if raw.startswith("…/"):
        rest = raw[1:]
        if _rooted(rest):
            return _expand(rest)
        previous = history[-1] if history else ""
        return [_splice(previous, history, p) for p in _expand(rest)]
    if _rooted(raw) or raw == "/":
        return _expand(raw)
    if has_method and base is not None:
        return _expand(base + raw)
    if anchor is not None:
        return [_splice(anchor, [], p) for p in _expand(raw)]
    return _expand(raw)


def code_texts(text: str) -> list[str]:
    """Every inline code span and every line of a fenced block, backticks removed."""
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            found.append(line.replace("`", ""))
    # Spans may wrap a line; a fenced block's lines hold no spans of their own.
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for paragraph in re.split(r"\n\s*\n", prose):
        spans = re.finditer(r"(`+)((?:(?!\1).)+?)\1", paragraph, re.DOTALL)
        found.extend(m.group(2).strip().replace("\n", " ") for m in spans)
    return found


def command_lines(text: str) -> list[list[str]]:
    """The words after ``forgeflow`` in each command line the docs write
    (``forgeflow gitea connect acme --dry-run``, ``.venv/bin/forgeflow doctor``), up to a
    shell comment or the next command; ``a | b`` alternatives are kept as ``|``."""
    found = []
    for code in code_texts(text):
        # The program, not a folder or a user named forgeflow (``sudo -u forgeflow …``).
        for match in re.finditer(r"(?:^|(?<=\s)|(?<=bin/))forgeflow ((?:[^\s#;&]+ ?)+)", code):
            words = match.group(1).split()
            if re.fullmatch(r"[a-z][a-z-]*", words[0]):
                found.append(words)
    return found
