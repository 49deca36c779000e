"""The Workspace Manager: clones, session worktrees, their checks, git, publishing."""
