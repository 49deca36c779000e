"""A re-review with the real codex binary and the Gitea emulator: the bot reviews a pull
request, the author pushes a commit, a review request asks again, and the second turn's
prompt (as the scripted model received it) carries the first review's findings with
their locations and only the diff since the first review's head; the second review is
posted once, at the new head. The task page shows a review as posted (its line
comments with their locations, the ones moved into the summary apart) and the session
page lists the pull request's reviews."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from forgeflow.domain.markers import parse_marker
from forgeflow_testkit.model_server import RecordedRequest
from tests.acceptance.test_reviews import HEAD, _bot_reviews, _pull, _task_of, reviewing_agent
from tests.support.agentic import Agentic
from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.world import BOT

NEXT = HEAD.replace("line 20\n", "line twenty\n")


def _review_posts(agentic: Agentic) -> int:
    return sum(1 for m, p, _s in agentic.gitea.requests if m == "POST" and p.endswith("/reviews"))


def test_a_second_review_carries_the_earlier_findings_and_only_the_diff_since(
    agentic: Agentic,
) -> None:
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    seen: list[RecordedRequest] = []
    reviewing_agent(model, seen)
    first = agentic.finished(agentic.mention("@ccweb-bot review", index=pull))
    assert first["task"]["state"] == "succeeded", first["task"]
    old = gitea.pull("acme", "widget", pull)["head"]["sha"]
    new = gitea.push_branch("acme", "widget", "feature", {"app.txt": NEXT}, pusher="alice")
    task = _task_of(gitea.request_review("acme", "widget", pull, reviewer=BOT, by="alice"))
    second = agentic.finished(task)
    assert second["task"]["state"] == "succeeded", second["task"]
    assert len(seen) == 2
    before, after = seen[0].texts("user")[-1], seen[1].texts("user")[-1]
    assert "+line three" in before and "earlier review" not in before
    # The earlier findings, with their locations (the one moved into the summary too).
    assert "UNTRUSTED earlier review" in after
    assert "- `app.txt:3 (new)`: A digit?" in after
    assert "- `app.txt:31 (new)`: Why a b?" in after
    assert "- `app.txt:15 (new)`: Far from any hunk." in after
    assert "which of the earlier review's findings" in after
    # Only the diff since the first review's head.
    assert f"git diff {old} {new}" in after
    assert "+line twenty" in after and "+line three" not in after and "+line 30b" not in after
    # The second review, once, at the new head, marked as the second task's.
    reviews = _bot_reviews(gitea, pull)
    assert len(reviews) == 2 and _review_posts(agentic) == 2
    assert reviews[-1]["commit_id"] == new
    marker = parse_marker(reviews[-1]["body"])
    assert marker is not None and marker.task_id == task


@contextmanager
def _signed_in(agentic: Agentic) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=agentic.ff.url, timeout=30) as client:
        form = client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        r = client.post(
            "/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN, "operator": "ops"}
        )
        assert r.status_code == 303, r.text
        yield client


def _section(html: str, element_id: str) -> str:
    """The element with ``id`` up to its closing tag (the page's lists do not nest)."""
    start = html.index(f'id="{element_id}"')
    tag = html[html.rindex("<", 0, start) + 1 : start].split()[0]
    return html[start : html.index(f"</{tag}>", start)]


def test_the_task_page_shows_the_review_as_posted_and_the_session_page_lists_it(
    agentic: Agentic,
) -> None:
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    reviewing_agent(model, [])
    task = agentic.mention("@ccweb-bot review", index=pull)
    detail = agentic.finished(task)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    (review,) = _bot_reviews(gitea, pull)
    with _signed_in(agentic) as client:
        page = client.get(f"/ui/tasks/{task}")
        assert page.status_code == 200
        card = _section(page.text, "task-review")
        assert f"#{review['id']}" in card and f"/pulls/{pull}/files" in card
        assert "3 line comments, 1 moved into the summary" in card
        assert "Two small things." in _section(page.text, "review-summary")
        inline = _section(page.text, "review-inline")
        locations = re.findall(r"<code>([^<]+)</code>", inline)
        assert locations == ["app.txt:3 (new)", "app.txt:3 (old)", "app.txt:31 (new)"]
        # The emulator reports Gitea 1.22: a suggestion is a plain block (gitea_versions.py).
        assert "A digit?" in inline and "Suggested replacement:\n\n```\nline 3\n```" in inline
        moved = _section(page.text, "review-moved")
        assert re.findall(r"<code>([^<]+)</code>", moved) == ["app.txt:15 (new)"]
        assert "Far from any hunk." in moved and "Far from any hunk." not in inline
        session = client.get(f"/ui/sessions/{detail['task']['sessionKey']}")
        assert session.status_code == 200
        listed = _section(session.text, "session-reviews")
        assert task in listed and f"#{review['id']}" in listed
        assert f"<code>{review['commit_id'][:12]}</code>" in listed
        assert '<td class="num">3</td><td class="num">1</td>' in listed
