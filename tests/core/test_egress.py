"""The egress policy: which addresses an outbound call may reach (core.egress)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from core.egress import EgressPolicy, legacy_ipv4
from core.errors import ConfigError

REFUSED = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fd00:ec2::254": "private",  # AWS's IPv6 metadata service
    "169.254.169.254": "link-local",  # cloud metadata services
    "fe80::1": "link-local",
    "100.64.0.1": "carrier-grade NAT",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "192.0.2.1": "private",  # documentation (TEST-NET-1)
    "198.18.0.1": "private",  # benchmarking
    "255.255.255.255": "private",
    "::ffff:127.0.0.1": "loopback",  # IPv4-mapped: judged by the IPv4 address
    "64:ff9b::a00:1": "private",  # NAT64 of 10.0.0.1
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
}


@pytest.mark.parametrize(("address", "kind"), REFUSED.items())
def test_addresses_that_are_not_globally_reachable_are_refused(address: str, kind: str) -> None:
    reason = EgressPolicy().refusal(address)
    assert reason is not None and kind in reason
    assert reason.startswith(str(ipaddress.ip_address(address)))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "64:ff9b::808:808"])
def test_globally_reachable_addresses_are_allowed(address: str) -> None:
    assert EgressPolicy().refusal(address) is None


def test_an_allowed_network_wins_over_the_rules() -> None:
    policy = EgressPolicy.parse("10.1.0.0/16, 127.0.0.2")
    assert policy.refusal("10.1.200.3") is None and policy.refusal("127.0.0.2") is None
    assert policy.refusal("::ffff:10.1.0.1") is None  # the same IPv4 address, mapped
    assert policy.refusal("10.2.0.1") is not None and policy.refusal("127.0.0.1") is not None


def test_a_network_list_may_be_empty_or_a_sequence() -> None:
    assert EgressPolicy.parse("").allowed == () and EgressPolicy.parse(" , ").allowed == ()
    assert EgressPolicy.parse(["10.0.0.0/8"]) == EgressPolicy.parse("10.0.0.0/8")


def test_a_bad_network_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=re.escape("'10.0.0.0/33'")):
        EgressPolicy.parse("10.0.0.0/33")


def test_what_is_not_an_address_is_refused() -> None:
    assert EgressPolicy().refusal("example.com") == "'example.com' is not an IP address"


@pytest.mark.parametrize(
    ("host", "legacy"),
    [
        ("2130706433", True),
        ("0177.0.0.1", True),
        ("0x7f000001", True),
        ("127.1", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("example.com", False),
        ("1e100.net", False),
    ],
)
def test_legacy_ipv4_forms_are_recognised(host: str, legacy: bool) -> None:
    assert legacy_ipv4(host) is legacy
