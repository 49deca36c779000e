"""Pull request reviews, the pure part: the diff's hunks and which lines a comment may
sit on, the review's text (moved comments, suggestions, the marker), the event the
configuration allows, the bounded diff of the prompt, and ``@bot review`` parsing."""

from __future__ import annotations

import time

from forgeflow.domain import reviews as r
from forgeflow.domain.markers import Marker, MarkerKind, parse_marker
from forgeflow.domain.mentions import find_mention

DIFF = b"""diff --git a/app.py b/app.py
index 1111111..2222222 100644
--- a/app.py
+++ b/app.py
@@ -1,4 +1,5 @@
 import os
-import sys
+import sys  # noqa
+import json
 # blank
 def main():
@@ -20,2 +21,3 @@ def other():
     x = 1
+    y = 2
     return x
diff --git a/new.txt b/new.txt
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+hello
+world
diff --git a/yarn.lock b/yarn.lock
index 4444444..5555555 100644
--- a/yarn.lock
+++ b/yarn.lock
@@ -1 +1 @@
-a
+b
"""

MARKER = Marker("gitea-task-1", "gitea-task-1:1", "default:acme/widget#pr/3", MarkerKind.REVIEW)


def test_the_lines_each_hunk_shows_are_commentable_on_their_side() -> None:
    files = r.parse_diff(DIFF)
    assert list(files) == ["app.py", "new.txt", "yarn.lock"]
    app = files["app.py"]
    # new side: context 1, added 2 and 3, context 4 and 5; then 21..23
    assert app.new_lines == {1, 2, 3, 4, 5, 21, 22, 23}
    # old side: context 1, removed 2, context 3 and 4; then 20 and 21
    assert app.old_lines == {1, 2, 3, 4, 20, 21}
    assert files["new.txt"].new_lines == {1, 2} and files["new.txt"].old_lines == set()


def test_a_comment_outside_the_diff_moves_into_the_summary_with_its_location() -> None:
    draft = r.ReviewDraft(
        "Looks fine.",
        (
            r.LineComment("app.py", "new", 3, "json is unused"),
            r.LineComment("app.py", "old", 2, "why drop this?"),
            r.LineComment("app.py", "new", 10, "far away"),
            r.LineComment("missing.py", "new", 1, "not in the diff"),
        ),
    )
    placed = r.place(draft, r.parse_diff(DIFF))
    assert [c.body for c in placed.inline] == ["json is unused", "why drop this?"]
    assert [c.location for c in placed.moved] == ["app.py:10 (new)", "missing.py:1 (new)"]
    body = r.review_body(draft.summary, placed.moved, MARKER)
    assert body.startswith("Looks fine.")
    assert "- `app.py:10 (new)`: far away" in body
    assert "- `missing.py:1 (new)`: not in the diff" in body
    assert parse_marker(body) == MARKER


def test_a_suggestion_is_rendered_in_giteas_suggestion_block_with_a_longer_fence() -> None:
    c = r.LineComment("app.py", "new", 3, "Use this:", suggestion="x = '```'\n")
    assert r.comment_body(c) == "Use this:\n\n````suggestion\nx = '```'\n````"
    plain = r.LineComment("app.py", "new", 3, "Use this:", suggestion="import json")
    assert r.comment_body(plain).endswith("```suggestion\nimport json\n```")


def test_approve_or_request_changes_only_where_the_configuration_allows() -> None:
    assert r.review_event("APPROVE", frozenset()) == "COMMENT"
    assert r.review_event("REQUEST_CHANGES", frozenset({"APPROVE"})) == "COMMENT"
    assert r.review_event("APPROVE", frozenset({"APPROVE"})) == "APPROVE"
    assert r.review_event("DISMISS", frozenset({"DISMISS"})) == "COMMENT"


def test_the_prompt_diff_is_bounded_and_skips_lock_files() -> None:
    files = r.parse_diff(DIFF)
    small = len(files["app.py"].text)
    bounded = r.bound_diff(files, max_bytes=small)
    assert "import json" in bounded.text and "hello" not in bounded.text
    assert bounded.listed == (("new.txt", len(files["new.txt"].text)),)
    assert [p for p, _ in bounded.skipped] == ["yarn.lock"]
    section = r.prompt_section(bounded)
    assert f"- new.txt ({len(files['new.txt'].text)} bytes of diff)" in section
    assert "- yarn.lock" in section
    everything = r.bound_diff(files, max_bytes=10**6, skip=())
    assert everything.listed == () and everything.skipped == ()


def test_the_parser_has_bounds() -> None:
    many = b"".join(
        b"diff --git a/f%d b/f%d\n@@ -1 +1 @@\n-a\n+b\n" % (i, i) for i in range(r.MAX_FILES + 5)
    )
    assert len(r.parse_diff(many)) == r.MAX_FILES
    assert r.parse_diff(b"@@ -1 +1 @@\n+orphan\n") == {}


def test_review_is_a_command_word_with_free_text_after_it() -> None:
    def focus(text: str) -> str | None:
        m = find_mention(text, "ccweb-bot")
        assert m is not None
        return m.review_focus

    assert focus("@ccweb-bot review") == ""
    assert focus("@ccweb-bot Review: the error paths, please") == "the error paths, please"
    assert focus("@ccweb-bot review\nsecurity") == "security"
    assert focus("@ccweb-bot reviewed it?") is None
    assert focus("@ccweb-bot please review") is None
    assert focus("@ccweb-bot review-bot is broken") is None


def _request_payload(action: str, reviewer: str | None) -> dict[str, object]:
    """The shape of notifier.go PullRequestReviewRequest's PullRequestPayload."""
    user = {"id": 2, "login": "alice"}
    return {
        "action": action,
        "number": 3,
        "pull_request": {
            "id": 9,
            "number": 3,
            "title": "t",
            "html_url": "http://g/acme/widget/pulls/3",
            "head": {"ref": "feature", "sha": "abc", "repo": {"full_name": "acme/widget"}},
            "base": {"ref": "main", "sha": "def"},
        },
        "requested_reviewer": None if reviewer is None else {"id": 1, "login": reviewer},
        "repository": {"owner": {"login": "acme"}, "name": "widget", "default_branch": "main"},
        "sender": user,
        "commit_id": "",
        "review": None,
    }


def test_a_request_for_the_bots_review_is_a_review_task_of_the_sender() -> None:
    from forgeflow.domain.ids import ResourceKind
    from forgeflow.gitea import webhook

    event = webhook.review_request("d1", _request_payload("review_requested", "CCWeb-Bot"), BOT)
    assert event is not None
    assert (event.resource.kind, event.resource.number) == (ResourceKind.PULL_REQUEST, 3)
    assert event.actor_login == "alice" and event.comment_id == 0
    assert event.refs is not None and event.refs.head_sha == "abc"
    for action, reviewer in (("review_requested", "alice"), ("review_request_removed", BOT)):
        assert webhook.review_request("d2", _request_payload(action, reviewer), BOT) is None
    headers = {"x-gitea-event": "pull_request", "x-gitea-event-type": webhook.REVIEW_REQUEST}
    assert webhook.event_type_of(headers) == webhook.REVIEW_REQUEST


BOT = "ccweb-bot"


def test_parse_diff_is_linear_in_a_files_diff() -> None:
    """One file of MAX_DIFF_BYTES of diff (a pull request's generated text): parsed in
    well under a second (appending to bytes was quadratic: about a minute, with the
    event loop held)."""
    line = b"+a line of data that the pull request adds to the repository\n"
    n = r.MAX_DIFF_BYTES // len(line)
    head = b"diff --git a/d.txt b/d.txt\nnew file mode 100644\n--- /dev/null\n+++ b/d.txt\n"
    diff = head + b"@@ -0,0 +1,%d @@\n" % n + line * n
    start = time.perf_counter()
    files = r.parse_diff(diff)
    assert time.perf_counter() - start < 3
    assert files["d.txt"].text == diff[: r.MAX_DIFF_BYTES]
    assert len(files["d.txt"].new_lines) >= n - 1
