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
