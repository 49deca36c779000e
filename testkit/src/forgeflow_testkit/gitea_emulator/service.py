"""State changes with the webhooks Gitea's notifiers send for them.

Every operation changes the state and prepares its hook tasks under the lock, and returns
the tasks; the caller delivers them at once (test helpers) or in the background (API)."""

from __future__ import annotations

from dataclasses import dataclass

from .convert import JSON, Converter
from .delivery import Deliverer, HookTask
from .gitrepo import ZERO_SHA, GitRepo, Signature
from .payloads import Payloads
from .state import Comment, Issue, Label, Pull, Release, Repo, State, User


@dataclass
class Outcome:
    tasks: list[HookTask]


class Service:
    def __init__(self, state: State, convert: Converter, deliverer: Deliverer) -> None:
        self.state = state
        self.convert = convert
        self.payloads = Payloads(convert)
        self.deliverer = deliverer

    def _prepare(
        self, repo: Repo, event_type: str, payload: JSON, branch: str | None = None
    ) -> list[HookTask]:
        return self.deliverer.prepare(repo, event_type, payload, branch)

    def _issue_event(
        self,
        issue: Issue,
        action: str,
        sender: User,
        *,
        kind: str | None = None,
        changes: JSON | None = None,
    ) -> list[HookTask]:
        """notifier.go: a pull request gets a PullRequestPayload under the pull_request*
        event types, an issue an IssuePayload under issues/issue_*."""
        repo = self.state.repos[issue.repo_id]
        if issue.is_pull:
            event = "pull_request" if kind is None else f"pull_request_{kind}"
            payload = self.payloads.pull_payload(action, issue, sender, changes)
        else:
            event = "issues" if kind is None else f"issue_{kind}"
            payload = self.payloads.issue_payload(action, issue, sender, changes)
        return self._prepare(repo, event, payload)

    # -- issues and pull requests ---------------------------------------------------

    def create_issue(
        self, repo: Repo, poster: User, title: str, body: str
    ) -> tuple[Issue, Outcome]:
        with self.state.lock:
            now = self.state.now()
            # Issues and pull requests share one index sequence per repository.
            issue = Issue(
                id=self.state.next_id("issue"),
                repo_id=repo.id,
                index=repo.next_index,
                poster_id=poster.id,
                title=title,
                body=body,
                created=now,
                updated=now,
            )
            repo.next_index += 1
            self.state.issues[issue.id] = issue
            # notifier.go NewIssue: "issues" event, action opened, sender = poster
            return issue, Outcome(self._issue_event(issue, "opened", poster))

    def create_pull(
        self,
        repo: Repo,
        poster: User,
        title: str,
        body: str,
        head_repo: Repo,
        head_branch: str,
        base_branch: str,
    ) -> tuple[Issue, Outcome]:
        with self.state.lock:
            head_sha = GitRepo(head_repo.path).branch_sha(head_branch)
            if head_sha is None:
                raise LookupError(f"head branch {head_branch!r} does not exist")
            if GitRepo(repo.path).branch_sha(base_branch) is None:
                raise LookupError(f"base branch {base_branch!r} does not exist")
            now = self.state.now()
            issue = Issue(
                id=self.state.next_id("issue"),
                repo_id=repo.id,
                index=repo.next_index,
                poster_id=poster.id,
                title=title,
                body=body,
                created=now,
                updated=now,
                pull=Pull(
                    id=self.state.next_id("pull"),
                    head_repo_id=head_repo.id,
                    head_branch=head_branch,
                    base_branch=base_branch,
                ),
            )
            repo.next_index += 1
            self.state.issues[issue.id] = issue
            self._sync_pull_ref(issue)
            # notifier.go NewPullRequest: "pull_request" event, action opened
            return issue, Outcome(self._issue_event(issue, "opened", poster))

    def _sync_pull_ref(self, issue: Issue) -> None:
        """Gitea keeps refs/pull/<index>/head in the base repository at the head commit."""
        assert issue.pull is not None
        base = GitRepo(self.state.repos[issue.repo_id].path)
        head_repo = self.state.repos[issue.pull.head_repo_id]
        ref = f"refs/pull/{issue.index}/head"
        if head_repo.id == issue.repo_id:
            sha = base.branch_sha(issue.pull.head_branch)
            if sha is not None:
                base.update_ref(ref, sha)
        else:
            base.fetch_ref(head_repo.path, f"refs/heads/{issue.pull.head_branch}", ref)

    def edit_issue(
        self,
        issue: Issue,
        doer: User,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        assignees: list[User] | None = None,
    ) -> Outcome:
        tasks: list[HookTask] = []
        with self.state.lock:
            now = self.state.now()
            if title is not None and title != issue.title:
                old, issue.title, issue.updated = issue.title, title, now
                # notifier.go IssueChangeTitle: action edited, changes.title.from
                tasks += self._issue_event(issue, "edited", doer, changes={"title": {"from": old}})
            if body is not None and body != issue.body:
                old, issue.body, issue.updated = issue.body, body, now
                # notifier.go IssueChangeContent: action edited, changes.body.from
                tasks += self._issue_event(issue, "edited", doer, changes={"body": {"from": old}})
            if assignees is not None:
                wanted = [u.id for u in assignees]
                for uid in [u for u in issue.assignee_ids if u not in wanted]:
                    issue.assignee_ids.remove(uid)
                    # notifier.go IssueChangeAssignee: issue_assign / pull_request_assign
                    tasks += self._issue_event(issue, "unassigned", doer, kind="assign")
                for uid in [u for u in wanted if u not in issue.assignee_ids]:
                    issue.assignee_ids.append(uid)
                    tasks += self._issue_event(issue, "assigned", doer, kind="assign")
                issue.updated = now
            if state is not None and state != issue.state:
                if state not in ("open", "closed"):
                    raise ValueError(f"invalid state {state!r}")
                issue.state, issue.updated = state, now
                issue.closed_at = now if state == "closed" else None
                # notifier.go IssueChangeStatus: action closed / reopened
                action = "closed" if state == "closed" else "reopened"
                tasks += self._issue_event(issue, action, doer)
        return Outcome(tasks)

    def set_labels(
        self, issue: Issue, doer: User, labels: list[Label], *, replace: bool
    ) -> Outcome:
        with self.state.lock:
            before = list(issue.label_ids)
            ids = [] if replace else list(issue.label_ids)
            ids += [label.id for label in labels if label.id not in ids]
            if ids == before:
                return Outcome([])
            issue.label_ids, issue.updated = ids, self.state.now()
            # notifier.go IssueChangeLabels / IssueClearLabels: issue_label, pull_request_label
            action = "label_updated" if ids else "label_cleared"
            return Outcome(self._issue_event(issue, action, doer, kind="label"))

    def merge_pull(
        self, issue: Issue, doer: User, message: str | None = None
    ) -> tuple[str, Outcome]:
        pr = issue.pull
        if pr is None or pr.merged or issue.state != "open":
            raise ValueError("not an open pull request")
        with self.state.lock:
            repo = self.state.repos[issue.repo_id]
            base = GitRepo(repo.path)
            self._sync_pull_ref(issue)
            base_sha = base.branch_sha(pr.base_branch)
            head_sha = base.rev_parse(f"refs/pull/{issue.index}/head")
            if base_sha is None or head_sha is None:
                raise LookupError("base or head commit missing")
            # Gitea's default merge commit message for the "merge" style.
            text = message or (
                f"Merge pull request '{issue.title}' (#{issue.index}) from "
                f"{pr.head_branch} into {pr.base_branch}\n"
            )
            now = self.state.now()
            sha = base.merge_commit(
                base_sha,
                head_sha,
                message=text,
                author=Signature(doer.full_name or doer.login, doer.email),
                when=now,
            )
            if sha is None:
                raise ValueError("merge conflict")
            base.update_ref(f"refs/heads/{pr.base_branch}", sha, base_sha)
            pr.merged, pr.merged_at, pr.merge_commit_sha, pr.merged_by_id = True, now, sha, doer.id
            issue.state, issue.closed_at, issue.updated = "closed", now, now
            # notifier.go MergePullRequest: "pull_request" event, action closed, merged true
            tasks = self._issue_event(issue, "closed", doer)
            tasks += self.push_tasks(repo, doer, {f"refs/heads/{pr.base_branch}": (base_sha, sha)})
        return sha, Outcome(tasks)

    # -- comments -------------------------------------------------------------------

    def _comment_event(self, issue: Issue) -> str:
        # notifier.go CreateIssueComment: pull_request_comment on a PR, else issue_comment
        return "pull_request_comment" if issue.is_pull else "issue_comment"

    def create_comment(self, issue: Issue, poster: User, body: str) -> tuple[Comment, Outcome]:
        with self.state.lock:
            now = self.state.now()
            comment = Comment(
                id=self.state.next_id("comment"),
                issue_id=issue.id,
                poster_id=poster.id,
                body=body,
                created=now,
                updated=now,
            )
            self.state.comments[comment.id] = comment
            issue.updated = now
            payload = self.payloads.issue_comment_payload(
                "created", issue, self.convert.comment(comment), poster
            )
            repo = self.state.repos[issue.repo_id]
            return comment, Outcome(self._prepare(repo, self._comment_event(issue), payload))

    def edit_comment(self, comment: Comment, doer: User, body: str) -> Outcome:
        with self.state.lock:
            if body == comment.body:  # editIssueComment only updates on a change
                return Outcome([])
            old, comment.body, comment.updated = comment.body, body, self.state.now()
            comment.history.append((comment.updated, old))
            issue = self.state.issues[comment.issue_id]
            # notifier.go UpdateComment: action edited, changes.body.from = old content
            payload = self.payloads.issue_comment_payload(
                "edited", issue, self.convert.comment(comment), doer, changes_from=old
            )
            repo = self.state.repos[issue.repo_id]
            return Outcome(self._prepare(repo, self._comment_event(issue), payload))

    def delete_comment(self, comment: Comment, doer: User) -> Outcome:
        with self.state.lock:
            issue = self.state.issues[comment.issue_id]
            converted = self.convert.comment(comment)
            del self.state.comments[comment.id]
            # notifier.go DeleteComment: action deleted, with the comment as it was
            payload = self.payloads.issue_comment_payload("deleted", issue, converted, doer)
            repo = self.state.repos[issue.repo_id]
            return Outcome(self._prepare(repo, self._comment_event(issue), payload))

    def create_label(
        self,
        repo: Repo,
        name: str,
        color: str,
        description: str = "",
        exclusive: bool = False,
    ) -> Label:
        with self.state.lock:
            label = Label(
                id=self.state.next_id("label"),
                repo_id=repo.id,
                name=name,
                color=color.lstrip("#").lower(),
                description=description,
                exclusive=exclusive,
            )
            self.state.labels[label.id] = label
            return label

    # -- pushes and releases ----------------------------------------------------------

    def commit(
        self,
        repo: Repo,
        pusher: User,
        branch: str,
        files: dict[str, str | None],
        message: str,
        base: str | None,
        force: bool = False,
    ) -> tuple[str, Outcome]:
        with self.state.lock:
            git = GitRepo(repo.path)
            old = git.branch_sha(branch)
            start = git.branch_sha(base or repo.default_branch)
            parent = old if old is not None and not force else start
            sha = git.commit_files(
                branch,
                files,
                message=message,
                when=self.state.now(),
                parent=parent,
                author=Signature(pusher.full_name or pusher.login, pusher.email),
            )
            ref_changes = {f"refs/heads/{branch}": (old or ZERO_SHA, sha)}
            return sha, Outcome(self.push_tasks(repo, pusher, ref_changes))

    def push_tasks(
        self, repo: Repo, pusher: User, changes: dict[str, tuple[str, str]]
    ) -> list[HookTask]:
        """What Gitea's post-receive processing sends for updated branches: create/delete,
        push, and pull_request synchronized for open pull requests whose head moved."""
        tasks: list[HookTask] = []
        with self.state.lock:
            git = GitRepo(repo.path)
            repo.updated = self.state.now()
            heads = git.refs()
            for ref, (old, new) in sorted(changes.items()):
                if not ref.startswith("refs/heads/"):
                    continue
                branch = ref.removeprefix("refs/heads/")
                if new == ZERO_SHA:
                    payload = self.payloads.delete_payload(repo, branch, "branch", pusher)
                    tasks += self._prepare(repo, "delete", payload, branch)
                    continue
                if old == ZERO_SHA:
                    payload = self.payloads.create_payload(repo, branch, "branch", new, pusher)
                    tasks += self._prepare(repo, "create", payload, branch)
                others = [s for r, s in heads.items() if r.startswith("refs/heads/") and r != ref]
                commits = git.commits_between(old, new, exclude=others if old == ZERO_SHA else None)
                payload = self.payloads.push_payload(repo, ref, old, new, commits, pusher)
                tasks += self._prepare(repo, "push", payload, branch)
                tasks += self._sync_pulls(repo, branch, pusher)
        return tasks

    def _sync_pulls(self, head_repo: Repo, branch: str, pusher: User) -> list[HookTask]:
        tasks: list[HookTask] = []
        for issue in list(self.state.issues.values()):
            pr = issue.pull
            if pr is None or issue.state != "open" or pr.head_repo_id != head_repo.id:
                continue
            if pr.head_branch != branch:
                continue
            self._sync_pull_ref(issue)
            issue.updated = self.state.now()
            # notifier.go PullRequestSynchronized: pull_request_sync, action synchronized
            tasks += self._issue_event(issue, "synchronized", pusher, kind="sync")
        return tasks

    def create_release(
        self, repo: Repo, author: User, tag: str, target: str, name: str, body: str
    ) -> tuple[Release, Outcome]:
        with self.state.lock:
            git = GitRepo(repo.path)
            sha = git.rev_parse(target)
            if sha is None:
                raise LookupError(f"target {target!r} does not exist")
            if git.rev_parse(f"refs/tags/{tag}") is None:
                git.update_ref(f"refs/tags/{tag}", sha)
            release = Release(
                id=self.state.next_id("release"),
                repo_id=repo.id,
                tag_name=tag,
                target=target,
                name=name,
                body=body,
                author_id=author.id,
                created=self.state.now(),
            )
            self.state.releases[release.id] = release
            # notifier.go NewRelease: "release" event, action published
            payload = self.payloads.release_payload("published", release, author)
            return release, Outcome(self._prepare(repo, "release", payload))
