"""Which attachments reach the model as images, and what an image is (#25 item 5)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

from forgeflow.agent.codexconfig import CodexConfig, turn_params
from forgeflow.agent.provider import load_provider
from forgeflow.domain import images

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 20
U1, U2, U3, U4 = (f"{n:08x}-0000-4000-8000-000000000000" for n in range(1, 5))


def _l(uuid: str, name: str = "a.png", size: int = 10, where: str = "issue") -> images.Listed:
    return images.Listed(uuid, name, size, where)


def test_the_mention_first_then_the_issue_then_the_newest_comments() -> None:
    take, skipped = images.chosen(
        [_l(U1, where="mention")],
        [_l(U2)],
        [[_l(U3, where="comment")], [_l(U4, where="comment")]],
        images.Bounds(count=3, each=100, total=1000),
    )
    assert [t.uuid for t in take] == [U1, U2, U4]
    assert [(s.uuid, why) for s, why in skipped] == [(U3, "more than 3 images")]


def test_bounds_and_names() -> None:
    take, skipped = images.chosen(
        [],
        [_l(U1, size=101), _l(U2, name="log.txt"), _l("../../etc", name="x.png"), _l(U3)],
        [[_l(U3)], [_l(U4, size=95)]],  # the same attachment twice is taken once
        images.Bounds(count=5, each=100, total=100),
    )
    assert [t.uuid for t in take] == [U3]
    assert [why for _, why in skipped] == [
        "larger than 100 bytes",
        "not a Gitea attachment id",
        "more than 100 bytes of images",
    ]


def test_a_thread_that_saw_the_conversation_gets_only_what_is_new() -> None:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    before, after = at - timedelta(minutes=1), at + timedelta(minutes=1)
    take, _ = images.chosen(
        [images.Listed(U1, "m.png", 1, "mention", before)],
        [images.Listed(U2, "old.png", 1, "issue", before)],
        [[images.Listed(U3, "new.png", 1, "comment", after)]],
        images.Bounds(count=5, each=100, total=100),
        seen_at=at,
    )
    assert [t.uuid for t in take] == [U1, U3]


def test_an_image_is_known_by_its_first_bytes() -> None:
    assert images.image_type(PNG) == "image/png"
    assert images.image_type(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert images.image_type(b"GIF89a...") == "image/gif"
    assert images.image_type(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert images.image_type(b"<svg xmlns=...>") is None
    assert images.image_type(b"%PDF-1.7") is None
    url = images.data_url("image/png", PNG)
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()


def test_turn_params_carry_the_model_and_the_images(tmp_path: Path) -> None:
    cfg = CodexConfig(
        argv=["codex"],
        mcp_argv=[],
        gitea_url="http://gitea",
        gitea_token="t",
        data_dir=tmp_path,
        workspace_root=tmp_path,
        provider=load_provider(base_url="http://model", api_key="k", codex_home=None),
        model="default-model",
    )
    policy = {"type": "externalSandbox"}
    params = turn_params(cfg, "th", "hi", policy, True, model="other", images=("data:x",))
    assert params["model"] == "other"
    assert params["collaborationMode"]["settings"]["model"] == "other"
    assert params["input"][1] == {"type": "image", "url": "data:x"}
    # Without a task's own model, the operator's is sent again (the override is sticky).
    plain = turn_params(cfg, "th", "hi", policy, False)
    assert plain["model"] == "default-model" and len(plain["input"]) == 1
