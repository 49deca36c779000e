"""Webhook payloads with the JSON shapes of Gitea's modules/structs/hook.go."""

from __future__ import annotations

from .convert import JSON, Converter
from .gitrepo import ZERO_SHA, CommitInfo
from .state import Issue, Release, Repo, User


class Payloads:
    """Builds each payload as Gitea's services/webhook/notifier.go fills it in."""

    def __init__(self, convert: Converter) -> None:
        self.convert = convert

    def _repo_and_sender(self, repo: Repo, sender: User) -> JSON:
        # notifier.go: Repository: convert.ToRepo(ctx, repo, permission-of-doer),
        # Sender: convert.ToUser(ctx, doer, nil)
        return {"repository": self.convert.repo(repo, sender), "sender": self.convert.user(sender)}

    def issue_comment_payload(
        self,
        action: str,
        issue: Issue,
        comment: JSON,
        sender: User,
        changes_from: str | None = None,
    ) -> JSON:
        """IssueCommentPayload {action, issue, comment, changes?, repository, sender, is_pull}."""
        payload: JSON = {"action": action, "issue": self.convert.issue(issue), "comment": comment}
        if changes_from is not None:  # `changes,omitempty`
            payload["changes"] = {"body": {"from": changes_from}}
        payload.update(self._repo_and_sender(self.convert.state.repos[issue.repo_id], sender))
        payload["is_pull"] = issue.is_pull
        return payload

    def issue_payload(
        self,
        action: str,
        issue: Issue,
        sender: User,
        changes: JSON | None = None,
        commit_id: str = "",
    ) -> JSON:
        """IssuePayload {action, number, changes?, issue, repository, sender, commit_id}."""
        payload: JSON = {"action": action, "number": issue.index}
        if changes is not None:
            payload["changes"] = changes
        payload["issue"] = self.convert.issue(issue)
        payload.update(self._repo_and_sender(self.convert.state.repos[issue.repo_id], sender))
        payload["commit_id"] = commit_id
        return payload

    def pull_payload(
        self,
        action: str,
        issue: Issue,
        sender: User,
        changes: JSON | None = None,
        commit_id: str = "",
    ) -> JSON:
        """PullRequestPayload {action, number, changes?, pull_request, requested_reviewer,
        repository, sender, commit_id, review}; the PR is converted with doer nil."""
        payload: JSON = {"action": action, "number": issue.index}
        if changes is not None:
            payload["changes"] = changes
        payload["pull_request"] = self.convert.pull(issue, None)
        payload["requested_reviewer"] = None
        payload.update(self._repo_and_sender(self.convert.state.repos[issue.repo_id], sender))
        payload.update({"commit_id": commit_id, "review": None})
        return payload

    def release_payload(self, action: str, release: Release, sender: User) -> JSON:
        """ReleasePayload {action, release, repository, sender}."""
        payload: JSON = {"action": action, "release": self.convert.release(release)}
        payload.update(self._repo_and_sender(self.convert.state.repos[release.repo_id], sender))
        return payload

    def payload_commit(self, repo: Repo, commit: CommitInfo) -> JSON:
        def person(name: str, email: str) -> JSON:
            match = [
                u for u in self.convert.state.users.values() if u.email.lower() == email.lower()
            ]
            return {"name": name, "email": email, "username": match[0].login if match else ""}

        return {
            "id": commit.sha,
            "message": commit.message,
            "url": f"{self.convert.repo_url(repo)}/commit/{commit.sha}",
            "author": person(commit.author.name, commit.author.email),
            "committer": person(commit.committer.name, commit.committer.email),
            "verification": None,
            "timestamp": commit.timestamp,
            "added": commit.added,
            "removed": commit.removed,
            "modified": commit.modified,
        }

    def push_payload(
        self,
        repo: Repo,
        ref: str,
        before: str,
        after: str,
        commits: list[CommitInfo],
        pusher: User,
    ) -> JSON:
        """PushPayload {ref, before, after, compare_url, commits, total_commits, head_commit,
        repository, pusher, sender}."""
        converted = [self.payload_commit(repo, c) for c in commits]
        compare = ""
        if before != ZERO_SHA and after != ZERO_SHA:
            compare = f"{self.convert.repo_url(repo)}/compare/{before}...{after}"
        return {
            "ref": ref,
            "before": before,
            "after": after,
            "compare_url": compare,
            "commits": converted,
            "total_commits": len(converted),
            "head_commit": converted[0] if converted else None,
            "repository": self.convert.repo(repo, pusher),
            "pusher": self.convert.user(pusher),
            "sender": self.convert.user(pusher),
        }

    def create_payload(self, repo: Repo, ref: str, ref_type: str, sha: str, sender: User) -> JSON:
        """CreatePayload {sha, ref, ref_type, repository, sender}."""
        return {"sha": sha, "ref": ref, "ref_type": ref_type, **self._repo_and_sender(repo, sender)}

    def delete_payload(self, repo: Repo, ref: str, ref_type: str, sender: User) -> JSON:
        """DeletePayload {ref, ref_type, pusher_type, repository, sender}."""
        base: JSON = {"ref": ref, "ref_type": ref_type, "pusher_type": "user"}
        return {**base, **self._repo_and_sender(repo, sender)}
