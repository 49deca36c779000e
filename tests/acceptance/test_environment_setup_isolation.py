"""The setup run holds nothing of the agent's (issue #26), with the real ``codex
app-server`` and bubblewrap, a scripted model running the agent's commands:

- the agent plants what a setup would run with the secrets: dotfiles in its home
  (``~/.profile``, ``~/.bashrc``, ``~/.npmrc``'s ``script-shell``, ``~/.gitconfig``,
  ``~/.config/pip/pip.conf``), a Makefile and a package manifest of its own committed in
  its clone, a ``core.fsmonitor`` in the clone's ``.git/config``, each dumping the
  environment into its home and the environment folder. After a secret change the
  setup runs Gitea's tree with a home of its own: none of it ran, and the next turn
  finds no secret anywhere it can read;
- what the setup writes to ``$FORGEFLOW_ENV_DIR`` is the next turn's to read and run,
  not to change, and the setup's home is not in the turn's jail at all; once the
  operator takes the setup script out of the environment, the folder is emptied.
"""

from __future__ import annotations

from pathlib import Path

from forgeflow.domain.ids import RepoRef
from forgeflow.domain.paths import environment_dir
from tests.acceptance.test_environment_attacks import REPO, set_secret, setup_log
from tests.support.agentic import Agentic
from tests.support.turns import shell_turn

FIRST = "first-isolated-s3cr3t-0b71c4"
SECOND = "second-isolated-s3cr3t-9e23fa"

GITEA_SETUP = """
echo "secret-length:${#SETUP_TOKEN}"
test -e .git && echo cwd-has-git || echo cwd-no-git
bash -lc 'echo login-shell-ran' </dev/null
bash -ic 'echo interactive-shell-ran' </dev/null 2>/dev/null
make -s
npm install --no-audit --no-fund --no-package-lock --offline --foreground-scripts \
  --no-update-notifier 2>&1 | grep 'npm:'
git config --global --get user.name || echo no-agent-gitconfig
pip3 config list 2>/dev/null | grep -c agent.invalid | sed 's/^/pip-agent-lines:/'
echo from-setup > "$FORGEFLOW_ENV_DIR/result"
"""
GITEA_TREE = {
    "ci/env-setup.sh": GITEA_SETUP,
    "Makefile": "all:\n\t@echo make:gitea\n",
    "package.json": '{"name": "widget", "version": "1.0.0",'
    ' "scripts": {"preinstall": "echo npm:gitea"}}\n',
}

# The agent's turn: each planted thing runs steal.sh, which writes the environment it
# was given where a turn reads (its home; the environment folder, when it can).
PLANT = r"""
clone=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
cat > "$HOME/steal.sh" <<'EOF'
env > "$HOME/stolen-$1" 2>/dev/null
[ -n "$FORGEFLOW_ENV_DIR" ] && env > "$FORGEFLOW_ENV_DIR/stolen-$1" 2>/dev/null
echo "stolen-by:$1"
EOF
printf '#!/bin/sh\nsh /home/agent/steal.sh npm\nexec /bin/sh "$@"\n' > "$HOME/npm-shell.sh"
printf '#!/bin/sh\nsh /home/agent/steal.sh fsmonitor >&2\nexit 1\n' > "$HOME/fsmonitor.sh"
chmod +x "$HOME/npm-shell.sh" "$HOME/fsmonitor.sh"
echo 'sh /home/agent/steal.sh profile' >> "$HOME/.profile"
echo 'sh /home/agent/steal.sh bashrc' >> "$HOME/.bashrc"
echo 'script-shell=/home/agent/npm-shell.sh' > "$HOME/.npmrc"
printf '[user]\n\tname = agent-planted\n' > "$HOME/.gitconfig"
mkdir -p "$HOME/.config/pip"
printf '[global]\nindex-url = http://agent.invalid/simple\n' > "$HOME/.config/pip/pip.conf"
printf 'all:\n\t@sh /home/agent/steal.sh make\n' > "$clone/Makefile"
printf '{"name": "widget", "version": "1.0.0", "scripts":
  {"preinstall": "sh /home/agent/steal.sh manifest"}}\n' > "$clone/package.json"
git -C "$clone" commit -qam "a build of my own" && echo planted
git -C "$clone" config core.fsmonitor /home/agent/fsmonitor.sh
"""

LOOK = r"""
clone=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
echo "env-dir:$FORGEFLOW_ENV_DIR"
cat "$FORGEFLOW_ENV_DIR/result"
cat "$HOME"/stolen-* "$FORGEFLOW_ENV_DIR"/stolen-* 2>/dev/null | grep SETUP_TOKEN \
  | sed 's/^/stolen:/'
grep -rl --exclude-dir=sessions s3cr3t "$HOME" "$FORGEFLOW_ENV_DIR" "$clone" /tmp \
  2>/dev/null | sed 's/^/found:/'
echo looked
"""


def declare_setup(agentic: Agentic) -> None:
    with agentic.ff.admin() as admin:
        body = {"requestId": "env-1", "environment": {"setupScript": "ci/env-setup.sh"}}
        assert admin.put(REPO, json=body).status_code == 200


def test_what_the_agent_plants_never_runs_with_the_setup_secrets(agentic: Agentic) -> None:
    agentic.gitea.push_branch("acme", "widget", "main", GITEA_TREE)
    set_secret(agentic, FIRST, 1)
    declare_setup(agentic)
    first = shell_turn(agentic, PLANT)
    assert "planted" in first.output, first.output
    set_secret(agentic, SECOND, 2)  # the setup runs again before the next turn
    second = shell_turn(agentic, LOOK)
    assert "env-dir:/opt/forgeflow/env" in second.output and "from-setup" in second.output
    assert "looked" in second.output, second.output
    assert "stolen:" not in second.output and "found:" not in second.output, second.output
    assert FIRST not in second.output and SECOND not in second.output
    log = setup_log(agentic)
    assert f"secret-length:{len(SECOND)}" in log, log  # the second run's log
    assert "stolen-by:" not in log, log
    for ran in ("cwd-no-git", "login-shell-ran", "make:gitea", "npm:gitea",
                "no-agent-gitconfig", "pip-agent-lines:0"):  # fmt: skip
        assert ran in log, (ran, log)


WRITE_ENV = r"""
echo "env-dir:$FORGEFLOW_ENV_DIR"
cat "$FORGEFLOW_ENV_DIR/result"
"$FORGEFLOW_ENV_DIR/bin/tool"
echo planted > "$FORGEFLOW_ENV_DIR/result" 2>/dev/null && echo wrote:result
touch "$FORGEFLOW_ENV_DIR/new" 2>/dev/null && echo wrote:new
mkdir "$FORGEFLOW_ENV_DIR/dir" 2>/dev/null && echo wrote:mkdir
unlink "$FORGEFLOW_ENV_DIR/bin/tool" 2>/dev/null
test -e "$FORGEFLOW_ENV_DIR/bin/tool" || echo wrote:removed
mount -o remount,rw "$FORGEFLOW_ENV_DIR" 2>/dev/null && echo wrote:remount
find / -path /proc -prune -o -name setup-home-marker -print 2>/dev/null | sed 's/^/seen:/'
echo tried
"""
TOOL_SETUP = """
echo from-setup > "$FORGEFLOW_ENV_DIR/result"
mkdir -p "$FORGEFLOW_ENV_DIR/bin"
printf '#!/bin/sh\\necho tool-from-setup\\n' > "$FORGEFLOW_ENV_DIR/bin/tool"
chmod +x "$FORGEFLOW_ENV_DIR/bin/tool"
echo kept > "$HOME/setup-home-marker"
"""


def test_the_setup_s_folder_is_read_only_to_the_next_turn(agentic: Agentic) -> None:
    agentic.gitea.push_branch("acme", "widget", "main", {"ci/env-setup.sh": TOOL_SETUP})
    declare_setup(agentic)
    turn = shell_turn(agentic, WRITE_ENV)
    out = turn.output
    assert "env-dir:/opt/forgeflow/env" in out and "from-setup" in out, out
    assert "tool-from-setup" in out and "tried" in out, out
    assert "wrote:" not in out and "seen:" not in out, out
    root = str(agentic.ff.settings.resolved_workspace_root)
    folder = Path(environment_dir(root, RepoRef("acme", "widget")))
    assert (folder / "result").read_text() == "from-setup\n"
    assert sorted(p.name for p in folder.iterdir()) == ["bin", "result"]
    assert (folder / "bin" / "tool").is_file()
    # The setup script taken out of the environment: what it left goes with it.
    with agentic.ff.admin() as admin:
        body = {"requestId": "env-2", "environment": {"variables": {"STYLE": "plain"}}}
        assert admin.put(REPO, json=body).status_code == 200
    after = shell_turn(agentic, 'echo "entries:$(ls -A "$FORGEFLOW_ENV_DIR" | wc -l)"')
    assert "entries:0" in after.output, after.output
    assert list(folder.iterdir()) == []
