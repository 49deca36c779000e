"""Transcript entries in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Connection

from forgeflow.domain.transcript import TURN_LIMIT, Entry, EntryKind
from forgeflow.store import Store, transcripts


def _entry(n: int) -> Entry:
    return Entry(EntryKind.COMMAND, f"echo {n}", f"{n}\n", "completed", 0)


def test_entries_come_back_in_order_once_per_item(store: Store) -> None:
    def write(c: Connection) -> list[bool]:
        return [
            transcripts.record(c, task_id="t1", turn_id="u1", item_id=f"i{n}", entry=_entry(n))
            for n in (1, 2, 1)
        ]

    assert store.db.write_sync(write) == [True, True, False]
    got = store.db.read_sync(lambda c: transcripts.of_task(c, "t1"))
    assert [r.title for r in got] == ["echo 1", "echo 2"]
    later = store.db.read_sync(lambda c: transcripts.of_task(c, "t1", after=got[0].seq))
    assert [r.title for r in later] == ["echo 2"]
    assert store.db.read_sync(lambda c: transcripts.of_task(c, "other")) == []


def test_a_runaway_turn_keeps_its_bound_and_says_so(store: Store) -> None:
    def write(c: Connection) -> None:
        for n in range(TURN_LIMIT + 20):
            transcripts.record(c, task_id="t1", turn_id="u1", item_id=f"i{n}", entry=_entry(n))

    store.db.write_sync(write)
    got = store.db.read_sync(lambda c: transcripts.of_task(c, "t1"))
    assert len(got) == TURN_LIMIT + 1
    assert got[-1].kind == EntryKind.LEFT_OUT and got[-1].truncated
