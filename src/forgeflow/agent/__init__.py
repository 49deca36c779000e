"""The agent side: the runtime port and its Codex app-server adapter."""
