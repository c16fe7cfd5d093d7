"""Egress: which outbound URLs the server may reach when a request names one (an MCP server's
``server_url``), and an HTTP client that reaches exactly the address that was checked.

A hostile ``server_url`` is a request-forgery door: the model's server would make requests from
inside the operator's network. So the operator names the hosts (``allow_hosts``), and even an
allowed name must resolve to public addresses unless the operator allows private ones.

Invariants:
- ``check`` refuses before any connection: a scheme other than http(s), a host not on the
  allow-list, a name that does not resolve within ``RESOLVE_DEADLINE_S``, or (without
  ``allow_private``) any resolved address that is not globally routable (loopback, private,
  link-local, unspecified, multicast, reserved, shared, IPv4-mapped forms of those).
- The connection goes to the address ``check`` returned (``PinnedTarget.address``), never to a
  second lookup, so DNS rebinding cannot swap the address between check and connect; the
  ``Host`` header and the TLS server name stay the URL's host, so virtual hosts and
  certificate checks work as without pinning.
- A pinned client sends nothing to another origin (scheme, host, port): such a request is
  refused in the transport.
- Environment proxies are ignored (a proxy would connect by name, past the pin).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
import trio

RESOLVE_DEADLINE_S = 10.0
DEFAULT_PORTS = {"http": 80, "https": 443}

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    allow_hosts: tuple[str, ...]
    allow_private: bool
    # The flags a refusal names (the operator's way to allow what was refused).
    hosts_flag: str = "--mcp-allow-hosts"
    private_flag: str = "--mcp-allow-private"


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    """A URL that passed ``check``, with the one address its connections go to."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


class EgressRefused(Exception):
    """The URL may not be reached; the message says why."""


# ------------------------------------------------------------------------------ pure rules


def normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def host_allowed(host: str, allow_hosts: tuple[str, ...]) -> bool:
    """``host`` equals an entry, or an entry is ``*.domain`` and host is a subdomain of
    ``domain`` (not ``domain`` itself), or an entry is ``*``. Case and a final dot ignored."""
    name = normalize_host(host)
    if not name:
        return False
    for entry in (normalize_host(e) for e in allow_hosts):
        if entry == "*" or entry == name:
            return True
        if entry.startswith("*.") and name.endswith(entry[1:]):
            return True
    return False


def address_class(address: IpAddress) -> str | None:
    """None for a globally routable unicast address; else the class that makes it private."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    checks: tuple[tuple[str, bool], ...] = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    )
    for name, hit in checks:
        if hit:
            return name
    return None if address.is_global else "not globally routable"


@dataclass(frozen=True, slots=True)
class _Parsed:
    scheme: str
    host: str
    port: int


def parse_url(url: str) -> _Parsed:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise EgressRefused(f"invalid URL {url!r}: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise EgressRefused(f"only http and https URLs may be reached, not {scheme or 'none'!r}")
    host = normalize_host(parts.hostname or "")
    if not host:
        raise EgressRefused(f"the URL {url!r} names no host")
    return _Parsed(scheme, host, port if port is not None else DEFAULT_PORTS[scheme])


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


# ------------------------------------------------------------------------------ the check


async def check(url: str, policy: EgressPolicy) -> PinnedTarget:
    """The pinned target for ``url``, or ``EgressRefused`` saying why not."""
    parsed = parse_url(url)
    if not host_allowed(parsed.host, policy.allow_hosts):
        raise EgressRefused(
            f"the host {parsed.host!r} is not on the allow-list ({policy.hosts_flag})"
        )
    literal = _literal(parsed.host)
    addresses = [literal] if literal is not None else await _resolve(parsed.host, parsed.port)
    if not policy.allow_private:
        for address in addresses:
            kind = address_class(address)
            if kind is not None:
                raise EgressRefused(
                    f"the host {parsed.host!r} resolves to a {kind} address ({address}); "
                    f"{policy.private_flag} allows it"
                )
    return PinnedTarget(url, parsed.scheme, parsed.host, parsed.port, str(addresses[0]))


async def _resolve(host: str, port: int) -> list[IpAddress]:
    # trio.socket.getaddrinfo runs the system resolver in a worker thread and abandons it on
    # a cancel, so the deadline (and any caller's cancel) is honoured at once.
    with trio.move_on_after(RESOLVE_DEADLINE_S) as scope:
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise EgressRefused(f"the host {host!r} does not resolve: {error}") from None
    if scope.cancelled_caught:
        raise EgressRefused(f"resolving {host!r} took over {RESOLVE_DEADLINE_S:g} s")
    addresses: list[IpAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise EgressRefused(f"the host {host!r} has no address")
    return addresses


# ------------------------------------------------------------------------------ the client


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends each request to the pinned address, keeping the Host header and TLS name."""

    def __init__(self, target: PinnedTarget) -> None:
        self._target = target
        self._inner = httpx2.AsyncHTTPTransport(verify=_tls_context(), trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        port = url.port if url.port is not None else DEFAULT_PORTS.get(url.scheme, -1)
        origin = (url.scheme, normalize_host(url.host), port)
        target = self._target
        if origin != (target.scheme, target.host, target.port):
            raise EgressRefused(f"a request to {url} leaves the checked origin {target.url}")
        extensions = dict(request.extensions)
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        # A copy: the client keeps the original request (its URL names the host) for the
        # response, so redirects and errors speak of the URL that was asked for.
        pinned = httpx2.Request(
            request.method,
            url.copy_with(host=target.address),
            headers=request.headers,
            stream=request.stream,
            extensions=extensions,
        )
        return await self._inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the CA bundle takes ~20 ms; a client per MCP session would pay it every call.
    return httpx2.create_ssl_context(trust_env=False)


ResponseHook = Callable[[httpx2.Response], object]


def pinned_client(
    target: PinnedTarget,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout,
    on_response: ResponseHook | None = None,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose every connection goes to ``target.address``."""

    async def hook(response: httpx2.Response) -> None:
        if on_response is not None:
            on_response(response)

    return httpx2.AsyncClient(
        transport=PinnedTransport(target),
        headers=dict(headers or {}),
        timeout=timeout,
        trust_env=False,
        follow_redirects=False,
        event_hooks={"response": [hook]},
    )
