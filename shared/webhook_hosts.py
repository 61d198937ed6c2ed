"""Where webhooks may go: the URL rules and ``webhook_allowed_hosts`` (pure; the caller resolves host names).

A webhook URL is ``http://`` or ``https://``, with a host, without user info. Its host must be allowed by one
entry of ``webhook_allowed_hosts``:

=====================  ==============================================================================
entry                  allows
=====================  ==============================================================================
``hooks.example.com``  that host name exactly (case-insensitive; a trailing dot is ignored)
``*.example.com``      every sub-domain of example.com (not example.com itself: list it too)
``*``                  any host name or IP address
``10.1.2.0/24``        an IP address (IPv4 or IPv6) in that network, ``10.1.2.3`` that one address:
                       as the URL's host, or as what a host name allowed above resolves to
=====================  ==============================================================================

Then every address the host is (an IP literal) or resolves to (a name) must be public (``is_global``: not private,
loopback, link-local, shared, reserved or multicast), unless a network entry contains it: internal addresses are
reachable only when listed explicitly, and a name that resolves to one of them (DNS rebinding, a typo) is refused.
An IPv6 address that stands for an IPv4 one is judged by the IPv4 address it embeds: IPv4-mapped ``::ffff:a.b.c.d``
(it is that address) and NAT64 ``64:ff9b::a.b.c.d`` (a gateway connects to it). The transition and deprecated ranges
(``REFUSED_RANGES``: IPv4-compatible ``::a.b.c.d`` and -translated, local-use NAT64, 6to4, Teredo, site-local, the
6to4 relay) are refused whatever they embed, unless a network entry contains them: where they lead depends on relays
and tunnels this check cannot see (6to4 of the fleet's own public address reaches its internal hosts).
The api checks at submission (422 naming ``webhook``); the dispatcher checks again at each delivery and connects
to the very address it checked. No entries: webhooks are off (every ``webhook`` is refused).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = ("http", "https")
MAX_URL_CHARS = 2048


class WebhookRefused(ValueError):
    """A webhook URL (or where it resolves to) that the rules refuse; the message says why."""


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """A webhook URL, split: ``host`` lower-case without brackets or a trailing dot, ``port`` explicit."""

    url: str
    scheme: str
    host: str
    port: int

    @property
    def literal(self) -> IpAddress | None:
        """The host as an IP address, when it is one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse_url(url: str) -> WebhookUrl:
    """``url`` split, or ``WebhookRefused`` saying what is wrong with it."""
    if len(url) > MAX_URL_CHARS:
        raise WebhookRefused(f"a webhook URL has at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"not a valid URL: {exc}") from exc
    if parts.scheme.lower() not in SCHEMES:
        raise WebhookRefused("a webhook URL starts with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("a webhook URL has no user info (user:password@)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused("a webhook URL names a host")
    scheme = parts.scheme.lower()
    return WebhookUrl(url.strip(), scheme, host, port or (443 if scheme == "https" else 80))


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): ``64:ff9b::a.b.c.d`` reaches IPv4 ``a.b.c.d`` through a gateway."""
REFUSED_RANGES: tuple[tuple[IpNetwork, str], ...] = (
    (ipaddress.IPv6Network("::/96"), "an IPv4-compatible address (::a.b.c.d, deprecated)"),
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "an IPv4-translated address (::ffff:0:a.b.c.d)"),
    (ipaddress.IPv6Network("64:ff9b:1::/48"), "a local-use NAT64 address (64:ff9b:1::/48)"),
    (ipaddress.IPv6Network("2002::/16"), "a 6to4 address (2002::/16)"),
    (ipaddress.IPv6Network("2001::/32"), "a Teredo address (2001::/32)"),
    (ipaddress.IPv6Network("fec0::/10"), "a site-local address (fec0::/10, deprecated)"),
    (ipaddress.IPv4Network("192.88.99.0/24"), "a 6to4 relay anycast address (192.88.99.0/24, deprecated)"),
)
"""Transition and deprecated ranges: refused unless listed (``is_global`` calls some of them public)."""


def _address(text: str) -> IpAddress:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone id (fe80::1%eth0) is not part of it
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    return address


def embedded_ipv4(address: IpAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64 address (``64:ff9b::a.b.c.d``) reaches; None for any other address."""
    if isinstance(address, ipaddress.IPv6Address) and address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def internal_kind(address: IpAddress) -> str | None:
    """What makes ``address`` unreachable for a webhook unless listed: an internal address, a transition or deprecated
    range (``REFUSED_RANGES``), a NAT64 address of an internal IPv4 one; None for a public address."""
    if address.is_loopback or address.is_unspecified:
        return "an internal address (loopback or unspecified)"
    for network, kind in REFUSED_RANGES:
        if address.version == network.version and address in network:
            return kind
    ipv4 = embedded_ipv4(address)
    if ipv4 is not None:
        inner = internal_kind(ipv4)
        return None if inner is None else f"a NAT64 address of {ipv4}, {inner}"
    if not address.is_global or address.is_multicast:
        return "an internal address (private, loopback, link-local or reserved)"
    return None


@dataclass(frozen=True, slots=True)
class HostRules:
    """The parsed ``webhook_allowed_hosts`` (``parse``)."""

    any_host: bool = False
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> HostRules:
        """The rules of ``entries``; ``ValueError`` naming an entry that is none of the forms above."""
        any_host, names, suffixes, networks = False, set(), [], []
        for raw in entries:
            entry = raw.strip().lower()
            if entry == "*":
                any_host = True
            elif entry.startswith("*."):
                domain = entry[2:].rstrip(".")
                if not _is_name(domain):
                    raise ValueError(f"webhook_allowed_hosts: {raw!r} is not *.<domain>")
                suffixes.append(f".{domain}")
            elif _is_name(entry := entry.rstrip(".")) and not _looks_numeric(entry):
                names.add(entry)
            else:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    raise ValueError(
                        f"webhook_allowed_hosts: {raw!r} is neither a host name, *.<domain>, * nor an IP address "
                        "or network"
                    ) from None
        return cls(any_host, frozenset(names), tuple(suffixes), tuple(networks))

    @property
    def off(self) -> bool:
        """No entry: no webhook is allowed."""
        return not (self.any_host or self.names or self.suffixes or self.networks)

    def check_host(self, url: WebhookUrl) -> IpAddress | None:
        """``WebhookRefused`` unless an entry allows ``url``'s host. An IP literal's address is checked too and
        returned (the one to connect to); for a host name None: ``check_addresses`` then checks what it resolves to.
        """
        if self.off:
            raise WebhookRefused("webhooks are off on this server (its webhook_allowed_hosts is empty)")
        if url.literal is not None:
            if not (self.any_host or self._listed(_address(url.host))):
                raise WebhookRefused(f"{url.host} is not in this server's webhook_allowed_hosts")
            return self.check_addresses(url, [url.host])
        if not (self.any_host or url.host in self.names or url.host.endswith(self.suffixes)):
            raise WebhookRefused(f"host {url.host} is not allowed by this server's webhook_allowed_hosts")
        return None

    def check_addresses(self, url: WebhookUrl, addresses: Sequence[str]) -> IpAddress:
        """The first of ``addresses`` (what ``url``'s host is or resolves to), when every one may be reached:
        public, or in a listed network; else ``WebhookRefused``."""
        if not addresses:
            raise WebhookRefused(f"host {url.host} resolves to no address")
        parsed = [_address(address) for address in addresses]
        for address in parsed:
            kind = None if self._listed(address) else internal_kind(address)
            if kind is not None:
                raise WebhookRefused(
                    f"host {url.host} is {address}, {kind}; only a network listed in this server's "
                    "webhook_allowed_hosts makes one reachable"
                )
        return parsed[0]

    def _listed(self, address: IpAddress) -> bool:
        """Whether a network entry contains ``address`` (or, for a NAT64 address, the IPv4 address it reaches)."""
        ipv4 = embedded_ipv4(address)
        return any(
            candidate.version == network.version and candidate in network
            for network in self.networks
            for candidate in ((address,) if ipv4 is None else (address, ipv4))
        )


def _is_name(text: str) -> bool:
    labels = text.split(".")
    return (
        bool(text)
        and len(text) <= 253
        and all(
            0 < len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum() and label.isascii()
            for label in labels
        )
    )


def _looks_numeric(text: str) -> bool:
    """``10.0.0.1`` is a valid name by label syntax but means an address (a network entry)."""
    return text.replace(".", "").isdigit()
