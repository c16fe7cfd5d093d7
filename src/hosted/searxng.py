"""The ``searxng`` web search backend: a SearXNG instance's JSON API
(``GET <base>/search?q=...&format=json``; the instance must list ``json`` in
``search.formats``), and ``open_page`` over plain HTTP(S).

Invariants:
- Every request is bounded: ``timeout_s`` for the whole exchange (Trio's deadline, which also
  cancels the outbound request), and a cap on the bytes kept (``MAX_ANSWER_BYTES`` for a search,
  ``max_page_bytes`` for a page, which is cut there; a page still coming at the deadline is
  what was kept by then). A Trio cancel closes the connection at once.
- Trouble is a ``SearchFailed`` with a short reason: a status other than 200, no answer in
  time, a connection refused, invalid JSON, JSON that is not SearXNG's shape.
- ``parse_searxng`` is pure: SearXNG's answer -> the results that have an http(s) URL, in the
  instance's order (its own score), each URL once.
- ``open_page`` refuses any scheme but http and https, and by default any URL that no search of
  this backend returned (the model reads what it found; it cannot make the server fetch an
  address of its choosing). Every hop of a page (the page, then at most ``MAX_REDIRECTS``
  redirects) passes ``egress.check`` first: a private, loopback or link-local address is
  refused unless ``allow_private_pages`` (``--web-search-allow-private``), and the connection
  goes to the address checked, so neither a result nor a redirect reaches the operator's
  network.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any
from urllib.parse import urljoin

import httpx2
import trio

from . import egress
from .web_search import Page, SearchFailed, SearchOptions, Source, html_document, select_sources

MAX_ANSWER_BYTES = 8 * 1024 * 1024
MAX_PAGE_BYTES = 2 * 1024 * 1024
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# URLs remembered from searches (for ``open_page``), the oldest forgotten first.
REMEMBERED_URLS = 1024
_USER_AGENT = "mlx-responses web_search"
_PAGE_HEADERS = {"User-Agent": _USER_AGENT, "Accept": "text/html, text/plain;q=0.9, */*;q=0.5"}


def parse_searxng(data: object) -> list[Source]:
    """The results of a SearXNG JSON answer; SearchFailed when it is not that shape."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise SearchFailed("unexpected JSON from the search backend (no results list)")
    sources: list[Source] = []
    seen: set[str] = set()
    for result in data["results"]:
        if not isinstance(result, dict):
            raise SearchFailed(
                "unexpected JSON from the search backend (a result is not an object)"
            )
        url = result.get("url")
        if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
            continue
        if url in seen:
            continue
        seen.add(url)
        title, content = result.get("title"), result.get("content")
        sources.append(
            Source(
                url=url,
                title=title.strip() if isinstance(title, str) and title.strip() else url,
                snippet=content if isinstance(content, str) else "",
            )
        )
    return sources


class SearxngBackend:
    """Searches a SearXNG instance at ``base_url`` and opens the pages it found."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        *,
        max_page_bytes: int = MAX_PAGE_BYTES,
        open_any_url: bool = False,
        allow_private_pages: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.open_any_url = open_any_url
        # Pages are on the public web: any host, no private address unless the operator says.
        self._page_policy = egress.EgressPolicy(
            ("*",), allow_private_pages, private_flag="--web-search-allow-private"
        )
        self._found: OrderedDict[str, None] = OrderedDict()
        # The proxy environment is not read: the instance is usually on the operator's network.
        self._client = httpx2.AsyncClient(
            timeout=timeout_s,
            follow_redirects=True,
            max_redirects=5,
            trust_env=False,
            headers={"User-Agent": _USER_AGENT, "Accept": "application/json, text/html;q=0.9"},
        )

    async def search(self, query: str, options: SearchOptions) -> list[Source]:
        params = {"q": query, "format": "json"}
        answer = await self._get(
            f"{self.base_url}/search", params, MAX_ANSWER_BYTES, "the search backend"
        )
        if answer.status != 200:
            raise SearchFailed(f"the search backend answered {answer.status}")
        try:
            data = json.loads(b"".join(answer.chunks))
        except (ValueError, UnicodeDecodeError):
            raise SearchFailed("invalid JSON from the search backend") from None
        sources = select_sources(parse_searxng(data), options)
        for source in sources:
            self._remember(source.url)
        return sources

    async def open_page(self, url: str) -> Page:
        if not url.lower().startswith(("http://", "https://")):
            raise SearchFailed(f"refused to open {url}: only http and https pages can be opened")
        if not self.open_any_url and url not in self._found:
            raise SearchFailed(f"refused to open {url}: it was not among the search results")
        status, content_type, body = await self._fetch_page(url)
        if status != 200:
            raise SearchFailed(f"no page at {url} (it answered {status})")
        text = body.decode("utf-8", errors="replace")
        media = content_type.split(";", 1)[0].strip().lower()
        if media in ("text/html", "application/xhtml+xml") or (
            not media and text.lstrip()[:1] == "<"
        ):
            page = html_document(text)
            return Page(url=url, title=page.title or url, text=page.text)
        if media.startswith("text/") or media in ("application/json", ""):
            return Page(url=url, title=url, text=text)
        raise SearchFailed(f"cannot read the page at {url}: its type is {media}")

    async def _fetch_page(self, url: str) -> tuple[int, str, bytes]:
        """``GET url`` and up to ``MAX_REDIRECTS`` redirects, within one ``timeout_s``: each
        hop passes the egress rules first (no private address unless allowed) and connects to
        the address that was checked, so neither a found URL nor a redirect reaches inside."""
        deadline = trio.current_time() + self.timeout_s
        hop = url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                with trio.fail_at(deadline):
                    target = await egress.check(hop, self._page_policy)
            except egress.EgressRefused as refused:
                raise SearchFailed(f"refused to open {hop}: {refused}") from None
            except trio.TooSlowError:
                raise SearchFailed(
                    f"the page at {url} did not answer in {self.timeout_s:g} s"
                ) from None
            client = egress.pinned_client(
                target, headers=_PAGE_HEADERS, timeout=httpx2.Timeout(self.timeout_s)
            )
            async with client:
                answer = await self._get(
                    hop, None, self.max_page_bytes, f"the page at {url}", client, deadline
                )
            if answer.status not in REDIRECTS or not answer.location:
                return answer.status, answer.content_type, b"".join(answer.chunks)
            hop = urljoin(hop, answer.location)
        raise SearchFailed(f"the page at {url} redirected too many times")

    async def aclose(self) -> None:
        with trio.move_on_after(self.timeout_s) as scope:
            scope.shield = True
            await self._client.aclose()

    def _remember(self, url: str) -> None:
        self._found[url] = None
        self._found.move_to_end(url)
        while len(self._found) > REMEMBERED_URLS:
            self._found.popitem(last=False)

    async def _get(
        self,
        url: str,
        params: dict[str, str] | None,
        limit: int,
        who: str,
        client: httpx2.AsyncClient | None = None,
        deadline: float | None = None,
    ) -> _Body:
        """``GET url`` (with the instance's client unless ``client``): its status, content
        type, redirect target and at most ``limit`` bytes of its body, by ``deadline`` (default
        ``timeout_s`` from now); ``who`` names the other end in a failure's reason."""
        body = _Body(limit)
        at = trio.current_time() + self.timeout_s if deadline is None else deadline
        with trio.move_on_at(at):
            try:
                await self._read(client or self._client, url, params, body)
                return body
            except httpx2.TimeoutException:
                pass  # httpx's own timeout fired first: the same failure as Trio's deadline
            except egress.EgressRefused as refused:
                raise SearchFailed(f"{who}: {refused}") from None
            except httpx2.HTTPError as exc:
                raise SearchFailed(_transport_reason(who, exc)) from None
        if body.full:  # a page longer than the limit, still coming: what was kept is the page
            return body
        raise SearchFailed(f"{who} did not answer in {self.timeout_s:g} s")

    @staticmethod
    async def _read(
        client: httpx2.AsyncClient, url: str, params: dict[str, str] | None, body: _Body
    ) -> None:
        async with client.stream("GET", url, params=params) as response:
            body.status = response.status_code
            body.content_type = response.headers.get("content-type", "")
            body.location = response.headers.get("location")
            if response.status_code != 200:
                return
            # Past the limit the rest is read and dropped (within the deadline) rather than
            # left: leaving the stream early leaves httpx's inner generators to the collector.
            async for chunk in response.aiter_bytes():
                body.keep(chunk)


class _Body:
    """The part of an answer kept, filled as it arrives (``_get`` reads it after a deadline)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status = 0
        self.content_type = ""
        self.location: str | None = None
        self.chunks: list[bytes] = []
        self.size = 0

    @property
    def full(self) -> bool:
        return self.status == 200 and self.size >= self.limit

    def keep(self, chunk: bytes) -> None:
        if self.size < self.limit:
            self.chunks.append(chunk[: self.limit - self.size])
            self.size += len(self.chunks[-1])


def _transport_reason(who: str, exc: httpx2.HTTPError) -> str:
    kind: dict[type[Any], str] = {
        httpx2.ConnectError: "could not be reached",
        httpx2.TooManyRedirects: "redirected too many times",
        httpx2.RemoteProtocolError: "broke the HTTP protocol",
    }
    for cls, words in kind.items():
        if isinstance(exc, cls):
            return f"{who} {words}"
    return f"{who} failed: {type(exc).__name__}"
