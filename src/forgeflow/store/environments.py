"""Queries of the environment tables (issue #26): a repository's declared environment,
its setup secrets, the roots built for package lists and its last setup run.

Secret values are read only by :func:`secrets`, for a setup run; every other read
answers their names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, delete, select, update

from forgeflow.domain.environment import (
    BUILDING,
    READY,
    REMOVED,
    Environment,
    RootKey,
    RootState,
    SetupState,
    parse,
    root_key,
)
from forgeflow.domain.json import JsonObject
from forgeflow.store import sql
from forgeflow.store.schema import environment_roots as roots_t
from forgeflow.store.schema import environment_secrets as secrets_t
from forgeflow.store.schema import environment_setups as setups_t
from forgeflow.store.schema import repo_environments as env_t
from forgeflow.store.types import iso, utcnow


def get(conn: Connection, repo_key: str) -> Environment | None:
    row = conn.execute(select(env_t.c.spec).where(env_t.c.repo_key == repo_key)).first()
    if row is None:
        return None
    # Validated when it was set; read again without the path checks of the day.
    return parse(row[0], ())


def put(conn: Connection, repo_key: str, env: Environment) -> None:
    conn.execute(delete(env_t).where(env_t.c.repo_key == repo_key))
    sql.insert_row(conn, env_t, {"repo_key": repo_key, "spec": env.json(), "updated_at": utcnow()})


def all_environments(conn: Connection) -> list[Environment]:
    """Every repository's environment (which roots are still named)."""
    return [parse(spec, ()) for (spec,) in conn.execute(select(env_t.c.spec))]


def any_with_packages(conn: Connection) -> bool:
    """Whether some repository's environment lists packages (then roots are built)."""
    return any(parse(spec, ()).packages for (spec,) in conn.execute(select(env_t.c.spec)))


def secret_names(conn: Connection, repo_key: str) -> list[str]:
    q = select(secrets_t.c.name).where(secrets_t.c.repo_key == repo_key)
    return sorted(str(r[0]) for r in conn.execute(q))


def secrets(conn: Connection, repo_key: str) -> dict[str, str]:
    """The values, for the setup run only."""
    q = select(secrets_t.c.name, secrets_t.c.value).where(secrets_t.c.repo_key == repo_key)
    return {str(r[0]): str(r[1]) for r in conn.execute(q)}


def all_secret_values(conn: Connection) -> list[str]:
    """Every repository's setup secrets, for the redaction set at start-up."""
    return [str(r[0]) for r in conn.execute(select(secrets_t.c.value))]


def set_secrets(conn: Connection, repo_key: str, values: Mapping[str, str | None]) -> None:
    """Set each named secret; ``None`` removes it."""
    for name, value in values.items():
        conn.execute(
            delete(secrets_t).where(secrets_t.c.repo_key == repo_key, secrets_t.c.name == name)
        )
        if value is not None:
            row = {"repo_key": repo_key, "name": name, "value": value, "updated_at": utcnow()}
            sql.insert_row(conn, secrets_t, row)


def _root(row: RowMapping) -> RootState:
    return RootState(
        str(row["root_key"]),
        str(row["suite"]),
        tuple(row["packages"]),
        str(row["state"]),
        row["size_bytes"],
        row["log"],
        iso(row["started_at"]) or "",
        iso(row["finished_at"]),
        iso(row["last_used_at"]),
        iso(row["removed_at"]),
    )


def root(conn: Connection, key: str) -> RootState | None:
    row = conn.execute(select(roots_t).where(roots_t.c.root_key == key)).mappings().first()
    return None if row is None else _root(row)


def root_building(conn: Connection, key: RootKey) -> None:
    """The root's row says building (a build already going on keeps its row)."""
    conn.execute(delete(roots_t).where(roots_t.c.root_key == key.key, roots_t.c.state != BUILDING))
    values: dict[str, Any] = {"root_key": key.key, "suite": key.suite,
                              "packages": list(key.packages), "state": BUILDING,
                              "started_at": utcnow()}  # fmt: skip
    sql.insert_ignore(conn, roots_t, values)


def root_done(conn: Connection, key: str, state: str, log: str, size: int | None) -> None:
    done = {"state": state, "log": log, "size_bytes": size, "finished_at": utcnow()}
    conn.execute(update(roots_t).where(roots_t.c.root_key == key).values(**done))


def root_found(conn: Connection, key: RootKey, size: int | None) -> None:
    """A root found ready in the folder without a row here (built by another forgeflow
    sharing the folder, or before its row was lost): recorded, so it can be removed."""
    now = utcnow()
    conn.execute(delete(roots_t).where(roots_t.c.root_key == key.key, roots_t.c.state != BUILDING))
    values: dict[str, Any] = {"root_key": key.key, "suite": key.suite,
                              "packages": list(key.packages), "state": READY,
                              "size_bytes": size, "log": "found built in the roots folder",
                              "started_at": now, "finished_at": now,
                              "last_used_at": now}  # fmt: skip
    sql.insert_ignore(conn, roots_t, values)


def root_removed(conn: Connection, key: str) -> None:
    done = {"state": REMOVED, "removed_at": utcnow()}
    conn.execute(update(roots_t).where(roots_t.c.root_key == key).values(**done))


def root_used(conn: Connection, key: str) -> None:
    stmt = update(roots_t).where(roots_t.c.root_key == key).values(last_used_at=utcnow())
    conn.execute(stmt)


def all_roots(conn: Connection) -> list[RootState]:
    rows = conn.execute(select(roots_t).order_by(roots_t.c.started_at)).mappings()
    return [_root(r) for r in rows]


def setup(conn: Connection, repo_key: str) -> SetupState | None:
    q = select(setups_t).where(setups_t.c.repo_key == repo_key)
    row = conn.execute(q).mappings().first()
    if row is None:
        return None
    return SetupState(
        str(row["fingerprint"]),
        row["root_key"],
        str(row["state"]),
        row["log"],
        row["task_id"],
        iso(row["started_at"]) or "",
        iso(row["finished_at"]),
    )


def setup_started(
    conn: Connection, repo_key: str, fingerprint: str, root_key: str | None, task_id: str | None
) -> None:
    conn.execute(delete(setups_t).where(setups_t.c.repo_key == repo_key))
    values: dict[str, Any] = {"repo_key": repo_key, "fingerprint": fingerprint,
                              "root_key": root_key, "state": "running", "task_id": task_id,
                              "started_at": utcnow()}  # fmt: skip
    sql.insert_row(conn, setups_t, values)


def setup_done(conn: Connection, repo_key: str, state: str, log: str) -> None:
    done = {"state": state, "log": log, "finished_at": utcnow()}
    conn.execute(update(setups_t).where(setups_t.c.repo_key == repo_key).values(**done))


def view_for(conn: Connection, repo_key: str, suite: str, base: Sequence[str]) -> JsonObject:
    """:func:`view` with the root of the declared list (``suite``: the host's release,
    ``base``: forgeflow's own packages)."""
    env = get(conn, repo_key) or Environment()
    key = root_key(env, suite, base)
    return view(conn, repo_key, key.key if key else None)


def view(conn: Connection, repo_key: str, root_key: str | None) -> JsonObject:
    """What ``GET /repos/{repoKey}/environment`` answers (no secret value)."""
    env = get(conn, repo_key) or Environment()
    built = root(conn, root_key) if root_key else None
    last = setup(conn, repo_key)
    names: Sequence[str] = secret_names(conn, repo_key)
    return {
        "repoKey": repo_key,
        "environment": env.json(),
        "setupSecrets": list(names),
        "root": built.json() if built else None,
        "setup": last.json() if last else None,
    }
