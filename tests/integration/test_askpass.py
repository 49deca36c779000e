"""The askpass script answers git only for the allowed Gitea URL, whatever asks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from forgeflow.workspace.git import ALLOWED_VAR, PASSWORD_VAR, USERNAME_VAR, GitRunner


def ask(script: str, prompt: str, allowed: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], ALLOWED_VAR: allowed, USERNAME_VAR: "forgeflow",
           PASSWORD_VAR: "the-bot-token"}  # fmt: skip
    return subprocess.run([script, prompt], env=env, capture_output=True, text=True, check=False)


def test_the_token_goes_only_under_the_configured_gitea_url(tmp_path: Path) -> None:
    runner = GitRunner(root=str(tmp_path), token="the-bot-token", gitea_url="http://gitea:3000/git")
    allowed = runner.allowed_prefix("http://elsewhere:1/x.git")
    assert allowed == "http://gitea:3000/git/"
    script = runner.askpass_path()
    good = "http://forgeflow@gitea:3000/git/acme/widget.git"
    assert ask(script, f"Password for '{good}': ", allowed).stdout == "the-bot-token\n"
    assert ask(script, "Username for 'http://gitea:3000/git/a/b.git': ", allowed).stdout == (
        "forgeflow\n"
    )
    for other in (
        "http://forgeflow@127.0.0.1:9/acme/widget.git",  # a rewritten URL (insteadOf)
        "http://forgeflow@gitea:30000/git/acme/widget.git",  # another port
        "http://forgeflow@gitea:3000/gitx/acme.git",  # another path prefix
        "https://forgeflow@gitea:3000/git/acme.git",  # another scheme
        "http://gitea:3000@evil/git/a.git",
    ):
        done = ask(script, f"Password for '{other}': ", allowed)
        assert done.returncode != 0 and done.stdout == "", other
