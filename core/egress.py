"""Which network addresses a task may connect to: the server-side request forgery (SSRF) guard.

A scheduler that calls URLs on behalf of its users must not become their way into the
deployment's own network. By default only *globally reachable* addresses are allowed (the IANA
special-purpose address registries, RFC 6890, as Python's :mod:`ipaddress` ``is_global`` knows
them): loopback (127.0.0.0/8, ::1), private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local
(169.254/16 — where cloud metadata services answer, 169.254.169.254 — and fe80::/10), carrier-grade
NAT (100.64/10), unspecified, reserved, documentation and benchmark ranges are refused, and so is
multicast. An IPv6 address that embeds an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96``) is judged by the IPv4 address it reaches.

A deployment that must call internal targets lists them in an allowlist of networks (setting
``http_allowed_networks``); an allowed network wins over every rule above. The rule is applied to
the addresses a host name *resolves to*, at connection time, on every redirect — never to the
name — so that neither a DNS name pointing inside nor a redirect can get around it (OWASP SSRF
Prevention Cheat Sheet).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from core.errors import ConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The addresses tasks may connect to: the globally reachable ones, and ``allowed``.

    Attributes:
        allowed: networks allowed even though they are not globally reachable (internal targets
            a deployment trusts its users with).
    """

    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, networks: str | Iterable[str]) -> EgressPolicy:
        """A policy from CIDR networks (``"10.1.0.0/16,127.0.0.1/32"`` or a list; a bare address
        is a /32 or /128).

        Raises:
            ConfigError: a network that is not one (named in the message).
        """
        items = networks.split(",") if isinstance(networks, str) else list(networks)
        allowed: list[IPNetwork] = []
        for item in (i.strip() for i in items):
            if not item:
                continue
            try:
                allowed.append(ipaddress.ip_network(item, strict=False))
            except ValueError as e:
                raise ConfigError(f"allowed network {item!r} is not a CIDR network: {e}") from None
        return cls(tuple(allowed))

    def refusal(self, address: str | IPAddress) -> str | None:
        """Why connecting to ``address`` is refused; None when it is allowed.

        ``address`` is an IP address (a string is parsed; one that is not an address is refused).
        """
        try:
            ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        except ValueError:
            return f"{address!r} is not an IP address"
        if any(ip in net for net in self.allowed):
            return None
        target = _embedded_ipv4(ip) or ip
        if target is not ip and any(target in net for net in self.allowed):
            return None
        shown = f"{ip} ({target})" if target is not ip else str(ip)
        if target.is_multicast:
            return f"{shown} is a multicast address"
        if not target.is_global:
            return f"{shown} is not a globally reachable address ({_kind(target)})"
        return None


def legacy_ipv4(host: str) -> bool:
    """Whether ``host`` is an IPv4 address only in a form other than dotted decimal
    (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``): a classic way past address filters,
    which aiohttp refuses to connect to, so a URL naming one is refused when it is given."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        try:
            socket.inet_aton(host)
        except OSError:
            return False
        return True
    return False


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPAddress) -> str:
    for kind, yes in (
        ("loopback", ip.is_loopback),
        ("link-local, e.g. a cloud metadata service", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("shared address space of carrier-grade NAT", ip in _SHARED),
    ):
        if yes:
            return kind
    return "special-purpose"
