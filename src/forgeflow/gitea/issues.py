"""Issues, their comments and labels, as the Gitea client asks for them (Gitea's
routers/api/v1/repo/issue*.go and label.go)."""

from __future__ import annotations

from datetime import UTC, datetime

from forgeflow.gitea.models import Comment, Issue, Label, Reaction
from forgeflow.gitea.transport import GiteaError, Transport

# Gitea's default page-size ceiling (setting.API.MaxResponseItems) is 50.
_PAGE = 50


class IssuesApi(Transport):
    def _issue_path(self, owner: str, repo: str, index: int) -> str:
        return f"{self._repo_path(owner, repo)}/issues/{int(index)}"

    async def issue(self, owner: str, repo: str, index: int) -> Issue:
        return await self._one(Issue, "GET", self._issue_path(owner, repo, index), (200,))

    async def search_issues(
        self, owner: str, repo: str, *, query: str, state: str, kind: str, page: int, limit: int
    ) -> list[Issue]:
        """Gitea ListIssues with ``q`` (keyword search), ``state`` and ``type``."""
        params = {"state": state, "page": str(int(page)), "limit": str(int(limit))}
        if query:
            params["q"] = query
        if kind != "all":
            params["type"] = kind
        path = f"{self._repo_path(owner, repo)}/issues"
        return await self._many(Issue, "GET", path, (200,), params=params)

    async def list_comments(
        self, owner: str, repo: str, index: int, *, since: datetime | None = None
    ) -> list[Comment]:
        """Comments of an issue or pull request, oldest first (Gitea's order)."""
        params = {}
        if since is not None:
            params["since"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = f"{self._issue_path(owner, repo, index)}/comments"
        return await self._many(Comment, "GET", path, (200,), params=params)

    async def comments_page(
        self, owner: str, repo: str, index: int, *, page: int, limit: int
    ) -> list[Comment]:
        """One page of an issue's comments, oldest first (Gitea ListIssueComments)."""
        path = f"{self._issue_path(owner, repo, index)}/comments"
        params = {"page": str(int(page)), "limit": str(int(limit))}
        return await self._many(Comment, "GET", path, (200,), params=params)

    def _comment_path(self, owner: str, repo: str, comment_id: int) -> str:
        return f"{self._repo_path(owner, repo)}/issues/comments/{int(comment_id)}"

    async def comment(self, owner: str, repo: str, comment_id: int) -> Comment:
        return await self._one(Comment, "GET", self._comment_path(owner, repo, comment_id), (200,))

    async def is_plain_comment(self, owner: str, repo: str, comment_id: int) -> bool:
        """Whether a comment is a plain one of the timeline: Gitea GetIssueComment answers
        204 (no body) for any other type, a code comment of a review among them."""
        answer = await self._request("GET", self._comment_path(owner, repo, comment_id))
        if answer.status_code not in (200, 204):
            raise GiteaError(
                f"GET comment {int(comment_id)}: HTTP {answer.status_code}", answer.status_code
            )
        return answer.status_code == 200

    async def create_comment(self, owner: str, repo: str, index: int, body: str) -> Comment:
        path = f"{self._issue_path(owner, repo, index)}/comments"
        return await self._one(Comment, "POST", path, (201,), json={"body": body})

    async def edit_comment(self, owner: str, repo: str, comment_id: int, body: str) -> Comment:
        path = self._comment_path(owner, repo, comment_id)
        return await self._one(Comment, "PATCH", path, (200,), json={"body": body})

    async def react(
        self, owner: str, repo: str, content: str, *, comment_id: int | None, index: int
    ) -> Reaction:
        """Add the bot's reaction to a comment, or (``comment_id`` None) to the issue's
        own body. Gitea answers 201 for a new reaction and 200 with the existing one
        (routers/api/v1/repo/issue_reaction.go), so a retry is harmless; 403 when the
        instance's setting.UI.Reactions does not list ``content``."""
        if comment_id is None:
            path = f"{self._issue_path(owner, repo, index)}/reactions"
        else:
            path = f"{self._comment_path(owner, repo, comment_id)}/reactions"
        return await self._one(Reaction, "POST", path, (200, 201), json={"content": content})

    async def labels(self, owner: str, repo: str) -> list[Label]:
        """The repository's labels (GET /repos/{o}/{r}/labels, every page)."""
        found: list[Label] = []
        for page in range(1, 51):  # 2,500 labels: more than any repository has
            params = {"page": str(page), "limit": str(_PAGE)}
            path = f"{self._repo_path(owner, repo)}/labels"
            batch = await self._many(Label, "GET", path, (200,), params=params)
            found += batch
            if len(batch) < _PAGE:
                break
        return found

    async def create_label(
        self, owner: str, repo: str, name: str, *, color: str, description: str
    ) -> Label:
        """Gitea CreateLabel (POST /repos/{o}/{r}/labels, CreateLabelOption)."""
        body = {"name": name, "color": color, "description": description}
        path = f"{self._repo_path(owner, repo)}/labels"
        return await self._one(Label, "POST", path, (201,), json=body)

    async def add_labels(self, owner: str, repo: str, index: int, labels: list[str]) -> list[Label]:
        """Add labels by name to an issue or pull request (Gitea AddIssueLabels accepts
        names since 1.19); returns the issue's labels."""
        path = f"{self._issue_path(owner, repo, index)}/labels"
        return await self._many(Label, "POST", path, (200,), json={"labels": labels})

    async def remove_label(self, owner: str, repo: str, index: int, label_id: int) -> None:
        path = f"{self._issue_path(owner, repo, index)}/labels/{int(label_id)}"
        await self._no_content("DELETE", path, (204,))
