"""The jail's egress policy (``FORGEFLOW_AGENT_NETWORK=proxy``): which host, port and
resolved address the agent's proxy may connect to. Pure: the proxy resolves, this
decides.

A host is reachable when the operator's allow-list names it (exactly, ``*.suffix`` for
its subdomains, or ``*`` for any host) on an allowed port, and every address it resolves
to is public. A loopback, private, link-local, CGNAT, multicast, reserved, unspecified
or metadata address is refused unless the operator listed that exact host (an internal
package mirror): a wildcard never opens them, so a public name that resolves to
127.0.0.1 (DNS rebinding, a hostile zone) reaches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The common package registries: enough for pip, npm, apt (Debian), Go and Cargo.
# Not github.com: it serves anyone's content and takes pushes, so it is the operator's
# choice per repository (docs/security.md "Network").
DEFAULT_ALLOW = (
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "deb.debian.org",
    "security.debian.org",
    "proxy.golang.org",
    "sum.golang.org",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
)
DEFAULT_PORTS = (80, 443)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._:")


class PolicyError(ValueError):
    """A setting of the egress policy that cannot be read; the message names it."""


def normalise_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def embedded_v4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to a v4 host (mapped, 6to4, NAT64)."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def is_public(addr: IPAddress) -> bool:
    """Whether ``addr`` is an ordinary Internet address: not loopback, private (RFC 1918,
    ULA), link-local (the metadata address), CGNAT, multicast, reserved, unspecified or
    documentation, and carries no such IPv4 address inside an IPv6 one."""
    inner = embedded_v4(addr)
    if inner is not None and not is_public(inner):
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local:
        return False
    return bool(
        addr.is_global
        and not addr.is_multicast
        and not addr.is_reserved
        and not addr.is_unspecified
        and not addr.is_loopback
        and not addr.is_link_local
    )


def _valid_pattern(pattern: str) -> bool:
    body = pattern[2:] if pattern.startswith("*.") else pattern
    return pattern == "*" or (bool(body) and set(body) <= _HOST_CHARS and "*" not in body)


def parse_hosts(text: str | Iterable[str], what: str) -> tuple[str, ...]:
    """A comma list (or list) of host patterns: ``host``, ``*.suffix`` or ``*``."""
    items = text.split(",") if isinstance(text, str) else list(text)
    patterns = tuple(normalise_host(i) for i in items if i.strip())
    for pattern in patterns:
        if not _valid_pattern(pattern):
            raise PolicyError(f"{what}: {pattern!r} is not a host, *.suffix or *")
    return patterns


def parse_ports(text: str, what: str) -> tuple[int, ...]:
    try:
        ports = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise PolicyError(f"{what}: {text!r} is not a comma list of ports") from None
    if any(not 0 < p < 65536 for p in ports):
        raise PolicyError(f"{what}: ports are 1 to 65535")
    return ports


def parse_pins(text: str, what: str) -> dict[str, IPAddress]:
    """``name=address`` pairs: the proxy connects ``name`` there without asking DNS."""
    pins: dict[str, IPAddress] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("=")
        try:
            pins[normalise_host(name)] = ipaddress.ip_address(normalise_host(address))
        except ValueError:
            sep = ""
        if not sep or not _valid_pattern(normalise_host(name)) or "*" in name:
            raise PolicyError(f"{what}: {item!r} is not name=address")
    return pins


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str  # why not, for the agent's 403 and the record
    address: IPAddress | None = None  # the checked address to connect to


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    allow: tuple[str, ...] = DEFAULT_ALLOW
    ports: tuple[int, ...] = DEFAULT_PORTS
    pins: Mapping[str, IPAddress] = field(default_factory=dict)
    per_repository: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def for_repository(self, repo_key: str) -> EgressPolicy:
        """The policy of one repository's jail: the global list plus its additions."""
        extra = self.per_repository.get(repo_key.lower(), ())
        return EgressPolicy(self.allow + extra, self.ports, self.pins, {})

    def listed(self, host: str) -> tuple[bool, bool]:
        """(allowed by a pattern, named exactly)."""
        host = normalise_host(host)
        exact = host in self.allow
        for pattern in self.allow:
            if pattern == "*" or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return True, exact
        return exact, exact

    def check_name(self, host: str, port: int) -> Decision:
        """Before resolving: the host is listed and the port allowed."""
        if port not in self.ports:
            return Decision(False, f"port {port} is not allowed")
        if not self.listed(host)[0]:
            return Decision(False, "host is not on the allow-list")
        return Decision(True, "")

    def check_addresses(self, host: str, addresses: Iterable[IPAddress]) -> Decision:
        """After resolving: every address must be public unless the host is listed
        exactly; the first one is the one to connect to (and nothing else)."""
        found = list(addresses)
        if not found:
            return Decision(False, "host did not resolve")
        if not self.listed(host)[1]:
            for addr in found:
                if not is_public(addr):
                    return Decision(False, f"resolves to a non-public address ({addr})")
        return Decision(True, "", found[0])
