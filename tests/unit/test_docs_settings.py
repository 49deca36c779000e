"""docs/configuration.md against the settings the code reads (the project's rule: a claim
in the docs is a promise). Every field of ``Settings`` is a row of its tables with the
default the code has; every ``FORGEFLOW_*`` name in README.md and docs/ is a setting, or
one of the few variables listed below that are something else."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

import pytest
from pydantic.fields import FieldInfo

from forgeflow.config import ENV_PREFIX, Settings
from tests.support import docs

NAME = re.compile(r"FORGEFLOW_[A-Z0-9_]*[A-Z0-9]")

# Variables named in the docs or read in src/ that are not settings, each with where it
# is read, so that the list cannot outlive its reason.
NOT_SETTINGS = {
    # Set by forgeflow inside a repository's jail: where its setup leaves its results.
    "FORGEFLOW_ENV_DIR": "src/forgeflow/agent/jail.py",
    # Set by forgeflow for its own GIT_ASKPASS helper; never read from the operator.
    "FORGEFLOW_GIT_USERNAME": "src/forgeflow/workspace/git.py",
    "FORGEFLOW_GIT_PASSWORD": "src/forgeflow/workspace/git.py",
    "FORGEFLOW_GIT_ALLOWED": "src/forgeflow/workspace/git.py",
    # The test kit's and the benchmarks' own knobs (docs/CHAOS.md, docs/BENCHMARKS.md).
    "FORGEFLOW_TEST_TURN_SECONDS": "testkit/src/forgeflow_testkit/runtimes.py",
    "FORGEFLOW_CHAOS_SEED": "tests/chaos/test_chaos.py",
    "FORGEFLOW_BENCH_DBOS_PYTHON": "bench/latency.py",
}

# Defaults the code computes, which the docs describe in words.
COMPUTED = {"data_dir", "max_preparations"}


def _env_names() -> dict[str, str]:
    return {ENV_PREFIX + name.upper(): name for name in Settings.model_fields}


def _documented_defaults(text: str) -> dict[str, str]:
    """Each variable of a table in ``text`` with its row's last cell (its default)."""
    found: dict[str, str] = {}
    for cells in docs.table_rows(text):
        for name in re.findall(r"`(FORGEFLOW_[A-Z0-9_]+)`", cells[0]):
            found[name] = cells[-1]
    return found


def _literal(value: object) -> str | None:
    """How the docs write a default: ``1800`` for 1800.0, ``false`` for False."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _check_default(name: str, field: FieldInfo, cell: str) -> str | None:
    """What is wrong with the documented default ``cell`` of setting ``name``, if anything."""
    if name in COMPUTED:
        return None
    if name == "review_skip":
        missing = [g for g in str(field.default).split(",") if f"`{g}`" not in cell]
        return f"globs missing {missing}" if missing else None
    if field.default is None or field.default_factory is not None or field.default == "":
        # No default value: the docs must not name one in code.
        return None if not re.search(r"`\d", cell) else f"names a default: {cell!r}"
    literal = _literal(field.default)
    if literal is not None and f"`{literal}`" not in cell:
        return f"default {literal!r} is not in {cell!r}"
    return None


def test_every_setting_is_documented_with_its_default() -> None:
    rows = _documented_defaults(docs.read("docs/configuration.md"))
    wrong = []
    for env, name in _env_names().items():
        if env not in rows:
            wrong.append(f"{env}: not in docs/configuration.md's tables")
        elif problem := _check_default(name, Settings.model_fields[name], rows[env]):
            wrong.append(f"{env}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_table_agrees_with_the_code() -> None:
    rows = _documented_defaults(docs.read("README.md"))
    names = _env_names()
    assert rows, "README.md has no table of settings"
    wrong = []
    for env, cell in rows.items():
        if env not in names:
            wrong.append(f"{env}: not a setting")
        elif problem := _check_default(names[env], Settings.model_fields[names[env]], cell):
            wrong.append(f"{env}: {problem}")
    assert not wrong, "\n".join(wrong)


# The deployment files name settings too (deploy/forgeflow.env.example is copied as is).
DEPLOY = sorted((docs.ROOT / "deploy").iterdir())


@pytest.mark.parametrize("path", docs.doc_files() + DEPLOY, ids=lambda p: p.name)
def test_every_variable_the_docs_name_exists(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    unknown = sorted(set(NAME.findall(text)) - set(_env_names()) - set(NOT_SETTINGS))
    assert not unknown, f"{path.name} names variables that are not settings: {unknown}"


def test_src_reads_no_variable_that_is_not_a_setting() -> None:
    """A FORGEFLOW_* name in the source is a setting or a listed exception, so a new
    variable read with os.environ cannot go undocumented."""
    known = set(_env_names()) | set(NOT_SETTINGS)
    found = {}
    for path in sorted((docs.ROOT / "src").rglob("*.py")):
        # "FORGEFLOW_PRICE_*" in prose names a family of settings, not a variable.
        text = re.sub(r"FORGEFLOW_[A-Z_]*_\*", "", path.read_text(encoding="utf-8"))
        for name in set(NAME.findall(text)) - known:
            found[name] = str(path.relative_to(docs.ROOT))
    assert not found, f"undocumented variables: {found}"


def test_the_exceptions_are_still_read_where_they_say() -> None:
    for name, where in NOT_SETTINGS.items():
        assert name in (docs.ROOT / where).read_text(encoding="utf-8"), (name, where)
