"""REST routes of a repository's code as the agent's tools read it: a pull request's
files and diff, its edit, raw files, commit statuses (routers/api/v1/repo).

Gitea's sources followed: ``routers/api/v1/repo/pull.go`` (GetPullRequestFiles,
DownloadPullDiffOrPatch, EditPullRequest: 201), ``file.go`` GetRawFile (``ref`` query,
default branch), ``status.go`` (NewCommitStatus: 201; GetCombinedCommitStatusByRef),
``modules/structs/pull.go`` ChangedFile and ``status.go`` CommitStatus (its state is
the JSON field ``status``) / CombinedStatus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import Response, StreamingResponse

from .apibase import ApiError, Call, RouteSpec, json_response, not_found
from .gitrepo import GitError, GitRepo
from .gojson import rfc3339
from .state import Access, Issue, Repo


@dataclass
class Status:
    id: int
    repo_id: int
    sha: str
    state: str
    context: str
    description: str
    target_url: str
    created: Any


_STATES = ("pending", "success", "error", "failure", "warning")
# models/git/commit_status.go CalcCommitStatus: the worst state wins (this order).
_WORST = ("error", "failure", "warning", "pending", "success")


def _pull(call: Call) -> tuple[Repo, Access, Issue]:
    repo, mode = call.repo()
    raw = call.params["index"]
    try:
        issue = call.state.issue_by_index(repo, int(raw))
    except (ValueError, LookupError):
        raise not_found() from None
    if issue.pull is None:
        raise not_found()
    return repo, mode, issue


def _range(repo: Repo, issue: Issue) -> tuple[GitRepo, str, str]:
    git = GitRepo(repo.path)
    assert issue.pull is not None
    base = git.branch_sha(issue.pull.base_branch) or ""
    head = git.rev_parse(f"refs/pull/{issue.index}/head") or ""
    merge_base = git.merge_base(base, head) if base and head else None
    if not merge_base:
        raise ApiError(500, "pull request refs are missing")
    return git, merge_base, head


def pull_files(call: Call) -> Response:
    """GetPullRequestFiles: []ChangedFile, from the merge base to the head."""
    repo, _, issue = _pull(call)
    git, base, head = _range(repo, issue)
    names = git.out("diff", "--name-status", "-M", base, head).splitlines()
    stats = git.out("diff", "--numstat", "-M", base, head).splitlines()
    files = []
    for status_line, stat_line in zip(names, stats, strict=False):
        fields = status_line.split("\t")
        added, deleted, *_ = stat_line.split("\t")
        code = fields[0][:1]
        kind = {"A": "added", "D": "deleted", "R": "renamed", "M": "changed"}.get(code, "changed")
        name = fields[-1]
        adds, dels = (0 if x == "-" else int(x) for x in (added, deleted))
        files.append(
            {
                "filename": name,
                "previous_filename": fields[1] if code == "R" else "",
                "status": kind,
                "additions": adds,
                "deletions": dels,
                "changes": adds + dels,
                "html_url": "",
                "contents_url": "",
                "raw_url": "",
            }
        )
    return json_response(files)


def pull_diff(call: Call) -> Response:
    """DownloadPullDiffOrPatch (``/pulls/{index}.diff``): text/plain."""
    repo, _, issue = _pull(call)
    git, base, head = _range(repo, issue)
    # Streamed, as Gitea pipes git's output into the response (services/gitdiff): a
    # pull request's diff has no size limit there, and a client must bound its read.
    return StreamingResponse(
        git.stream("diff", "--full-index", base, head), media_type="text/plain"
    )


def edit_pull(call: Call) -> Response:
    """EditPullRequest: title/body by the poster or a writer; 201 with the pull."""
    _, mode, issue = _pull(call)
    doer = call.token_user()
    if doer.id != issue.poster_id and mode < Access.WRITE:
        raise ApiError(403, "only the poster or a writer may edit")
    form = call.form()
    outcome = call.service.edit_issue(
        issue, doer, title=form.get("title") or None, body=form.get("body")
    )
    call.deliver(outcome)
    return json_response(call.convert.pull(issue, doer), 201)


def raw_file(call: Call) -> Response:
    """GetRawFile: the blob at ``ref`` (default branch); 404 when either is missing."""
    repo, _ = call.repo()
    ref = call.query.get("ref") or repo.default_branch
    path = call.params["filepath"]
    git = GitRepo(repo.path)
    try:
        blob = git.run("cat-file", "blob", f"{ref}:{path}").stdout
    except GitError:
        raise not_found() from None
    return Response(blob, media_type="text/plain; charset=utf-8")


def _status_json(s: Status) -> dict[str, Any]:
    return {
        "id": s.id,
        "status": s.state,
        "target_url": s.target_url,
        "description": s.description,
        "url": "",
        "context": s.context,
        "creator": None,
        "created_at": rfc3339(s.created),
        "updated_at": rfc3339(s.created),
    }


def _statuses(call: Call) -> list[Status]:
    found: list[Status] = call.state.commit_statuses
    return found


def create_status(call: Call) -> Response:
    """NewCommitStatus (POST /statuses/{sha}): a writer; state required."""
    repo, mode = call.repo()
    call.token_user()
    if mode < Access.WRITE:
        raise ApiError(403, "write access required")
    form = call.form()
    state = str(form.get("state") or "")
    if state not in _STATES:
        raise ApiError(422, f"invalid state {state!r}")
    status = Status(
        call.state.next_id("commit_status"),
        repo.id,
        call.params["sha"],
        state,
        str(form.get("context") or "default"),
        str(form.get("description") or ""),
        str(form.get("target_url") or ""),
        call.state.now(),
    )
    _statuses(call).append(status)
    return json_response(_status_json(status), 201)


def combined_status(call: Call) -> Response:
    """GetCombinedCommitStatusByRef: the latest status per context, the worst state."""
    repo, _ = call.repo()
    ref = call.params["ref"]
    sha = GitRepo(repo.path).rev_parse(ref)
    if sha is None:
        raise not_found()
    latest: dict[str, Status] = {}
    for s in _statuses(call):
        if s.repo_id == repo.id and s.sha in (sha, ref):
            latest[s.context] = s
    states = {s.state for s in latest.values()}
    state = next((w for w in _WORST if w in states), "")
    body = {
        "state": state,
        "sha": sha,
        "total_count": len(latest),
        "statuses": [_status_json(s) for s in latest.values()],
        "repository": None,
        "commit_url": "",
        "url": "",
    }
    return json_response(body)


# Ahead of api_issues' routes: "/pulls/{index}.diff" must not match "/pulls/{index}".
ROUTES: list[RouteSpec] = [
    ("GET", "/repos/{owner}/{repo}/pulls/{index}.diff", pull_diff),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}/files", pull_files),
    ("PATCH", "/repos/{owner}/{repo}/pulls/{index}", edit_pull),
    ("GET", "/repos/{owner}/{repo}/raw/{filepath:path}", raw_file),
    ("POST", "/repos/{owner}/{repo}/statuses/{sha}", create_status),
    ("GET", "/repos/{owner}/{repo}/commits/{ref:path}/status", combined_status),
]
