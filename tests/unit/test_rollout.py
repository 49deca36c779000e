"""The bounds and checks of a thread's rollout read out of a jail (domain/rollout.py)."""

from __future__ import annotations

import json

from forgeflow.domain import rollout

TID = "01a23742-31f9-7ab0-a898-2216f7c96520"
NAME = f"2026/12/02/rollout-2026-12-02T14-56-54-{TID}.jsonl"


def _out(body: bytes, name: str = NAME) -> bytes:
    return f"ff:rollout {name}\n".encode() + body


def _mask(text: str) -> str:
    return text.replace("s3cret-token", "***")


def line(**payload: object) -> bytes:
    return (json.dumps({"type": "response_item", "payload": payload}) + "\n").encode()


def test_a_rollout_is_kept_redacted_line_by_line() -> None:
    got = rollout.parse(TID, _out(line(text="hi") + line(text="s3cret-token")), False, _mask)
    assert isinstance(got, rollout.Rollout)
    assert got.name == NAME and got.lines == 2
    assert "s3cret-token" not in got.body and '"***"' in got.body
    assert rollout.check(got) == got


def test_what_is_not_a_rollout_is_not_kept() -> None:
    def reason(stdout: bytes, truncated: bool = False) -> str:
        got = rollout.parse(TID, stdout, truncated, _mask)
        assert isinstance(got, rollout.NotKept)
        return got.reason

    assert reason(b"ff:absent\n") == rollout.ABSENT
    assert reason(b"ff:many\n") == rollout.CORRUPT
    assert reason(_out(line(a=1)), truncated=True) == rollout.TOO_BIG
    assert reason(_out(b"not json\n")) == rollout.CORRUPT
    assert reason(_out(b"[1, 2]\n")) == rollout.CORRUPT  # not an object with a type
    assert reason(_out(b"\xff\xfe\n")) == rollout.CORRUPT
    assert reason(_out(b"")) == rollout.CORRUPT
    assert reason(_out(b"{}\n" * (rollout.LINE_LIMIT + 1))) == rollout.TOO_BIG
    # A name that is not Codex's for this thread: never used as a path.
    for name in ("../../x.jsonl", f"/etc/{NAME}", NAME.replace(TID[:8], "ffffffff")):
        assert reason(_out(line(a=1), name)) == rollout.CORRUPT


def test_a_kept_row_is_checked_again_before_a_restore() -> None:
    bad = rollout.Rollout(TID, NAME, '{"type": "x"}\nnot json\n', 2)
    assert isinstance(rollout.check(bad), rollout.NotKept)
    forged = rollout.Rollout(TID, "../escape.jsonl", '{"type": "x"}\n', 1)
    assert isinstance(rollout.check(forged), rollout.NotKept)


def test_a_line_nested_past_the_decoders_depth_is_corrupt_not_an_exception() -> None:
    deep = b'{"type":"event_msg","payload":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    got = rollout.parse(TID, _out(line(text="hi") + deep), False, _mask)
    assert isinstance(got, rollout.NotKept) and got.reason == rollout.CORRUPT
    kept = rollout.Rollout(TID, NAME, deep.decode(), 1)  # a row written by anything else
    again = rollout.check(kept)
    assert isinstance(again, rollout.NotKept) and again.reason == rollout.CORRUPT
