"""The shape of an acceptance test's world: a Gitea emulator and a forgeflow on it."""

from __future__ import annotations

from dataclasses import dataclass

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import Running

BOT = "ccweb-bot"


@dataclass
class World:
    gitea: GiteaEmulator
    ff: Running
    bot_token: str
    issue: int
    pull: int
