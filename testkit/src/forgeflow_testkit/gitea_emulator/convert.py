"""API structs with the JSON shapes of Gitea's modules/structs, as services/convert builds them."""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import md5
from typing import Any
from urllib.parse import quote, urlsplit

from .gitrepo import GitRepo
from .gojson import EPOCH_TIME, ZERO_TIME, opt_rfc3339, rfc3339
from .state import Access, Attachment, Comment, Hook, Issue, Label, Pull, Release, Repo, State, User

JSON = dict[str, Any]


class Converter:
    """Gitea services/convert, bound to one instance's state and AppURL (ends with '/')."""

    def __init__(self, state: State, app_url: str) -> None:
        self.state = state
        self.app_url = app_url

    @property
    def host(self) -> str:
        return urlsplit(self.app_url).hostname or "localhost"

    # -- users ----------------------------------------------------------------------

    def user(self, user: User, *, signed: bool = False, authed: bool = False) -> JSON:
        """Gitea services/convert/user.go toUser: e-mail only for signed-in callers, private
        fields only for the user itself or a site admin."""
        # user.GetPlaceholderEmail(): "<lowername>@<Service.NoReplyAddress>" ("noreply." + domain)
        email = f"{user.login.lower()}@noreply.{self.host}"
        if signed and (not user.keep_email_private or authed):
            email = user.email
        avatar = md5(user.email.lower().encode(), usedforsecurity=False).hexdigest()
        return {
            "id": user.id,
            "login": user.login,
            "login_name": "",
            "source_id": 0,
            "full_name": user.full_name,
            "email": email,
            "avatar_url": f"{self.app_url}avatars/{avatar}",
            "html_url": f"{self.app_url}{quote(user.login)}",
            "language": "",
            "is_admin": user.is_admin if authed else False,
            "last_login": rfc3339(user.created) if authed else ZERO_TIME,
            "created": rfc3339(user.created),
            "restricted": False,
            "active": authed,
            "prohibit_login": False,
            "location": "",
            "website": "",
            "description": "",
            "visibility": "public",
            "followers_count": 0,
            "following_count": 0,
            "starred_repos_count": 0,
            "username": user.login,  # structs.User MarshalJSON adds "username" for compatibility
        }

    def user_for(self, user: User, doer: User | None) -> JSON:
        """Gitea convert.ToUser(ctx, user, doer)."""
        authed = doer is not None and (doer.id == user.id or doer.is_admin)
        return self.user(user, signed=doer is not None, authed=authed)

    # -- repositories ---------------------------------------------------------------

    def repo_url(self, repo: Repo) -> str:
        return f"{self.app_url}{self.state.full_name(repo)}"

    def repo_api_url(self, repo: Repo) -> str:
        return f"{self.app_url}api/v1/repos/{self.state.full_name(repo)}"

    def repo(self, repo: Repo, doer: User | None, *, with_parent: bool = True) -> JSON:
        """Gitea services/convert/repository.go innerToRepo with the doer's permission."""
        mode = self.state.access(repo, doer)
        owner = self.state.owner_of(repo)
        issues = [i for i in self.state.issues.values() if i.repo_id == repo.id]
        data: JSON = {
            "id": repo.id,
            # ToUserWithAccessMode: e-mail visible when the doer has any access
            "owner": self.user(owner, signed=mode > Access.NONE),
            "name": repo.name,
            "full_name": self.state.full_name(repo),
            "description": repo.description,
            "empty": False,
            "private": repo.private,
            "fork": repo.parent_id is not None,
            "template": False,
        }
        if repo.parent_id is not None and with_parent:  # `parent,omitempty`
            data["parent"] = self.repo(self.state.repos[repo.parent_id], doer, with_parent=False)
        data.update(
            {
                "mirror": False,
                "size": 0,
                "language": "",
                "languages_url": f"{self.repo_api_url(repo)}/languages",
                "html_url": self.repo_url(repo),
                "url": self.repo_api_url(repo),
                "link": "",
                "ssh_url": f"git@{self.host}:{self.state.full_name(repo)}.git",
                "clone_url": f"{self.repo_url(repo)}.git",
                "original_url": "",
                "website": "",
                "stars_count": 0,
                "forks_count": sum(1 for r in self.state.repos.values() if r.parent_id == repo.id),
                "watchers_count": 0,
                "open_issues_count": sum(1 for i in issues if not i.is_pull and i.state == "open"),
                "open_pr_counter": sum(1 for i in issues if i.is_pull and i.state == "open"),
                "release_counter": sum(
                    1 for r in self.state.releases.values() if r.repo_id == repo.id
                ),
                "default_branch": repo.default_branch,
                "archived": False,
                "created_at": rfc3339(repo.created),
                "updated_at": rfc3339(repo.updated),
                "archived_at": EPOCH_TIME,
                # structs.Permission: admin >= AccessModeAdmin, push >= Write, pull >= Read
                "permissions": {
                    "admin": mode >= Access.ADMIN,
                    "push": mode >= Access.WRITE,
                    "pull": mode >= Access.READ,
                },
            }
        )
        data.update(_repo_settings())
        return data

    # -- issues, labels, comments -----------------------------------------------------

    def issue_url(self, issue: Issue) -> str:
        """Gitea Issue.HTMLURL(): /issues/N, or /pulls/N for a pull request."""
        kind = "pulls" if issue.is_pull else "issues"
        return f"{self.repo_url(self.state.repos[issue.repo_id])}/{kind}/{issue.index}"

    def label(self, label: Label) -> JSON:
        repo = self.state.repos[label.repo_id]
        return {
            "id": label.id,
            "name": label.name,
            "exclusive": label.exclusive,
            "is_archived": label.is_archived,
            "color": label.color.lstrip("#"),
            "description": label.description,
            "url": f"{self.repo_api_url(repo)}/labels/{label.id}",
        }

    def issue(self, issue: Issue) -> JSON:
        """Gitea services/convert/issue.go ToAPIIssue."""
        repo = self.state.repos[issue.repo_id]
        assignees = [self.user(self.state.users[uid]) for uid in issue.assignee_ids]
        pull_meta = None
        if issue.pull is not None:
            pull_meta = {
                "merged": issue.pull.merged,
                "merged_at": opt_rfc3339(issue.pull.merged_at),
                "draft": False,
                "html_url": self.issue_url(issue),
            }
        return {
            "id": issue.id,
            "url": f"{self.repo_api_url(repo)}/issues/{issue.index}",
            "html_url": self.issue_url(issue),
            "number": issue.index,
            "user": self.user(self.state.users[issue.poster_id]),
            "original_author": "",
            "original_author_id": 0,
            "title": issue.title,
            "body": issue.body,
            "ref": "",
            "assets": [self.attachment(a) for a in self.state.attachments_of(issue.id)],
            "labels": [self.label(self.state.labels[lid]) for lid in issue.label_ids],
            "milestone": None,
            "assignee": assignees[0] if assignees else None,
            "assignees": assignees or None,
            "state": issue.state,
            "is_locked": issue.is_locked,
            "comments": len(self.state.comments_of(issue)),
            "created_at": rfc3339(issue.created),
            "updated_at": rfc3339(issue.updated),
            "closed_at": opt_rfc3339(issue.closed_at),
            "due_date": None,
            "time_estimate": 0,
            "pull_request": pull_meta,
            "repository": {
                "id": repo.id,
                "name": repo.name,
                "owner": self.state.owner_of(repo).login,
                "full_name": self.state.full_name(repo),
            },
            "pin_order": 0,
        }

    def attachment(self, attachment: Attachment) -> JSON:
        """Gitea services/convert/attachment.go ToAttachment (an issue's: the download
        URL is Attachment.DownloadURL(), AppURL + "attachments/" + uuid)."""
        return {
            "id": attachment.id,
            "name": attachment.name,
            "size": len(attachment.data),
            "download_count": attachment.download_count,
            "created_at": rfc3339(attachment.created),
            "uuid": attachment.uuid,
            "browser_download_url": f"{self.app_url}attachments/{quote(attachment.uuid)}",
        }

    def comment(self, comment: Comment) -> JSON:
        """Gitea services/convert/issue_comment.go ToAPIComment (poster via ToUser(.., nil))."""
        issue = self.state.issues[comment.issue_id]
        html = self.issue_url(issue)
        return {
            "id": comment.id,
            "html_url": f"{html}#issuecomment-{comment.id}",
            # Comment.PRURL()/IssueURL(): the issue's HTML URL on the matching kind only
            "pull_request_url": html if issue.is_pull else "",
            "issue_url": "" if issue.is_pull else html,
            "user": self.user(self.state.users[comment.poster_id]),
            "original_author": "",
            "original_author_id": 0,
            "body": comment.body,
            "assets": [
                self.attachment(a) for a in self.state.attachments_of(comment.issue_id, comment.id)
            ],
            "created_at": rfc3339(comment.created),
            "updated_at": rfc3339(comment.updated),
        }

    def pull(self, issue: Issue, doer: User | None) -> JSON:
        """Gitea services/convert/pull.go ToAPIPullRequest."""
        pr = issue.pull
        assert pr is not None
        data = self.issue(issue)
        base_repo = self.state.repos[issue.repo_id]
        head_repo = self.state.repos[pr.head_repo_id]
        git = _pull_git(GitRepo(base_repo.path), GitRepo(head_repo.path), issue.index, pr)
        merger = self.state.users.get(pr.merged_by_id or 0)
        return {
            "id": pr.id,
            "url": self.issue_url(issue),
            "number": issue.index,
            "user": data["user"],
            "title": issue.title,
            "body": issue.body,
            "labels": data["labels"],
            "milestone": None,
            "assignee": data["assignee"],
            "assignees": data["assignees"],
            # ToAPIPullRequest: the users asked for a review (nil when none).
            "requested_reviewers": [
                self.user_for(self.state.users[uid], doer) for uid in pr.requested_reviewer_ids
            ]
            or None,
            "requested_reviewers_teams": None,
            "state": issue.state,
            "draft": False,
            "is_locked": issue.is_locked,
            "comments": data["comments"],
            "review_comments": 0,
            "additions": git.additions,
            "deletions": git.deletions,
            "changed_files": git.changed,
            "html_url": self.issue_url(issue),
            "diff_url": f"{self.issue_url(issue)}.diff",
            "patch_url": f"{self.issue_url(issue)}.patch",
            "mergeable": git.mergeable and not pr.merged,
            "merged": pr.merged,
            "merged_at": opt_rfc3339(pr.merged_at),
            "merge_commit_sha": pr.merge_commit_sha,
            "merged_by": self.user_for(merger, doer) if merger else None,
            "allow_maintainer_edit": False,
            "base": self._branch(pr.base_branch, pr.base_branch, git.base_sha, base_repo, doer),
            "head": self._branch(pr.head_branch, git.head_ref, git.head_sha, head_repo, doer),
            "merge_base": git.merge_base,
            "due_date": None,
            "created_at": rfc3339(issue.created),
            "updated_at": rfc3339(issue.updated),
            "closed_at": opt_rfc3339(issue.closed_at),
            "pin_order": 0,
        }

    def _branch(self, label: str, ref: str, sha: str, repo: Repo, doer: User | None) -> JSON:
        """PRBranchInfo: one side of a pull request."""
        return {
            "label": label,
            "ref": ref,
            "sha": sha,
            "repo_id": repo.id,
            "repo": self.repo(repo, doer),
        }

    def release(self, release: Release) -> JSON:
        repo = self.state.repos[release.repo_id]
        tag = quote(release.tag_name)
        return {
            "id": release.id,
            "tag_name": release.tag_name,
            "target_commitish": release.target,
            "name": release.name,
            "body": release.body,
            "url": f"{self.repo_api_url(repo)}/releases/{release.id}",
            "html_url": f"{self.repo_url(repo)}/releases/tag/{tag}",
            "tarball_url": f"{self.repo_url(repo)}/archive/{tag}.tar.gz",
            "zipball_url": f"{self.repo_url(repo)}/archive/{tag}.zip",
            "upload_url": f"{self.repo_api_url(repo)}/releases/{release.id}/assets",
            "draft": release.draft,
            "prerelease": release.prerelease,
            "created_at": rfc3339(release.created),
            "published_at": rfc3339(release.created),
            "author": self.user(self.state.users[release.author_id]),
            "assets": [],
        }

    def hook(self, hook: Hook, events: list[str]) -> JSON:
        """Gitea services/webhook/general.go ToHook: the secret is never returned."""
        return {
            "id": hook.id,
            "type": hook.type,
            "branch_filter": hook.branch_filter,
            "config": {"url": hook.url, "content_type": hook.content_type},
            "events": events,
            "authorization_header": hook.authorization_header,
            "active": hook.active,
            "updated_at": rfc3339(hook.updated),
            "created_at": rfc3339(hook.created),
        }


def _repo_settings() -> JSON:
    """The settings every emulated repository has, Gitea's defaults for a new one (a
    fresh dict each time: callers may change what they are given)."""
    return {
        "has_issues": True,
        "internal_tracker": {
            "enable_time_tracker": True,
            "allow_only_contributors_to_track_time": True,
            "enable_issue_dependencies": True,
        },
        "has_wiki": True,
        "has_pull_requests": True,
        "has_projects": True,
        "projects_mode": "all",
        "has_releases": True,
        "has_packages": True,
        "has_actions": True,
        "ignore_whitespace_conflicts": False,
        "allow_merge_commits": True,
        "allow_rebase": True,
        "allow_rebase_explicit": True,
        "allow_squash_merge": True,
        "allow_fast_forward_only_merge": True,
        "allow_rebase_update": True,
        "allow_manual_merge": False,
        "autodetect_manual_merge": False,
        "default_delete_branch_after_merge": False,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": False,
        "avatar_url": "",
        "internal": False,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": ZERO_TIME,
        "topics": [],
        "licenses": [],
    }


@dataclass(frozen=True)
class _PullGit:
    """What git says about a pull request, as ToAPIPullRequest reads it."""

    base_sha: str
    head_ref: str
    head_sha: str
    merge_base: str
    mergeable: bool
    additions: int = 0
    deletions: int = 0
    changed: int = 0


def _pull_git(base_git: GitRepo, head_git: GitRepo, index: int, pr: Pull) -> _PullGit:
    base_sha = base_git.branch_sha(pr.base_branch) or ""
    head_sha = head_git.branch_sha(pr.head_branch)
    head_ref = pr.head_branch
    if head_sha is None:  # branch gone: Gitea falls back to refs/pull/N/head
        head_ref = f"refs/pull/{index}/head"
        head_sha = base_git.rev_parse(head_ref) or ""
    merge_base = base_git.merge_base(base_sha, head_sha) if base_sha and head_sha else None
    mergeable = bool(base_sha and head_sha and base_git.merge_tree(base_sha, head_sha))
    stats = (0, 0, 0)
    if merge_base and head_sha:
        stats = base_git.diff_stat(merge_base, head_sha)
    return _PullGit(base_sha, head_ref, head_sha, merge_base or "", mergeable, *stats)
