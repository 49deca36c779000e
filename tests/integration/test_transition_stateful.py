"""Hypothesis stateful test of the one transition function, on a real database."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from forgeflow.domain.states import (
    TERMINAL_STATES,
    IllegalTransition,
    TaskState,
    allowed_next,
    is_allowed,
)
from forgeflow.store import Store, audit, tasks
from forgeflow.store.tasks import StaleStateVersion, Transition

TASK = "gitea-task-stateful"


class TransitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        self.store = Store(f"sqlite:///{Path(self._dir.name) / 'db.sqlite'}")
        self.store.migrate()
        self.store.db.write_sync(
            lambda c: tasks.insert_received(
                c,
                {
                    "task_id": TASK,
                    "delivery_key": "default:d1",
                    "repo_key": "default:a/b",
                    "resource_key": "default:a/b:issue:1",
                    "session_key": "default:a/b:issue:1",
                    "comment_id": 1,
                    "author": "alice",
                    "instruction": "x",
                },
            )
        )
        self.state = TaskState.RECEIVED
        self.version = 1
        self.history: list[TaskState] = [self.state]

    def teardown(self) -> None:
        self.store.close()
        self._dir.cleanup()

    @rule(data=st.data(), stale=st.integers(min_value=0, max_value=3))
    def move(self, data: st.DataObject, stale: int) -> None:
        legal = sorted(allowed_next(self.state))
        # Mostly legal moves so runs go deep, and any state at all to probe refusals.
        anything = st.sampled_from(list(TaskState))
        target = data.draw(
            st.one_of(st.sampled_from(legal), st.sampled_from(legal), anything)
            if legal
            else anything
        )
        expected = self.version - stale
        try:
            self.store.db.write_sync(
                lambda c: tasks.transition(
                    c, Transition(TASK, target, expected_version=expected, action="test")
                )
            )
        except IllegalTransition:
            assert not is_allowed(self.state.value, target.value)
            return
        except StaleStateVersion:
            assert stale > 0
            return
        # A move that succeeded must be legal and must have used the current version.
        assert is_allowed(self.state.value, target.value), (self.state, target)
        assert stale == 0
        assert self.state not in TERMINAL_STATES
        self.state = target
        self.version += 1
        self.history.append(target)

    @invariant()
    def database_agrees(self) -> None:
        row = self.store.db.read_sync(lambda c: tasks.get(c, TASK))
        assert row is not None
        assert row.state == self.state.value
        assert row.state_version == self.version

    @invariant()
    def audit_tells_the_whole_story(self) -> None:
        events = self.store.db.read_sync(
            lambda c: audit.query(c, audit.AuditQuery(task_id=TASK, action="test", limit=10_000))
        )
        moves = [e.to_state for e in events]
        assert moves == [s.value for s in self.history[1:]]
        assert [e.state_version for e in events] == list(range(2, self.version + 1))


TransitionMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None
)
TestTransitions = TransitionMachine.TestCase
