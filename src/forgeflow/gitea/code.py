"""The repository, its branches and files, pull requests and commit statuses, as the
Gitea client asks for them (Gitea's routers/api/v1/repo/repo.go, branch.go, file.go,
pull.go, status.go)."""

from __future__ import annotations

from urllib.parse import quote

from forgeflow.gitea.models import (
    ChangedFile,
    CombinedStatus,
    PullRequest,
    RepoBranch,
    Repository,
)
from forgeflow.gitea.transport import Transport


class CodeApi(Transport):
    async def repository(self, owner: str, repo: str) -> Repository:
        """The repository (clone_url, default_branch, …), per Gitea's GET /repos/{o}/{r}."""
        return await self._one(Repository, "GET", self._repo_path(owner, repo), (200,))

    async def branch_head(self, owner: str, repo: str, branch: str) -> str:
        """The commit ``branch`` points to now (GET /repos/{o}/{r}/branches/{branch})."""
        path = f"{self._repo_path(owner, repo)}/branches/{quote(branch, safe='/')}"
        found = await self._one(RepoBranch, "GET", path, (200,))
        return found.commit.id if found.commit else ""

    async def raw_file(self, owner: str, repo: str, path: str, ref: str, *, limit: int) -> bytes:
        """A file's bytes at ``ref`` (Gitea GetRawFile): at most ``limit``, and one more
        when the file is longer. ``path``: already checked segments
        (agent/gitea_tools/args.py); each is percent-encoded here again."""
        encoded = "/".join(quote(part, safe="") for part in path.split("/"))
        path_ = f"{self._repo_path(owner, repo)}/raw/{encoded}"
        return await self._bytes(path_, {"ref": ref}, limit)

    def _pull_path(self, owner: str, repo: str, index: int) -> str:
        return f"{self._repo_path(owner, repo)}/pulls/{int(index)}"

    async def pull(self, owner: str, repo: str, index: int) -> PullRequest:
        return await self._one(PullRequest, "GET", self._pull_path(owner, repo, index), (200,))

    async def open_pulls(self, owner: str, repo: str, *, limit: int = 50) -> list[PullRequest]:
        path = f"{self._repo_path(owner, repo)}/pulls"
        params = {"state": "open", "limit": str(int(limit))}
        return await self._many(PullRequest, "GET", path, (200,), params=params)

    async def pull_files(
        self, owner: str, repo: str, index: int, *, limit: int
    ) -> list[ChangedFile]:
        path = f"{self._pull_path(owner, repo, index)}/files"
        params = {"limit": str(int(limit))}
        return await self._many(ChangedFile, "GET", path, (200,), params=params)

    async def pull_diff(self, owner: str, repo: str, index: int, *, limit: int) -> bytes:
        """The pull request's diff (Gitea GET /repos/{o}/{r}/pulls/{index}.diff): at
        most ``limit`` bytes, and one more when it is longer."""
        return await self._bytes(f"{self._pull_path(owner, repo, index)}.diff", None, limit)

    async def create_pull(
        self, owner: str, repo: str, *, head: str, base: str, title: str, body: str
    ) -> PullRequest:
        path = f"{self._repo_path(owner, repo)}/pulls"
        body_ = {"head": head, "base": base, "title": title, "body": body}
        return await self._one(PullRequest, "POST", path, (201,), json=body_)

    async def edit_pull(
        self, owner: str, repo: str, index: int, changes: dict[str, str]
    ) -> PullRequest:
        path = self._pull_path(owner, repo, index)
        return await self._one(PullRequest, "PATCH", path, (201,), json=changes)

    async def combined_status(self, owner: str, repo: str, ref: str) -> CombinedStatus:
        """Gitea GetCombinedCommitStatusByRef (GET /repos/{o}/{r}/commits/{ref}/status)."""
        path = f"{self._repo_path(owner, repo)}/commits/{quote(ref, safe='')}/status"
        return await self._one(CombinedStatus, "GET", path, (200,))
