"""The client's address: the socket peer, or what a proxy the operator trusts says it saw.

``OLU_TRUSTED_PROXIES`` (comma-separated IP addresses and CIDR blocks, empty by default) lists the proxies whose
forwarded header is believed; the header is ``OLU_FORWARDED_HEADER`` (``x-forwarded-for``, the default, or
``forwarded``, RFC 7239), whichever the proxy sets.  A request whose socket peer is not a listed proxy is that
peer's, whatever headers it carries.  From a listed proxy the header's hops are read from the right (the end the
proxy appended) past every listed proxy; the first hop that is not one is the client.  A hop that is not an IP
address ends the walk at the last trusted hop.

The socket peer is read from the server's transport where the server exposes it (uvicorn), so that a server
started with its own proxy-header handling on (uvicorn's default trusts ``X-Forwarded-For`` from 127.0.0.1)
cannot hand the service an address a client chose; elsewhere it is the ASGI scope's ``client``.  The resolved
address replaces ``scope["client"]`` for everything behind this middleware (the failed-authentication throttle).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
HEADERS = ("x-forwarded-for", "forwarded")


def _ip(value: str):
    """An address from a header hop or a socket (ports, brackets and IPv4-mapped IPv6 dropped); None if not one."""
    v = value.strip().strip('"')
    if v.startswith("["):  # [v6] or [v6]:port
        v = v[1:v.find("]")] if "]" in v else ""
    elif v.count(":") == 1:  # v4:port
        v = v.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        return None
    return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped is not None else ip


def parse_trusted(spec: str | Iterable[str] | None) -> tuple[IPNetwork, ...]:
    """``"10.0.0.0/8, 192.0.2.7"`` -> networks; ValueError naming an entry that is neither an address nor a block."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or ())
    nets = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"OLU_TRUSTED_PROXIES: {item!r} is neither an IP address nor a CIDR block") from None
    return tuple(nets)


def _hops(header: str, value: str) -> list[str]:
    if header == "x-forwarded-for":
        return [h.strip() for h in value.split(",") if h.strip()]
    hops = []  # Forwarded: for=...;proto=..., for=...
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, v = pair.strip().partition("=")
            if name.strip().lower() == "for":
                hops.append(v.strip())
    return hops


class ClientResolver:
    def __init__(self, trusted: str | Iterable[str] | None = None, header: str = "x-forwarded-for"):
        self.trusted = parse_trusted(trusted)
        header = header.strip().lower()
        if header not in HEADERS:
            raise ValueError(f"OLU_FORWARDED_HEADER must be one of {', '.join(HEADERS)} (got {header!r})")
        self.header = header.encode()

    def is_trusted(self, ip) -> bool:
        return ip is not None and any(ip.version == n.version and ip in n for n in self.trusted)

    def resolve(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        peer_ip = _ip(peer) if peer else None
        if not self.trusted or not self.is_trusted(peer_ip):
            return peer
        values = [v.decode("latin-1") for k, v in headers if k == self.header]
        client = peer_ip
        for hop in reversed(_hops(self.header.decode(), ",".join(values))):
            ip = _ip(hop)
            if ip is None:
                break
            client = ip
            if not self.is_trusted(ip):
                break
        return str(client)


def socket_peer(scope, send) -> tuple[str, int] | None:
    """The TCP peer of the connection: from the server's transport when reachable (uvicorn's request cycle
    keeps it), else the scope's ``client``."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is not None:
        try:
            peer = transport.get_extra_info("peername")
        except Exception:  # noqa: BLE001 - a server without it: the scope's client
            peer = None
        if isinstance(peer, (tuple, list)) and len(peer) >= 2 and isinstance(peer[0], str):
            return peer[0], int(peer[1])
    client = scope.get("client")
    return (client[0], client[1]) if client else None


class ClientAddress:
    """Pure ASGI middleware, outermost: sets ``scope["client"]`` to the resolved client address."""

    def __init__(self, app, resolver: ClientResolver):
        self.app, self.resolver = app, resolver

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            peer = socket_peer(scope, send)
            if peer is not None:
                host = self.resolver.resolve(peer[0], scope.get("headers", ()))
                scope["client"] = (host, peer[1] if host == peer[0] else 0)
        return await self.app(scope, receive, send)
