"""The HTTP docs against the app's routes: every route of ``create_app`` is named with
its method in docs/api.md, docs/pipelines.md (its "HTTP and command line"), README.md,
or, under ``/ui``, docs/ui.md; and every route those pages name exists with that method.
The routes are walked with ``fastapi.routing.iter_route_contexts``, the walk FastAPI
offers for the routers ``include_router`` keeps as a tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from forgeflow.api import create_app
from forgeflow.config import Settings, load_settings
from forgeflow.services import build_services
from tests.support import docs

# Which pages describe forgeflow's own routes, and whether a bare /ui path is a page.
PAGES = {"docs/api.md": False, "docs/pipelines.md": False, "README.md": False, "docs/ui.md": True}
# docs/ui.md names Gitea's API too (what Sign in with Gitea asks it): not forgeflow's.
GITEA_API = "/api/v1/"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    data = tmp_path_factory.mktemp("data")
    settings = load_settings(data_dir=data, admin_token="t" * 32)
    return create_app(build_services(settings, migrate=False), lifecycle=False)


@pytest.fixture(scope="module")
def routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route, HEAD aside (Starlette adds it to every GET)."""
    found = set()
    for route in iter_route_contexts(app.routes):
        assert route.path is not None
        for method in (route.methods or set()) - {"HEAD"}:
            found.add((method, route.path))
    assert ("POST", "/api/gitea/webhook") in found, found  # the walk saw the routers
    return found


def _shape(path: str) -> str:
    """A path with its parameters unnamed: ``/tasks/{taskId}`` and ``/tasks/{task_id}``
    are the same route; a trailing slash does not count."""
    return re.sub(r"\{[^}]+\}", "{}", path).rstrip("/") or "/"


def _pattern(path: str) -> re.Pattern[str]:
    """What a route's path matches, as Starlette routes it (``{key:path}`` spans
    slashes), so a documented example such as ``/repos/default:acme/widget/disable``
    is found."""
    out = ""
    for piece in re.split(r"(\{[^}]+\})", path.rstrip("/") or "/"):
        if piece.startswith("{"):
            out += ".+" if piece.endswith(":path}") else "[^/]+"
        else:
            out += re.escape(piece)
    return re.compile(out + "/?")


def _mentions() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for name, pages in PAGES.items():
        for method, path in docs.route_mentions(docs.read(name), pages=pages):
            if not path.startswith(GITEA_API):
                found.setdefault((method, path), name)
    return found


def test_every_route_is_documented(routes: set[tuple[str, str]]) -> None:
    documented = {(m, _shape(p)) for m, p in _mentions()}
    missing = sorted(r for r in routes if (r[0], _shape(r[1])) not in documented)
    assert not missing, "routes no doc names:\n" + "\n".join(f"{m} {p}" for m, p in missing)


def test_every_documented_route_exists(routes: set[tuple[str, str]]) -> None:
    patterns = [(m, _pattern(p)) for m, p in routes]
    unknown = [
        f"{where}: {method} {path}"
        for (method, path), where in sorted(_mentions().items())
        if not any(m == method and pat.fullmatch(path) for m, pat in patterns)
    ]
    assert not unknown, "documented routes that do not exist:\n" + "\n".join(unknown)


def test_query_parameters_are_the_routes(app: FastAPI) -> None:
    """Where the docs give a route's query (``GET /tasks?state=&limit=``), they give all of
    its parameters and no other; and every route that takes a query has one in the docs."""
    taken = {
        (method.upper(), _shape(path)): {
            p["name"] for p in op.get("parameters", []) if p["in"] == "query"
        }
        for path, ops in app.openapi()["paths"].items()
        for method, op in ops.items()
    }
    given: dict[tuple[str, str], set[str]] = {}
    for name in PAGES:
        for (method, path), names in docs.route_queries(docs.read(name)).items():
            given.setdefault((method, _shape(path)), set()).update(names)
    wrong = [
        f"{k}: docs {sorted(v)}, code {sorted(taken.get(k, set()))}"
        for k, v in given.items()
        if v != taken.get(k)
    ]
    wrong += [
        f"{k}: its query {sorted(v)} is in no doc" for k, v in taken.items() if v and k not in given
    ]
    assert not wrong, "\n".join(wrong)


def test_every_error_code_a_route_declares_is_documented(app: FastAPI) -> None:
    """The codes /openapi.json gives each answer of each route are in the API's docs (the
    error codes are stable: docs/api.md), and every ``NNN code`` the docs answer with is a
    code the source has."""
    declared = set()
    for ops in app.openapi()["paths"].values():
        for op in ops.values():
            for answer in op.get("responses", {}).values():
                declared.update(re.findall(r"[a-z]+(?:_[a-z]+)+", answer.get("description", "")))
    declared -= set(Settings.model_fields)  # "over api_max_body_bytes" names a setting
    text = "".join(docs.read(n) for n in (*PAGES, "docs/security.md"))
    undocumented = sorted(c for c in declared if f"`{c}`" not in text and f" {c}`" not in text)
    assert not undocumented, f"error codes no doc names: {undocumented}"
    source = "".join(p.read_text(encoding="utf-8") for p in (docs.ROOT / "src").rglob("*.py"))
    answered = set(re.findall(r"`[1-5]\d\d ([a-z]+(?:_[a-z]+)*)`", text))
    unknown = sorted(c for c in answered if f'"{c}"' not in source)
    assert not unknown, f"codes the docs answer with that no source has: {unknown}"


def test_the_reader_follows_the_docs_shorthand() -> None:
    """The shorthand the docs use, read as the full routes (else both tests above would
    pass or fail for the wrong reason)."""
    text = (
        "## Control: `/api/gitea-workflow/...`\n\n"
        "| `POST /tasks/{taskId}/cancel`, `/abort` | x |\n"
        "| `GET /api/pipelines/runs/{runId}`, then |\n"
        "| `POST …/runs/{runId}/steps/{s}/approve|reject` |\n"
    )
    assert docs.route_mentions(text) == {
        ("POST", "/api/gitea-workflow/tasks/{taskId}/cancel"),
        ("POST", "/api/gitea-workflow/tasks/{taskId}/abort"),
        ("GET", "/api/pipelines/runs/{runId}"),
        ("POST", "/api/pipelines/runs/{runId}/steps/{s}/approve"),
        ("POST", "/api/pipelines/runs/{runId}/steps/{s}/reject"),
    }
    assert docs.route_mentions("A page: `/ui/tasks/<taskId>`.", pages=True) == {
        ("GET", "/ui/tasks/{taskId}")
    }


def test_pages_named_are_files() -> None:
    for name in PAGES:
        assert (docs.ROOT / name).is_file(), Path(name)
