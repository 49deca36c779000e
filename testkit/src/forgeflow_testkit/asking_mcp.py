"""A real stdio MCP server that asks its client before it comments (MCP elicitation).

It offers ``comment_after_asking`` (the PyPI gitea-mcp's ``add_comment`` under a name
forgeflow's own tools do not take), posting to the Gitea API at
``GITEA_URL`` with ``GITEA_TOKEN``, but first sends ``elicitation/create`` to its client:
Codex forwards that to forgeflow as ``mcpServer/elicitation/request``, so tests can see
forgeflow answer it per ``FORGEFLOW_ELICITATION_POLICY``. Run: ``python -m
forgeflow_testkit.asking_mcp``.
"""

from __future__ import annotations

import os

import httpx
from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel

server = FastMCP("asking-gitea")


class Confirm(BaseModel):
    confirm: bool = True


@server.tool()
async def comment_after_asking(
    owner: str,
    repo: str,
    issue_number: int,
    body: str,
    ctx: Context,  # type: ignore[type-arg]
) -> str:
    """Add a comment to an issue or pull request, after the client agrees."""
    answer = await ctx.elicit(f"Post a comment on {owner}/{repo}#{issue_number}?", Confirm)
    if answer.action != "accept":
        return f"not posted: the client answered {answer.action}"
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(
            f"{os.environ['GITEA_URL']}/api/v1/repos/{owner}/{repo}/issues/{issue_number}/comments",
            headers={"Authorization": f"token {os.environ['GITEA_TOKEN']}"},
            json={"body": body},
        )
    return r.text


if __name__ == "__main__":
    server.run("stdio")
