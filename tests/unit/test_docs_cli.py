"""The ``forgeflow`` command line against README.md and docs/: every sub-command and
option of the typer app is written in a command line of the docs (``forgeflow gitea
connect acme --dry-run``, a code span or a shell block), and every command line the docs
write names a sub-command and options that exist. The app is read with
``typer.main.get_command``, the click command typer runs."""

from __future__ import annotations

import re
from typing import Any

import typer.main

from forgeflow.cli import app
from tests.support import docs

# The option README.md documents once for every command but ``version``.
SHARED = "--config"
# Words after "forgeflow " in the docs' code that are not a command line: a quoted
# error of the crash harness (docs/CHAOS.md).
NOT_COMMANDS = {"exited"}
SERVICE = docs.ROOT / "deploy" / "forgeflow.service"


def _commands() -> dict[tuple[str, ...], set[str]]:
    """Each leaf command by its path, with its options' long names."""
    found: dict[tuple[str, ...], set[str]] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs is not None:
            for name, sub in subs.items():
                walk(sub, (*path, name))
            return
        found[path] = {
            name
            for param in command.params
            if param.param_type_name == "option"
            for name in param.opts
            if name.startswith("--")
        }

    walk(typer.main.get_command(app), ())
    return found


def _groups(commands: dict[tuple[str, ...], set[str]]) -> set[tuple[str, ...]]:
    return {path[:i] for path in commands for i in range(len(path))}


def _split(words: list[str]) -> list[list[str]]:
    """``pipelines list | show KEY`` is two command lines, ``pipelines list`` and
    ``pipelines show KEY``; ``OWNER/REPO | ORG`` stays one (ORG is no sub-command)."""
    commands = _commands()
    lines = [words[:]]
    while "|" in lines[-1]:
        line = lines[-1]
        at = line.index("|")
        path = _path(line[:at], commands)
        after = line[at + 1 :]
        if path and after and (*path[:-1], after[0]) in commands:
            lines[-1] = line[:at]
            lines.append([*path[:-1], *after])
        else:
            lines[-1] = line[:at] + line[at + 1 :]
    return lines


def _path(words: list[str], commands: dict[tuple[str, ...], set[str]]) -> tuple[str, ...]:
    """The longest run of leading words that names a group or a command."""
    known = set(commands) | _groups(commands)
    path: tuple[str, ...] = ()
    for word in words:
        if (*path, word) not in known:
            break
        path = (*path, word)
    return path


def _options(words: list[str]) -> set[str]:
    """``[--role all|ingress|worker]`` names ``--role``; ``--input=x`` ``--input``."""
    return {
        re.sub(r"=.*", "", word.strip("[](),."))
        for word in words
        if word.lstrip("[(").startswith("--")
    }


def _documented() -> list[tuple[str, tuple[str, ...], set[str]]]:
    """(file, command path, options) of every command line in the docs."""
    commands = _commands()
    found = []
    texts = {p.name: p.read_text(encoding="utf-8") for p in docs.doc_files()}
    # The systemd unit's ExecStart is a command line as well (its comments are prose).
    unit = SERVICE.read_text(encoding="utf-8").splitlines()
    starts = [line for line in unit if line.startswith("ExecStart")]
    assert starts, "the unit starts nothing"
    texts[SERVICE.name] = "```\n" + "\n".join(starts) + "\n```"
    for name, text in texts.items():
        for words in docs.command_lines(text):
            if words[0] in NOT_COMMANDS:
                continue
            for line in _split(words):
                found.append((name, _path(line, commands), _options(line)))
    return found


def test_every_command_and_option_is_documented() -> None:
    documented: dict[tuple[str, ...], set[str]] = {}
    for _name, path, options in _documented():
        documented.setdefault(path, set()).update(options)
    missing = []
    for path, options in _commands().items():
        if path not in documented:
            missing.append(f"forgeflow {' '.join(path)}")
        for option in sorted(options - documented.get(path, set()) - {SHARED}):
            missing.append(f"forgeflow {' '.join(path)} {option}")
    assert not missing, "not in any command line of the docs:\n" + "\n".join(missing)


def test_every_documented_command_line_exists() -> None:
    commands = _commands()
    wrong = []
    for name, path, options in _documented():
        if path not in commands:
            wrong.append(f"{name}: forgeflow {' '.join(path) or '?'} is not a command")
        elif unknown := options - commands[path]:
            wrong.append(f"{name}: forgeflow {' '.join(path)} has no {sorted(unknown)}")
    assert not wrong, "\n".join(wrong)


def test_the_shared_option_is_everywhere_readme_says() -> None:
    assert "Every command but `version` takes `--config FILE`" in docs.read("README.md")
    for path, options in _commands().items():
        assert (SHARED in options) == (path != ("version",)), path


def test_the_reader_splits_alternatives() -> None:
    words = ["pipelines", "list", "|", "show", "KEY", "|", "run", "KEY", "--input", "a=b"]
    assert _split(words) == [
        ["pipelines", "list"],
        ["pipelines", "show", "KEY"],
        ["pipelines", "run", "KEY", "--input", "a=b"],
    ]
    assert _split(["gitea", "connect", "OWNER/REPO", "|", "ORG"]) == [
        ["gitea", "connect", "OWNER/REPO", "ORG"]
    ]
