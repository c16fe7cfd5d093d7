"""The ``searxng`` web search backend against a real local HTTP server (stdlib
``http.server`` in a thread) that answers like a SearXNG instance: the fixtures of
``tests/fixtures/searxng`` (see its README for their source), and the ways an instance goes
wrong - a 500, invalid JSON, another shape, no answer (bounded by the timeout, and a Trio cancel
closes the connection at once), nobody listening. Then ``open_page`` over the same server."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import trio

from mlx_responses.hosted.searxng import SearxngBackend
from mlx_responses.hosted.web_search import SearchFailed, SearchOptions, build_backend

from .conftest import wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "searxng"
ANSWERS = {
    json.loads(path.read_text())["query"]: path.read_bytes() for path in FIXTURES.glob("*.json")
}
NO_RESULTS = (FIXTURES / "no-results.json").read_bytes()
DEADLINE = 30
# A hung handler gives up after this, so the server always shuts down.
HANG_LIMIT = 60
# The backend's timeout where a test waits for it to run out on a page or an instance that
# never answers. Long enough for the request to reach the site on a loaded machine: a timeout
# that runs out before the request is sent leaves the site nothing to see hung up on (a CI
# run at 0.3 s: the site never saw the request).
HANG_TIMEOUT_S = 2
PAGE = (
    "<!doctype html><html><head><title>Local Paris</title><script>var x = 1;</script></head>"
    "<body><h1>Paris</h1><p>Paris is the capital of France.</p></body></html>"
)


@dataclass
class Site:
    """What the server saw, shared with its handler threads."""

    base: str = ""
    queries: list[dict[str, list[str]]] = field(default_factory=list)
    hung: threading.Event = field(default_factory=threading.Event)
    hangup_seen: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    site: Site

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        mode, _, rest = parts.path.strip("/").partition("/")
        if rest == "search":
            self.site.queries.append(parse_qs(parts.query))
        query = parse_qs(parts.query).get("q", [""])[0]
        match mode, rest:
            case "ok", "search":
                self._send(200, "application/json", ANSWERS.get(query, NO_RESULTS))
            case "found", "search":
                self._send(200, "application/json", self._found())
            case "fail", "search":
                self._send(500, "text/html", b"<h1>Internal Server Error</h1>")
            case "garbage", "search":
                self._send(200, "application/json", b"<html>rate limited</html>")
            case "shape", "search":
                self._send(200, "application/json", b'{"error": "no results list here"}')
            case ("hang", _) | ("pages", "hang"):
                self._hang()
            case "pages", "paris":
                self._send(200, "text/html; charset=utf-8", PAGE.encode())
            case "pages", "plain":
                self._send(200, "text/plain", b"Plain words about Paris.")
            case "pages", "image":
                self._send(200, "image/png", b"\x89PNG\r\n")
            case "pages", "endless":
                self._endless()
            case "pages", "big":
                self._send(200, "text/plain", b"Paris " * 100_000)
            case "pages", "moved":  # a relative redirect, then an absolute one, to paris
                self._redirect(302, "/pages/moved-again")
            case "pages", "moved-again":
                self._redirect(301, f"{self.site.base}/pages/paris")
            case "pages", "loop":
                self._redirect(307, "/pages/loop")
            case _:
                self._send(404, "text/plain", b"not found")

    def _found(self) -> bytes:
        """An answer whose results are this server's own pages."""
        data = json.loads(ANSWERS["trio structured concurrency python"])
        names = ["paris", "plain", "image", "big", "missing", "hang"]
        data["results"] = [
            {**data["results"][0], "url": f"{self.site.base}/pages/{name}", "title": name}
            for name in names
        ]
        return json.dumps(data).encode()

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, status: int, location: str) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _endless(self) -> None:
        """A text page that never ends (until the client hangs up)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for _ in range(HANG_LIMIT * 20):
            if self.site.stop.is_set():
                return
            try:
                self.wfile.write(b"Paris " * 1000)
                self.wfile.flush()
            except OSError:
                self.site.hangup_seen.set()
                return
            self.site.stop.wait(0.05)

    def _hang(self) -> None:
        """Answers nothing; notes when the client closes the connection."""
        self.site.hung.set()
        for _ in range(HANG_LIMIT * 20):
            if self.site.stop.is_set():
                break
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                self.site.hangup_seen.set()
                break
        self.close_connection = True


@pytest.fixture
def site() -> Iterator[Site]:
    shared = Site()
    handler = type("Handler", (_Handler,), {"site": shared})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    shared.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield shared
    shared.stop.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


def _backend(site: Site, mode: str, timeout_s: float = 10, **kwargs: bool) -> SearxngBackend:
    """A backend on the test site, whose pages are on loopback: allowed unless said."""
    kwargs.setdefault("allow_private_pages", True)
    return SearxngBackend(f"{site.base}/{mode}/", timeout_s, **kwargs)


# ---------------------------------------------------------------- searching


async def test_a_search_answers_the_instances_first_results(site: Site) -> None:
    backend = build_backend("searxng", index_dir=None, searxng_url=f"{site.base}/ok", timeout_s=10)
    with trio.fail_after(DEADLINE):
        sources = await backend.search("capital of France", SearchOptions())
        await backend.aclose()
    assert site.queries == [{"q": ["capital of France"], "format": ["json"]}]
    assert [s.url for s in sources] == [
        "https://en.wikipedia.org/wiki/Paris",
        "https://www.britannica.com/place/Paris",
        "https://en.wikipedia.org/wiki/List_of_capitals_of_France",
        "https://www.worldatlas.com/articles/what-is-the-capital-of-france.html",
        "https://home.adelphi.edu/~ca19535/page%204.html",
    ]
    assert sources[0].title == "Paris - Wikipedia"
    assert all(0 < len(s.snippet) <= 300 for s in sources)


@pytest.mark.parametrize(("size", "count"), [("low", 3), ("medium", 5), ("high", 8)])
async def test_context_size_sets_how_many_sources(site: Site, size: str, count: int) -> None:
    backend = _backend(site, "ok")
    options = SearchOptions(context_size=size)  # type: ignore[arg-type]
    with trio.fail_after(DEADLINE):
        sources = await backend.search("capital of France", options)
        await backend.aclose()
    assert len(sources) == count


async def test_allowed_domains_filter_the_results(site: Site) -> None:
    backend = _backend(site, "ok")
    with trio.fail_after(DEADLINE):
        britannica = await backend.search(
            "capital of France", SearchOptions(allowed_domains=("britannica.com",))
        )
        trio_ = await backend.search("trio structured concurrency python", SearchOptions())
        nothing = await backend.search("zzqxj flurbination quantum marmalade", SearchOptions())
        await backend.aclose()
    assert [s.url for s in britannica] == [
        "https://www.britannica.com/place/Paris",
        "https://www.britannica.com/facts/Paris",
    ]
    assert [s.url.split("/")[2] for s in trio_] == [
        "trio.readthedocs.io",
        "github.com",
        "vorpus.org",
    ]
    assert nothing == []


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("fail", "the search backend answered 500"),
        ("garbage", "invalid JSON from the search backend"),
        ("shape", "unexpected JSON from the search backend"),
    ],
)
async def test_a_broken_instance_is_a_search_failed(site: Site, mode: str, reason: str) -> None:
    backend = _backend(site, mode)
    with trio.fail_after(DEADLINE), pytest.raises(SearchFailed, match=f"^{reason}"):
        await backend.search("capital of France", SearchOptions())
    with trio.fail_after(DEADLINE):
        await backend.aclose()


async def test_nobody_listening_is_a_search_failed() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the search: nothing listens there
    backend = SearxngBackend(f"http://127.0.0.1:{port}", 10)
    with trio.fail_after(DEADLINE):
        with pytest.raises(SearchFailed, match="the search backend could not be reached"):
            await backend.search("capital of France", SearchOptions())
        await backend.aclose()


async def test_a_hanging_instance_fails_at_the_timeout_and_is_hung_up_on(site: Site) -> None:
    backend = _backend(site, "hang", timeout_s=HANG_TIMEOUT_S)
    with trio.fail_after(DEADLINE):
        answer = rf"^the search backend did not answer in {HANG_TIMEOUT_S} s$"
        with pytest.raises(SearchFailed, match=answer):
            await backend.search("capital of France", SearchOptions())
        await backend.aclose()
        await wait_until(site.hangup_seen.is_set, 0.01, deadline=DEADLINE)


async def test_a_cancel_during_a_hanging_search_returns_at_once(site: Site) -> None:
    backend = _backend(site, "hang", timeout_s=3600)  # only the cancel can end it
    finished = trio.Event()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:

            async def search() -> None:
                await backend.search("capital of France", SearchOptions())
                finished.set()

            nursery.start_soon(search)
            await wait_until(site.hung.is_set, 0.01, deadline=DEADLINE)
            nursery.cancel_scope.cancel()
        # the outbound request was cancelled: the instance sees the connection closed
        await wait_until(site.hangup_seen.is_set, 0.01, deadline=DEADLINE)
        await backend.aclose()
    assert not finished.is_set()


# ---------------------------------------------------------------- open_page


async def _found(site: Site, **kwargs: bool) -> SearxngBackend:
    backend = _backend(site, "found", **kwargs)
    sources = await backend.search("anything", SearchOptions(context_size="high"))
    assert len(sources) == 6
    return backend


async def test_open_page_reads_a_found_html_or_text_page(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = await _found(site)
        html = await backend.open_page(f"{site.base}/pages/paris")
        plain = await backend.open_page(f"{site.base}/pages/plain")
        await backend.aclose()
    assert (html.title, html.text) == ("Local Paris", "Paris\nParis is the capital of France.")
    assert (plain.title, plain.text) == (f"{site.base}/pages/plain", "Plain words about Paris.")


async def test_open_page_cuts_a_big_page(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = _backend(site, "found", max_page_bytes=1000, open_any_url=True)
        page = await backend.open_page(f"{site.base}/pages/big")
        await backend.aclose()
    assert len(page.text) == 1000


async def test_open_page_cuts_a_page_that_never_ends_at_the_timeout(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = _backend(
            site, "found", timeout_s=HANG_TIMEOUT_S, max_page_bytes=1000, open_any_url=True
        )
        page = await backend.open_page(f"{site.base}/pages/endless")
        await backend.aclose()
        await wait_until(site.hangup_seen.is_set, 0.01, deadline=DEADLINE)
    assert page.text == ("Paris " * 200)[:1000]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc/passwd", "only http and https pages can be opened"),
        ("{base}/pages/secret", "it was not among the search results"),
        ("{base}/pages/missing", "no page at {base}/pages/missing (it answered 404)"),
        ("{base}/pages/image", "its type is image/png"),
    ],
)
async def test_open_page_refuses_what_it_cannot_or_must_not_read(
    site: Site, url: str, reason: str
) -> None:
    with trio.fail_after(DEADLINE):
        backend = await _found(site)
        with pytest.raises(SearchFailed) as failed:
            await backend.open_page(url.format(base=site.base))
        await backend.aclose()
    assert reason.format(base=site.base) in str(failed.value)


async def test_open_any_url_opens_a_page_no_search_found(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = _backend(site, "ok", open_any_url=True)
        page = await backend.open_page(f"{site.base}/pages/paris")
        with pytest.raises(SearchFailed, match="only http and https"):
            await backend.open_page("ftp://127.0.0.1/x")
        await backend.aclose()
    assert page.title == "Local Paris"


async def test_a_hanging_page_fails_at_the_timeout(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = _backend(site, "found", timeout_s=HANG_TIMEOUT_S, open_any_url=True)
        answer = rf"/pages/hang did not answer in {HANG_TIMEOUT_S} s"
        with pytest.raises(SearchFailed, match=answer):
            await backend.open_page(f"{site.base}/pages/hang")
        await backend.aclose()
        await wait_until(site.hangup_seen.is_set, 0.01, deadline=DEADLINE)


async def test_open_page_follows_redirects_within_a_bound(site: Site) -> None:
    with trio.fail_after(DEADLINE):
        backend = _backend(site, "ok", open_any_url=True)
        page = await backend.open_page(f"{site.base}/pages/moved")
        with pytest.raises(SearchFailed, match="redirected too many times"):
            await backend.open_page(f"{site.base}/pages/loop")
        await backend.aclose()
    assert (page.url, page.title) == (f"{site.base}/pages/moved", "Local Paris")


async def test_a_page_on_a_private_address_is_refused_by_default(site: Site) -> None:
    """A found page whose host is on loopback is not fetched (nothing reaches the site's
    pages) unless the operator allows private addresses; the reason names the flag."""
    with trio.fail_after(DEADLINE):
        backend = await _found(site, allow_private_pages=False)
        with pytest.raises(SearchFailed) as failed:
            await backend.open_page(f"{site.base}/pages/hang")
        await backend.aclose()
    assert "loopback" in str(failed.value)
    assert "--web-search-allow-private" in str(failed.value)
    assert not site.hung.is_set()
