"""The egress of the Codex runtime's jails (``FORGEFLOW_AGENT_NETWORK=proxy``): one
:class:`~forgeflow.agent.proxy.EgressProxy` per app-server's jail, each on its own Unix
socket so that what it refuses is known to be that jail's, and the refusals of each
turn in flight, kept until the turn ends (one ``egress.blocked`` notice per turn).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import structlog

from forgeflow.agent.appserver import pgid_file
from forgeflow.agent.proxy import Blocks, EgressProxy
from forgeflow.domain.egress import EgressPolicy

log = structlog.get_logger("forgeflow.codex")

OpenTurns = Callable[[str], Iterable[str]]  # app-server key -> ids of its turns in flight


class JailEgress:
    def __init__(
        self, policy: EgressPolicy, sockets: Path, *, enabled: bool, open_turns: OpenTurns
    ) -> None:
        """``sockets``: the runtime's short private folder (a Unix socket's path is
        limited to 107 bytes); ``enabled``: jailed with the proxy as the network."""
        self._policy = policy
        self._sockets = sockets
        self._enabled = enabled
        self._open_turns = open_turns
        self._proxies: dict[str, EgressProxy] = {}
        self._blocked: dict[str, Blocks] = {}  # turn id -> its refused requests

    def socket(self, key: str) -> Path | None:
        """The socket of the app-server ``key``'s proxy; None without one."""
        if not self._enabled:
            return None
        return pgid_file(self._sockets, key).with_suffix(".egress.sock")

    async def start(self, key: str, repo_key: str) -> None:
        """The proxy of the app-server ``key`` of the repository ``repo_key``, once."""
        path = self.socket(key)
        if path is None or key in self._proxies:
            return
        policy = self._policy.for_repository(repo_key)
        proxy = EgressProxy(policy, path, partial(self._refused, key))
        await proxy.start()
        self._proxies[key] = proxy

    async def stop(self, key: str) -> None:
        proxy = self._proxies.pop(key, None)
        if proxy is not None:
            await proxy.aclose()

    def take(self, turn_id: str) -> Blocks | None:
        """What was refused during the turn, once: the turn is ending."""
        return self._blocked.pop(turn_id, None)

    def _refused(self, key: str, host: str, port: int, reason: str) -> None:
        log.warning("egress.blocked", repo=key, host=host[:253], port=port, reason=reason)
        for turn_id in self._open_turns(key):
            self._blocked.setdefault(turn_id, Blocks()).add(host, port, reason)
