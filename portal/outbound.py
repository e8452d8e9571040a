"""Requests the portal makes to addresses people give it (alert webhooks, clusters' Prometheus): to public
addresses only, and never following a redirect.

Refused: a host that is, or resolves to, an address that is not publicly routable: loopback,
link-local (the cloud metadata service at 169.254.169.254 among them), private, shared (100.64.0.0/10),
unique-local IPv6, unspecified, multicast or reserved. An IPv4 address written as IPv6 (::ffff:10.0.0.1)
counts as the IPv4 one. Every address a name resolves to must pass, and a name that does not resolve is
refused. Operators whose services live on their own network allow it: OUTBOUND_ALLOWED_NETWORKS lists
networks allowed besides the public ones, OUTBOUND_ALLOW_PRIVATE_NETWORKS allows every address.

Checked twice: by the fields' validator (`validate_outbound_url`) when an address is given, and by
`Session` at each request, since what a name resolves to may change. At a request the address the
connection actually reached is checked too, so a name that resolves to another address between the
check and the connection still cannot reach a refused one. A refusal raises `AddressRefused`.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(Exception):
    """The portal sends no request to this address. Not an OSError, so that HTTP libraries pass it up as
    it is instead of retrying or wrapping it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """OUTBOUND_ALLOWED_NETWORKS; an entry that is no network is logged and left out."""
    networks = []
    for entry in settings.OUTBOUND_ALLOWED_NETWORKS:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            log.warning("OUTBOUND_ALLOWED_NETWORKS: %r is not a network; ignored", entry)
    return networks


def _plain(address: Address) -> Address:
    """An IPv4 address written as IPv6 (::ffff:10.0.0.1) as the IPv4 one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_public(address: Address) -> bool:
    address = _plain(address)
    return address.is_global and not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def _refused(address: Address, networks) -> bool:
    address = _plain(address)
    if settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS or is_public(address):
        return False
    return not any(address.version == network.version and address in network for network in networks)


def _not_public(host: str, address: Address) -> str:
    unless = _(
        "The portal sends no requests to loopback, link-local, private or reserved addresses unless "
        "OUTBOUND_ALLOWED_NETWORKS or OUTBOUND_ALLOW_PRIVATE_NETWORKS allows them."
    )
    try:
        literal = ipaddress.ip_address(host) == address
    except ValueError:
        literal = False
    if literal:
        return _("%(address)s is not a public address.") % {"address": address} + " " + unless
    return (
        _("%(host)s resolves to %(address)s, which is not a public address.")
        % {"host": host, "address": address}
        + " "
        + unless
    )


def check_host(host: str, port: int) -> None:
    """Refuse `host` if it is, or any address it resolves to is, one the portal sends nothing to."""
    if settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS:
        return
    networks = allowed_networks()
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            raise AddressRefused(_("%(host)s cannot be resolved.") % {"host": host}) from error
        addresses = [ipaddress.ip_address(str(entry[4][0]).partition("%")[0]) for entry in found]
    for address in addresses:
        if _refused(address, networks):
            raise AddressRefused(_not_public(host, address))


def check_url(url: str) -> None:
    """Refuse `url` unless its host may be sent to (AddressRefused says why)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise AddressRefused(_("The address has no host and port that can be read.")) from error
    if not host:
        raise AddressRefused(_("The address names no host."))
    check_host(host, port or (443 if parts.scheme == "https" else 80))


def validate_outbound_url(value: str) -> None:
    """The validator of URL fields the portal sends requests to. A value that is not a URL is left to the
    field's URL validator."""
    if not value:
        return
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError on a port out of range)
    except ValueError as error:
        raise ValidationError(_("Enter a valid URL."), code="invalid") from error
    if not parts.hostname or parts.scheme not in ("http", "https"):
        return
    try:
        check_url(value)
    except AddressRefused as error:
        raise ValidationError(error.message, code="outbound_address") from error


# --- sending -------------------------------------------------------------------------------------------


class _CheckedPeer:
    """A connection that refuses to go on once connected to a refused address, however the name
    resolved. Connections through a proxy reach the proxy, which is the operator's own."""

    host: str
    proxy: object

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()  # type: ignore[misc]
        if self.proxy or settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS:
            return sock
        try:
            address = ipaddress.ip_address(str(sock.getpeername()[0]).partition("%")[0])
        except (OSError, ValueError):
            return sock  # not an IP socket: nothing to judge
        if _refused(address, allowed_networks()):
            sock.close()
            raise AddressRefused(_not_public(self.host, address))
        return sock


class _HTTPConnection(_CheckedPeer, HTTPConnection):
    pass


class _HTTPSConnection(_CheckedPeer, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _CheckedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


class Session(requests.Session):
    """A requests session for addresses people give: each request's host checked first, the address
    each connection reaches checked as it connects, and a redirect answered as it is, never followed."""

    def __init__(self) -> None:
        super().__init__()
        adapter = _CheckedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(self, method, url, **kwargs):  # type: ignore[override]
        check_url(url)
        kwargs["allow_redirects"] = False
        return super().request(method, url, **kwargs)
