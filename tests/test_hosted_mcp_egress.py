"""hosted/egress.py: which hosts and addresses the server may reach for a request, and the
pinned client that connects to exactly the address checked. Pure rules under Hypothesis; the
DNS path with ``localhost``; the pin and the refusals against an in-process TCP listener that
counts its connections (so "refused without any connection" is observed, not assumed)."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.hosted.egress import (
    RESOLVE_DEADLINE_S,
    EgressPolicy,
    EgressRefused,
    PinnedTarget,
    address_class,
    check,
    host_allowed,
    pinned_client,
)
from mlx_responses.hosted.mcp_client import (
    McpServer,
    McpSettings,
    McpUnavailable,
    add_flags,
    call_tool,
    list_tools,
    settings_from,
)

DEADLINE = 10

labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
hosts = st.lists(labels, min_size=1, max_size=4).map(".".join)


# ------------------------------------------------------------------------------ host matching


@given(hosts)
def test_a_star_allows_any_host_and_an_empty_list_none(host: str) -> None:
    assert host_allowed(host, ("*",))
    assert not host_allowed(host, ())


@given(hosts, st.booleans(), st.booleans())
def test_an_exact_entry_matches_its_host_whatever_the_case_or_final_dot(
    host: str, upper: bool, dot: bool
) -> None:
    asked = (host.upper() if upper else host) + ("." if dot else "")
    assert host_allowed(asked, (host,))
    assert not host_allowed("x" + host, (host,))
    assert not host_allowed("sub." + host, (host,))


@given(labels, hosts)
def test_a_wildcard_matches_subdomains_only(sub: str, domain: str) -> None:
    entry = ("*." + domain,)
    assert host_allowed(f"{sub}.{domain}", entry)
    assert host_allowed(f"a.{sub}.{domain}", entry)
    assert not host_allowed(domain, entry)
    assert not host_allowed(f"{sub}{domain}", entry)  # a suffix that is not a subdomain


# ------------------------------------------------------------------------------ address classes

PRIVATE_NETWORKS = {
    "10.0.0.0/8": "private",
    "172.16.0.0/12": "private",
    "192.168.0.0/16": "private",
    "127.0.0.0/8": "loopback",
    "169.254.0.0/16": "link-local",
    "224.0.0.0/4": "multicast",
    "fc00::/7": "private",
    "fe80::/10": "link-local",
    "ff00::/8": "multicast",
}


@given(st.sampled_from(sorted(PRIVATE_NETWORKS)), st.integers(min_value=0))
def test_every_address_of_a_private_class_is_named_by_its_class(network: str, n: int) -> None:
    net = ipaddress.ip_network(network)
    address = net[n % net.num_addresses]
    assert address_class(address) == PRIVATE_NETWORKS[network]
    if isinstance(address, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(f"::ffff:{address}")
        assert address_class(mapped) == PRIVATE_NETWORKS[network]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("100.64.0.1", "not globally routable"),  # shared address space (carrier NAT)
        ("240.0.0.1", "private"),  # reserved, which Python files under private too
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_single_addresses(text: str, expected: str | None) -> None:
    assert address_class(ipaddress.ip_address(text)) == expected


# ------------------------------------------------------------------------------ check()

OPEN = EgressPolicy(("*",), allow_private=False)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc/passwd", "only http and https"),
        ("ftp://example.com/x", "only http and https"),
        ("http:///mcp", "names no host"),
        ("http://example.com:99999/", "invalid URL"),
        ("http://127.0.0.1:8000/mcp", "loopback"),
        ("http://[::1]/mcp", "loopback"),
        ("http://10.1.2.3/mcp", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0.0.0.0:80/", "unspecified"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
    ],
)
async def test_check_refuses_before_connecting(url: str, reason: str) -> None:
    with trio.fail_after(DEADLINE), pytest.raises(EgressRefused, match=reason):
        await check(url, OPEN)


async def test_a_host_off_the_allow_list_is_refused_by_name() -> None:
    policy = EgressPolicy(("mcp.example.com", "*.tools.example.org"), allow_private=True)
    with trio.fail_after(DEADLINE):
        with pytest.raises(EgressRefused, match=r"'example\.com' is not on the allow-list"):
            await check("https://example.com/mcp", policy)
        with pytest.raises(EgressRefused, match="not on the allow-list"):
            await check("https://tools.example.org/mcp", policy)


async def test_a_name_resolving_to_loopback_is_refused_unless_private_is_allowed() -> None:
    with trio.fail_after(DEADLINE):
        with pytest.raises(EgressRefused, match=r"'localhost' resolves to a loopback address"):
            await check("http://localhost:8123/mcp", EgressPolicy(("localhost",), False))
        target = await check("http://LOCALHOST:8123/mcp", EgressPolicy(("localhost",), True))
    assert (target.scheme, target.host, target.port) == ("http", "localhost", 8123)
    assert address_class(ipaddress.ip_address(target.address)) == "loopback"


async def test_a_literal_address_is_pinned_as_written_with_the_default_port() -> None:
    with trio.fail_after(DEADLINE):
        target = await check("https://127.0.0.1/mcp", EgressPolicy(("127.0.0.1",), True))
    assert target == PinnedTarget("https://127.0.0.1/mcp", "https", "127.0.0.1", 443, "127.0.0.1")


async def test_a_name_that_does_not_resolve_is_refused() -> None:
    # Without a resolver that answers, the bounded wait refuses it instead.
    with trio.fail_after(DEADLINE + RESOLVE_DEADLINE_S):
        with pytest.raises(EgressRefused, match=r"does not resolve|took over"):
            await check("http://no-such-host.invalid/mcp", OPEN)


# ------------------------------------------------------------------------------ the pin


@dataclass
class Listener:
    port: int
    connections: int = 0
    host_headers: list[str] = field(default_factory=list)


@asynccontextmanager
async def open_listener(answer: bool) -> AsyncIterator[Listener]:
    """A TCP listener on 127.0.0.1 counting connections; with ``answer`` it replies 200 to one
    HTTP request per connection (recording its Host header), else it holds the connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = Listener(listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        listener.connections += 1
        if not answer:
            await trio.sleep_forever()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        for line in data.decode().split("\r\n"):
            if line.lower().startswith("host:"):
                listener.host_headers.append(line.split(":", 1)[1].strip())
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        )
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        yield listener
        nursery.cancel_scope.cancel()


async def test_the_pinned_client_connects_to_the_checked_address_keeping_the_host_name() -> None:
    with trio.fail_after(DEADLINE):
        async with open_listener(answer=True) as listener:
            # A name that resolves nowhere: only the pin can bring the request to the listener.
            url = f"http://mcp.example.invalid:{listener.port}/mcp"
            target = PinnedTarget(url, "http", "mcp.example.invalid", listener.port, "127.0.0.1")
            async with pinned_client(target, timeout=httpx2.Timeout(5)) as client:
                response = await client.get(url)
                assert (response.status_code, response.text) == (200, "ok")
                assert str(response.request.url) == url
                with pytest.raises(EgressRefused, match="leaves the checked origin"):
                    await client.get(f"http://other.example.invalid:{listener.port}/mcp")
    assert listener.host_headers == [f"mcp.example.invalid:{listener.port}"]
    assert listener.connections == 1


@pytest.mark.parametrize(
    "policy",
    [EgressPolicy(("example.com",), allow_private=True), EgressPolicy(("127.0.0.1",), False)],
    ids=["off-the-list", "loopback"],
)
async def test_mcp_refused_by_egress_opens_no_connection(policy: EgressPolicy) -> None:
    with trio.fail_after(DEADLINE):
        async with open_listener(answer=True) as listener:
            server = McpServer("local", f"http://127.0.0.1:{listener.port}/mcp", {})
            with pytest.raises(McpUnavailable, match="refused by the egress policy") as raised:
                await list_tools(server, policy, 5)
            outcome = await call_tool(server, "get_weather", {"city": "Paris"}, policy, 5)
    assert raised.value.error["code"] == 403
    assert outcome.output is None
    assert outcome.error is not None
    assert outcome.error["type"] == "http_error"
    assert listener.connections == 0


async def test_a_server_that_accepts_and_never_answers_times_out() -> None:
    policy = EgressPolicy(("127.0.0.1",), allow_private=True)
    with trio.fail_after(DEADLINE):
        async with open_listener(answer=False) as listener:
            server = McpServer("mute", f"http://127.0.0.1:{listener.port}/mcp", {})
            with pytest.raises(McpUnavailable, match="no answer") as raised:
                await list_tools(server, policy, 0.5)
            outcome = await call_tool(server, "x", {}, policy, 0.5)
    assert raised.value.error == {
        "type": "http_error",
        "code": 504,
        "message": str(raised.value),
    }
    assert outcome.error is not None
    assert outcome.error["code"] == 504
    assert listener.connections >= 2


# ------------------------------------------------------------------------------ flags


def parse(argv: list[str], environ: dict[str, str]) -> McpSettings:
    parser = argparse.ArgumentParser()
    add_flags(parser, environ)
    return settings_from(parser.parse_args(argv))


def test_flags_default_to_mcp_off() -> None:
    settings = parse([], {})
    assert settings == McpSettings((), False, 30.0)
    assert settings.policy is None


def test_flags_from_the_environment_and_the_command_line_wins() -> None:
    env = {
        "MLX_RESPONSES_MCP_ALLOW_HOSTS": "mcp.example.com, *.tools.example.org",
        "MLX_RESPONSES_MCP_ALLOW_PRIVATE": "1",
        "MLX_RESPONSES_MCP_TIMEOUT": "5",
    }
    settings = parse([], env)
    assert settings == McpSettings(("mcp.example.com", "*.tools.example.org"), True, 5.0)
    assert settings.policy == EgressPolicy(settings.allow_hosts, True)
    assert parse(["--mcp-allow-hosts", "*", "--mcp-timeout", "2.5"], env).allow_hosts == ("*",)


@pytest.mark.parametrize("bad", ["http://example.com", "a*.example.com", "*example.com", "x/y"])
def test_a_host_flag_that_is_not_a_host_is_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        parse(["--mcp-allow-hosts", bad], {})
