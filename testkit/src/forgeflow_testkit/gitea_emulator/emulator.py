"""GiteaEmulator: the test-facing handle on one emulated Gitea instance."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

from .api import build_app
from .api_attachments import AttachmentControls
from .api_reviews import ReviewControls
from .apibase import Core
from .controls import EmulatorControls
from .convert import Converter
from .delivery import Deliverer, Delivery
from .gitrepo import GitRepo, Signature, git_env
from .legacy import LegacyDeliveries
from .server import BackgroundServer
from .service import Outcome, Service
from .state import Access, Comment, Issue, Repo, State, User

_VERSIONS = {"gitea": "1.22.6", "forgejo": "9.0.3+gitea-1.22.0"}


class GiteaEmulator(EmulatorControls, LegacyDeliveries, ReviewControls, AttachmentControls):
    """An HTTP server speaking Gitea's /api/v1, webhooks and git smart HTTP, backed by
    in-memory state and real bare repositories under `git_root`.

    Helpers named after user actions (post_comment, add_issue, ...) act as that user in the
    web UI: they change the state and deliver the resulting webhooks before returning.
    Changes made through the REST API are answered first and delivered by a background
    worker, as Gitea's hook queue does; `flush_deliveries()` waits for them."""

    def __init__(
        self, git_root: Path, *, flavour: str = "gitea", version: str | None = None
    ) -> None:
        """``version``: what ``GET /version`` answers (default: the flavour's release,
        whose behaviour the emulator follows; another number only changes that answer)."""
        if flavour not in _VERSIONS:
            raise ValueError(f"unknown flavour {flavour!r}")
        self.git_root = Path(git_root)
        self.git_root.mkdir(parents=True, exist_ok=True)
        self.flavour = flavour
        self._state = State(self.git_root)
        self._deliverer = Deliverer(self._state, flavour)
        self._convert = Converter(self._state, "")
        self._service = Service(self._state, self._convert, self._deliverer)
        core = Core(
            self._state,
            self._convert,
            self._service,
            self._deliverer,
            version or _VERSIONS[flavour],
        )
        self._core = core
        self._server = BackgroundServer(build_app(core))
        self._convert.app_url = f"{self._server.url}/"  # Gitea's AppURL ends with a slash

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._server.url

    def set_version(self, version: str) -> None:
        """What ``GET /version`` answers from now on (an upgrade of the instance)."""
        self._core.version = version

    def start(self) -> GiteaEmulator:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
        self._deliverer.close()

    def __enter__(self) -> GiteaEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- users, organizations, repositories ---------------------------------------------

    def add_user(
        self, login: str, *, is_admin: bool = False, full_name: str = "", email: str | None = None
    ) -> str:
        """Create the user if needed and return a fresh API token of that user."""
        with self._state.lock:
            user = self._state.find_user(login) or self._state.create_user(
                login, is_admin=is_admin, full_name=full_name, email=email
            )
            return self._state.issue_token(user)

    def add_repo(
        self,
        owner: str,
        name: str,
        *,
        default_branch: str = "main",
        private: bool = True,
        files: dict[str, str] | None = None,
        fork_of: tuple[str, str] | None = None,
        description: str = "",
    ) -> dict[str, Any]:
        with self._state.lock:
            owner_user = self._state.find_user(owner) or self._state.create_user(owner)
            if any(
                r.owner_id == owner_user.id and r.name.lower() == name.lower()
                for r in self._state.repos.values()
            ):
                raise ValueError(f"repository {owner}/{name} already exists")
            path = self.git_root / owner_user.login / f"{name}.git"
            parent: Repo | None = None
            if fork_of is not None:
                parent = self._state.repo_by_name(*fork_of)
                default_branch = parent.default_branch
                path.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    ["git", "clone", "--bare", "--quiet", str(parent.path), str(path)],
                    check=True,
                    capture_output=True,
                    env=git_env(),
                )
            now = self._state.now()
            repo = Repo(
                id=self._state.next_id("repository"),
                owner_id=owner_user.id,
                name=name,
                private=private,
                default_branch=default_branch,
                path=path,
                created=now,
                updated=now,
                parent_id=parent.id if parent else None,
                description=description,
            )
            _first_commits(repo, owner_user, fork=parent is not None, files=files)
            self._state.repos[repo.id] = repo
            return self._convert.repo(repo, owner_user)

    def set_permission(self, owner: str, repo: str, login: str, permission: str) -> None:
        """Make `login` a collaborator with "read", "write" or "admin"; "none" removes it."""
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            user = self._state.user_by_login(login)
            access = Access.parse(permission)
            if access == Access.NONE:
                target.collaborators.pop(user.id, None)
            elif access in (Access.READ, Access.WRITE, Access.ADMIN):
                target.collaborators[user.id] = access
            else:
                raise ValueError("permission must be none, read, write or admin")

    # -- issues, pull requests, pushes ------------------------------------------------------

    def _actor(self, repo: Repo, login: str, needed: Access = Access.READ) -> User:
        user = self._state.user_by_login(login)
        if self._state.access(repo, user) < needed:
            raise PermissionError(f"{login} lacks {needed.label} access to {repo.name}")
        return user

    def _deliver(self, outcome: Outcome) -> list[Delivery]:
        return self._deliverer.deliver_now(outcome.tasks)

    def add_issue(self, owner: str, repo: str, *, title: str, body: str = "", author: str) -> int:
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            issue, outcome = self._service.create_issue(
                target, self._actor(target, author), title, body
            )
        self._deliver(outcome)
        return issue.index

    def add_pull(
        self,
        owner: str,
        repo: str,
        *,
        title: str,
        head: str,
        base: str = "main",
        author: str,
        head_repo: tuple[str, str] | None = None,
        body: str = "",
    ) -> int:
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            source = self._state.repo_by_name(*head_repo) if head_repo else target
            issue, outcome = self._service.create_pull(
                target, self._actor(target, author), title, body, source, head, base
            )
        self._deliver(outcome)
        return issue.index

    def push_branch(
        self,
        owner: str,
        repo: str,
        branch: str,
        files: dict[str, str],
        *,
        message: str = "change",
        base: str | None = None,
        pusher: str | None = None,
        force: bool = False,
    ) -> str:
        """Commit `files` on `branch` (created from `base`, default the default branch) and
        send what a push sends: push/create hooks and pull_request synchronized.
        ``force``: the commit starts from `base` even when the branch exists, and
        replaces it (a force-push that rewrites the branch)."""
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            user = self._state.user_by_login(pusher) if pusher else self._state.owner_of(target)
            sha, outcome = self._service.commit(
                target, user, branch, dict(files), message.rstrip("\n") + "\n", base, force
            )
        self._deliver(outcome)
        return sha

    def branch_sha(self, owner: str, repo: str, branch: str) -> str | None:
        """The head of ``branch`` in the repository as Gitea has it (None: no branch)."""
        with self._state.lock:
            path = self._state.repo_by_name(owner, repo).path
        return GitRepo(path).branch_sha(branch)

    def branch_log(self, owner: str, repo: str, branch: str) -> list[str]:
        """The commits of ``branch`` as Gitea has them, newest first ([]: no branch)."""
        with self._state.lock:
            path = self._state.repo_by_name(owner, repo).path
        git = GitRepo(path)
        head = git.branch_sha(branch)
        return git.out("rev-list", head).split() if head else []

    def merge_pull(self, owner: str, repo: str, index: int, *, merger: str) -> str:
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            issue = self._state.issue_by_index(target, index)
            sha, outcome = self._service.merge_pull(
                issue, self._actor(target, merger, Access.WRITE)
            )
        self._deliver(outcome)
        return sha

    def edit_issue(
        self,
        owner: str,
        repo: str,
        index: int,
        *,
        by: str,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        assignees: list[str] | None = None,
    ) -> dict[str, Any]:
        """Edit title/body, close ("closed") or reopen ("open"), or set assignees."""
        with self._state.lock:
            issue = self._issue(owner, repo, index)
            target = self._state.repos[issue.repo_id]
            users = (
                [self._state.user_by_login(a) for a in assignees] if assignees is not None else None
            )
            outcome = self._service.edit_issue(
                issue,
                self._actor(target, by),
                title=title,
                body=body,
                state=state,
                assignees=users,
            )
        self._deliver(outcome)
        return self.issue(owner, repo, index)

    def add_label(
        self, owner: str, repo: str, name: str, *, color: str = "ee0701", description: str = ""
    ) -> int:
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            return self._service.create_label(target, name, color, description).id

    def label_issue(self, owner: str, repo: str, index: int, labels: list[str], *, by: str) -> None:
        with self._state.lock:
            issue = self._issue(owner, repo, index)
            target = self._state.repos[issue.repo_id]
            found = [self._state.label_of(target, name) for name in labels]
            outcome = self._service.set_labels(
                issue, self._actor(target, by, Access.WRITE), found, replace=False
            )
        self._deliver(outcome)

    def add_release(
        self,
        owner: str,
        repo: str,
        *,
        tag: str,
        author: str,
        target: str | None = None,
        name: str = "",
        body: str = "",
    ) -> dict[str, Any]:
        with self._state.lock:
            repository = self._state.repo_by_name(owner, repo)
            release, outcome = self._service.create_release(
                repository,
                self._actor(repository, author, Access.WRITE),
                tag,
                target or repository.default_branch,
                name or tag,
                body,
            )
            data = self._convert.release(release)
        self._deliver(outcome)
        return data

    def _issue(self, owner: str, repo: str, index: int) -> Issue:
        return self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)

    def issue(self, owner: str, repo: str, index: int) -> dict[str, Any]:
        with self._state.lock:
            return self._convert.issue(self._issue(owner, repo, index))

    def pull(self, owner: str, repo: str, index: int) -> dict[str, Any]:
        with self._state.lock:
            return self._convert.pull(self._issue(owner, repo, index), None)

    # -- comments -------------------------------------------------------------------------

    def post_comment(
        self, owner: str, repo: str, index: int, *, author: str, body: str
    ) -> dict[str, Any]:
        with self._state.lock:
            issue = self._issue(owner, repo, index)
            user = self._actor(self._state.repos[issue.repo_id], author)
            comment, outcome = self._service.create_comment(issue, user, body)
            data = self._convert.comment(comment)
        self._deliver(outcome)
        return data

    def edit_comment(
        self, owner: str, repo: str, comment_id: int, *, body: str, editor: str | None = None
    ) -> dict[str, Any]:
        with self._state.lock:
            comment = self._comment(owner, repo, comment_id)
            user = (
                self._state.user_by_login(editor)
                if editor
                else self._state.users[comment.poster_id]
            )
            outcome = self._service.edit_comment(comment, user, body)
            data = self._convert.comment(comment)
        self._deliver(outcome)
        return data

    def delete_comment(
        self, owner: str, repo: str, comment_id: int, *, deleter: str | None = None
    ) -> None:
        with self._state.lock:
            comment = self._comment(owner, repo, comment_id)
            user = (
                self._state.user_by_login(deleter)
                if deleter
                else self._state.users[comment.poster_id]
            )
            outcome = self._service.delete_comment(comment, user)
        self._deliver(outcome)

    def _comment(self, owner: str, repo: str, comment_id: int) -> Comment:
        comment = self._state.comment(comment_id)
        issue = self._state.issues[comment.issue_id]
        if issue.repo_id != self._state.repo_by_name(owner, repo).id:
            raise LookupError(f"comment {comment_id} is not in {owner}/{repo}")
        return comment

    def comments(self, owner: str, repo: str, index: int) -> list[dict[str, Any]]:
        with self._state.lock:
            issue = self._issue(owner, repo, index)
            return [self._convert.comment(c) for c in self._state.comments_of(issue)]

    def comment_payload(
        self,
        owner: str,
        repo: str,
        index: int,
        comment: dict[str, Any],
        *,
        action: str = "created",
        sender: str,
        changes_from: str | None = None,
    ) -> dict[str, Any]:
        """The IssueCommentPayload Gitea sends for `comment` on issue/PR `index`."""
        with self._state.lock:
            issue = self._issue(owner, repo, index)
            return self._service.payloads.issue_comment_payload(
                action, issue, comment, self._state.user_by_login(sender), changes_from
            )


def _first_commits(repo: Repo, owner: User, *, fork: bool, files: dict[str, str] | None) -> None:
    """A new repository's first commit (`files`, or a README), or `files` committed on
    top of what a fork was cloned with."""
    author = Signature(owner.full_name or owner.login, owner.email)
    branch, now = repo.default_branch, repo.created
    if not fork:
        git = GitRepo.init_bare(repo.path, branch)
        content: dict[str, str | None] = dict(files or {"README.md": f"# {repo.name}\n"})
        git.commit_files(
            branch, content, message="Initial commit\n", when=now, parent=None, author=author
        )
    elif files:
        git = GitRepo(repo.path)
        git.commit_files(
            branch,
            dict(files),
            message="change\n",
            when=now,
            parent=git.branch_sha(branch),
            author=author,
        )
