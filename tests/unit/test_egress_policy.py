"""The egress policy's address classifier and allow-list (domain/egress.py)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forgeflow.domain.egress import (
    EgressPolicy,
    PolicyError,
    is_public,
    parse_hosts,
    parse_pins,
    parse_ports,
)

REFUSED = [
    "127.0.0.1",
    "127.255.255.254",
    "0.0.0.0",  # noqa: S104 - the address under test
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "224.0.0.251",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "::1",
    "::",
    "fd00:ec2::254",  # the metadata address over IPv6
    "fc00::1",
    "fe80::1",
    "fec0::1",  # site-local
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",
    "2001:db8::1",
]
PUBLIC = ["151.101.0.223", "8.8.8.8", "2a04:4e42::223", "2002:808:808::"]


@pytest.mark.parametrize("text", REFUSED)
def test_non_public_addresses_are_refused(text: str) -> None:
    assert not is_public(ipaddress.ip_address(text))


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses_pass(text: str) -> None:
    assert is_public(ipaddress.ip_address(text))


PRIVATE_NETS = [
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "224.0.0.0/4",
        "0.0.0.0/8",
    )
]


@given(st.sampled_from(PRIVATE_NETS), st.integers(min_value=0, max_value=2**32 - 1))
def test_every_address_of_a_private_range_is_refused_in_every_form(
    net: ipaddress.IPv4Network, n: int
) -> None:
    addr = net[n % net.num_addresses]
    mapped = ipaddress.IPv6Address(f"::ffff:{addr}")
    sixtofour = ipaddress.IPv6Address((0x2002 << 112) | (int(addr) << 80))
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(addr))
    for form in (addr, mapped, sixtofour, nat64):
        assert not is_public(form), form


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_ula_and_link_local_v6_are_refused(n: int) -> None:
    for prefix, bits in (("fc00::", 7), ("fe80::", 10)):
        net = ipaddress.IPv6Network(f"{prefix}/{bits}")
        assert not is_public(net[n % net.num_addresses])


def test_the_allow_list_matches_exact_names_and_subdomains_of_a_wildcard() -> None:
    policy = EgressPolicy(parse_hosts("pypi.org,*.example.com", "t"), (443,))
    assert policy.check_name("PyPI.org.", 443).allowed
    assert policy.check_name("a.b.example.com", 443).allowed
    assert not policy.check_name("example.com", 443).allowed  # only its subdomains
    assert not policy.check_name("evilpypi.org", 443).allowed
    assert not policy.check_name("pypi.org.evil.net", 443).allowed
    assert not policy.check_name("pypi.org", 22).allowed
    assert policy.check_name("pypi.org", 22).reason == "port 22 is not allowed"


def test_a_wildcard_never_opens_a_private_address_an_exact_listing_does() -> None:
    loop = [ipaddress.ip_address("127.0.0.1")]
    wild = EgressPolicy(("*",), (80,))
    assert wild.check_name("localhost", 80).allowed
    refused = wild.check_addresses("localhost", loop)
    assert not refused.allowed and "non-public" in refused.reason
    exact = EgressPolicy(("mirror.internal",), (80,))
    assert exact.check_addresses("mirror.internal", loop).address == loop[0]


def test_one_private_answer_among_public_ones_refuses_the_host() -> None:
    mixed = [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("10.0.0.1")]
    assert not EgressPolicy(("*",)).check_addresses("x.example", mixed).allowed
    assert not EgressPolicy(("*",)).check_addresses("x.example", []).allowed


def test_a_repositorys_additions_apply_to_its_jail_only() -> None:
    policy = EgressPolicy(("pypi.org",), (443,), {}, {"acme/widget": ("github.com",)})
    assert policy.for_repository("Acme/Widget").check_name("github.com", 443).allowed
    assert not policy.for_repository("acme/other").check_name("github.com", 443).allowed
    assert not policy.check_name("github.com", 443).allowed


@pytest.mark.parametrize("bad", ["exa mple.com", "*evil.com", "a.*.com", "**", "http://x"])
def test_a_bad_pattern_is_named(bad: str) -> None:
    with pytest.raises(PolicyError, match="is not a host"):
        parse_hosts(bad, "FORGEFLOW_EGRESS_ALLOW")


def test_ports_and_pins_are_read_or_named() -> None:
    assert parse_ports("80, 443,8080", "p") == (80, 443, 8080)
    with pytest.raises(PolicyError, match="1 to 65535"):
        parse_ports("0", "p")
    with pytest.raises(PolicyError, match="not a comma list"):
        parse_ports("http", "p")
    assert parse_pins("mirror.test=127.0.0.1, v6.test=[::1]", "r") == {
        "mirror.test": ipaddress.ip_address("127.0.0.1"),
        "v6.test": ipaddress.ip_address("::1"),
    }
    for bad in ("mirror.test", "mirror.test=nowhere", "*.test=127.0.0.1"):
        with pytest.raises(PolicyError, match="is not name=address"):
            parse_pins(bad, "r")
