"""Web search for the hosted ``web_search`` tool: the values every backend speaks, the pure
helpers the run uses on them, the choice of backend and its command-line flags.

Invariants:
- A backend (``WebSearchBackend``) raises only ``SearchFailed`` for its own trouble (down,
  slow, garbage, no such page), with a short reason a person (and the model) can read; every
  wait it makes is bounded by its ``timeout_s`` and a Trio cancel stops it at once.
- A search answers at most ``max_sources(options.context_size)`` sources (3, 5 or 8), each
  allowed by ``options.allowed_domains``, with a snippet of at most ``SNIPPET_CHARS``.
- ``allowed`` and ``find_in_page`` are pure; ``allowed(url, ())`` is true for every URL.
- Web search is off unless the operator names a backend (``--web-search``): a server that
  reaches the network because a model asked is a door the operator opens.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

ContextSize = Literal["low", "medium", "high"]
KINDS = ("off", "local", "searxng", "ddgs")
SNIPPET_CHARS = 300
# Excerpts ``find_in_page`` returns at most: a page that mentions the pattern everywhere
# would otherwise come back whole.
MAX_EXCERPTS = 20
_SOURCES: Mapping[str, int] = {"low": 3, "medium": 5, "high": 8}


@dataclass(frozen=True, slots=True)
class SearchOptions:
    allowed_domains: tuple[str, ...] = ()
    context_size: ContextSize = "medium"


@dataclass(frozen=True, slots=True)
class Source:
    url: str
    title: str
    snippet: str


@dataclass(frozen=True, slots=True)
class Page:
    url: str
    title: str
    text: str


class SearchFailed(Exception):
    """The backend could not answer; the message is a short human reason."""


class WebSearchBackend(Protocol):
    async def search(self, query: str, options: SearchOptions) -> list[Source]: ...

    async def open_page(self, url: str) -> Page: ...

    async def aclose(self) -> None: ...


def max_sources(context_size: str) -> int:
    """How many sources a search answers for ``search_context_size``."""
    return _SOURCES.get(context_size, _SOURCES["medium"])


def trim_snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """``text`` on one line, its runs of white space collapsed, cut to ``limit`` characters
    (the last one an ellipsis when cut)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rstrip() + "…"


def select_sources(sources: list[Source], options: SearchOptions) -> list[Source]:
    """The sources ``options`` allows, first ones first, at most ``max_sources``, each URL
    once, snippets trimmed."""
    chosen: list[Source] = []
    seen: set[str] = set()
    for source in sources:
        if source.url in seen or not allowed(source.url, options.allowed_domains):
            continue
        seen.add(source.url)
        chosen.append(Source(source.url, source.title, trim_snippet(source.snippet)))
        if len(chosen) == max_sources(options.context_size):
            break
    return chosen


# ---------------------------------------------------------------- pure helpers


def normal_domain(domain: str) -> str:
    """``domain`` as ``allowed`` compares it: lower case, without a scheme, path, port, a
    leading ``*.`` or ``.``, or a trailing dot."""
    text = domain.strip().lower()
    if "://" in text:
        text = urlsplit(text).hostname or ""
    text = text.split("/", 1)[0].split(":", 1)[0]
    return text.removeprefix("*.").strip(".")


def allowed(url: str, domains: tuple[str, ...]) -> bool:
    """Whether ``url``'s host is one of ``domains`` or a subdomain of one; ``()`` allows all."""
    if not domains:
        return True
    try:
        host = (urlsplit(url).hostname or "").rstrip(".")
    except ValueError:  # a malformed netloc (an unclosed IPv6 bracket)
        return False
    if not host:
        return False
    for domain in map(normal_domain, domains):
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def excerpt_spans(text: str, pattern: str, context_chars: int) -> list[tuple[int, int]]:
    """The spans of ``text`` ``find_in_page`` shows: ``context_chars`` either side of each
    case-insensitive match of ``pattern``, overlapping ones merged, in order, at most
    ``MAX_EXCERPTS``."""
    if not pattern:
        return []
    spans: list[tuple[int, int]] = []
    context = max(0, context_chars)
    for match in re.finditer(re.escape(pattern), text, re.IGNORECASE):
        start, end = max(0, match.start() - context), min(len(text), match.end() + context)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        elif len(spans) == MAX_EXCERPTS:
            break
        else:
            spans.append((start, end))
    return spans


def find_in_page(page: Page, pattern: str, context_chars: int) -> str:
    """The excerpts of ``page`` around each case-insensitive match of ``pattern``, separated by
    a line ``…``; ``""`` when it does not occur."""
    spans = excerpt_spans(page.text, pattern, context_chars)
    return "\n…\n".join(page.text[start:end].strip() for start, end in spans)


class _HtmlText(HTMLParser):
    """The title, the canonical link and the visible text of an HTML page."""

    _SKIPPED = frozenset({"script", "style", "noscript", "template", "svg"})
    _BLOCKS = frozenset(
        {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article"}
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.canonical = ""
        self.parts: list[str] = []
        self._skipping = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "link" and (values.get("rel") or "").lower() == "canonical":
            self.canonical = values.get("href") or ""
        if tag in self._SKIPPED:
            self._skipping += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in self._SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skipping:
            self.parts.append(data)


@dataclass(frozen=True, slots=True)
class HtmlDocument:
    title: str
    canonical: str
    text: str


def html_document(markup: str) -> HtmlDocument:
    """The title, canonical URL (``""`` when none) and visible text of an HTML page: one
    paragraph a line, runs of spaces collapsed."""
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    text = "\n".join(line for line in lines if line)
    return HtmlDocument(" ".join(parser.title.split()), parser.canonical.strip(), text)


# ---------------------------------------------------------------- choosing a backend


def build_backend(
    kind: str,
    *,
    index_dir: Path | None,
    searxng_url: str | None,
    timeout_s: float,
    allow_private_pages: bool = False,
) -> WebSearchBackend:
    """The backend ``--web-search`` names; ValueError naming the missing setting."""
    if kind == "local":
        if index_dir is None:
            raise ValueError("--web-search local needs --web-search-index DIR (a folder)")
        from .local_index import LocalIndexBackend

        return LocalIndexBackend(index_dir, timeout_s)
    if kind == "searxng":
        if not searxng_url:
            raise ValueError("--web-search searxng needs --searxng-url URL")
        from .searxng import SearxngBackend

        return SearxngBackend(searxng_url, timeout_s, allow_private_pages=allow_private_pages)
    if kind == "ddgs":
        raise ValueError(ddgs_refusal())
    raise ValueError(f"unknown web search backend {kind!r}: expected local, searxng or ddgs")


def ddgs_refusal() -> str:
    """Why ``--web-search ddgs`` cannot start: this build has no ddgs backend."""
    return "--web-search ddgs is not supported by this build; use local or searxng"


# ---------------------------------------------------------------- command line


@dataclass(frozen=True, slots=True)
class WebSearchSettings:
    kind: str = "off"
    index_dir: Path | None = None
    searxng_url: str | None = None
    timeout_s: float = 10.0
    allow_private_pages: bool = False


def _kind_flag(text: str) -> str:
    value = text.strip().lower()
    if value not in KINDS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(KINDS)}, got {text!r}")
    return value


def _seconds_flag(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def add_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """``--web-search`` and its settings, each with its environment variable."""
    env = os.environ if environ is None else environ
    parser.add_argument(
        "--web-search",
        type=_kind_flag,
        default=env.get("MLX_RESPONSES_WEB_SEARCH", "off"),
        metavar="{off,local,searxng,ddgs}",
        help="run the hosted web_search tool on this backend (env MLX_RESPONSES_WEB_SEARCH; "
        "default off: web_search is refused)",
    )
    parser.add_argument(
        "--web-search-index",
        type=Path,
        default=env.get("MLX_RESPONSES_WEB_SEARCH_INDEX"),
        metavar="DIR",
        help="folder of .txt/.md/.html/.pdf documents the local backend indexes "
        "(env MLX_RESPONSES_WEB_SEARCH_INDEX)",
    )
    parser.add_argument(
        "--searxng-url",
        default=env.get("MLX_RESPONSES_SEARXNG_URL"),
        metavar="URL",
        help="base URL of a SearXNG instance with the JSON format enabled "
        "(env MLX_RESPONSES_SEARXNG_URL)",
    )
    parser.add_argument(
        "--web-search-timeout",
        type=_seconds_flag,
        default=env.get("MLX_RESPONSES_WEB_SEARCH_TIMEOUT", "10"),
        metavar="SECONDS",
        help="longest wait for one search or page (env MLX_RESPONSES_WEB_SEARCH_TIMEOUT; "
        "default 10)",
    )
    parser.add_argument(
        "--web-search-allow-private",
        action="store_true",
        default=env.get("MLX_RESPONSES_WEB_SEARCH_ALLOW_PRIVATE", "") not in ("", "0", "false"),
        help="let the searxng backend open pages (and follow redirects) to private, loopback "
        "or link-local addresses (env MLX_RESPONSES_WEB_SEARCH_ALLOW_PRIVATE; default off)",
    )


def settings_from(args: argparse.Namespace) -> WebSearchSettings:
    index = args.web_search_index
    return WebSearchSettings(
        kind=args.web_search,
        index_dir=Path(index) if index is not None else None,
        searxng_url=args.searxng_url or None,
        timeout_s=float(args.web_search_timeout),
        allow_private_pages=bool(args.web_search_allow_private),
    )
