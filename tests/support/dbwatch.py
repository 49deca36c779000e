"""Read a forgeflow database from the test process while forgeflow runs elsewhere."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import create_engine, select

from forgeflow.domain.states import ACTIVE_STATES, values
from forgeflow.store.schema import tasks


class DbWatch:
    """Samples the active tasks per repository continuously in a thread."""

    def __init__(self, url: str, *, interval: float = 0.005) -> None:
        self.engine = create_engine(url)
        self.interval = interval
        self.samples = 0
        self.max_active = 0
        self.violations: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def tasks(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(select(tasks))]

    def task(self, task_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(tasks).where(tasks.c.task_id == task_id)).first()
            return dict(row._mapping) if row else None

    def _run(self) -> None:
        query = select(tasks.c.repo_key).where(tasks.c.state.in_(values(ACTIVE_STATES)))
        while not self._stop.is_set():
            try:
                with self.engine.connect() as conn:
                    active = Counter(r[0] for r in conn.execute(query))
            except Exception:
                time.sleep(0.01)
                continue
            self.samples += 1
            self.max_active = max(self.max_active, sum(active.values()))
            crowded = {k: n for k, n in active.items() if n > 1}
            if crowded:
                self.violations.append(crowded)
            time.sleep(self.interval)

    def __enter__(self) -> DbWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.engine.dispose()
