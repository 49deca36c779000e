"""forgeflow's own Gitea tools for the agent (an MCP server built with the ``mcp`` SDK,
served by the broker) and the opt-in external Gitea MCP server behind the same scope
rules. See ``server.py``; the tools are described for people in docs/tools.md."""

from forgeflow.agent.gitea_tools.handlers import Comments, Posted, Publish
from forgeflow.agent.gitea_tools.server import TOOLS, GiteaTools, Refused

__all__ = ["TOOLS", "Comments", "GiteaTools", "Posted", "Publish", "Refused"]
