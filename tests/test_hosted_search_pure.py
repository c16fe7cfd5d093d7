"""The pure parts of web search: ``allowed`` (allowed_domains), ``find_in_page``, SearXNG's
JSON read into sources, the source budget per ``search_context_size``, the FTS5 query built
from any text, HTML to text, and the ``--web-search`` flags and backend choice."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.hosted.local_index import match_expression
from mlx_responses.hosted.searxng import parse_searxng
from mlx_responses.hosted.web_search import (
    MAX_EXCERPTS,
    SNIPPET_CHARS,
    Page,
    SearchFailed,
    SearchOptions,
    Source,
    WebSearchSettings,
    add_flags,
    allowed,
    build_backend,
    excerpt_spans,
    find_in_page,
    html_document,
    max_sources,
    select_sources,
    settings_from,
    trim_snippet,
)

FIXTURES = Path(__file__).parent / "fixtures" / "searxng"
LABEL = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=10)
DOMAIN = st.lists(LABEL, min_size=2, max_size=4).map(".".join)
SCHEME = st.sampled_from(["http", "https"])


# ---------------------------------------------------------------- allowed


@given(st.text())
def test_no_domains_allow_every_url(url: str) -> None:
    assert allowed(url, ())


@given(SCHEME, st.lists(LABEL, max_size=3), DOMAIN, st.text(max_size=20))
def test_a_domain_allows_itself_and_its_subdomains(
    scheme: str, subdomains: list[str], domain: str, path: str
) -> None:
    host = ".".join([*subdomains, domain])
    url = f"{scheme}://{host.upper()}/{path}"
    assert allowed(url, (domain,))
    assert allowed(url, ("other.invalid", f"*.{domain}"))
    assert allowed(f"{scheme}://{host}:8443/x", (f"https://{domain.upper()}/",))


@given(SCHEME, LABEL, DOMAIN)
def test_a_domain_does_not_allow_a_host_that_only_ends_with_its_text(
    scheme: str, prefix: str, domain: str
) -> None:
    # "evilexample.com" is not "example.com" nor a subdomain of it.
    assert not allowed(f"{scheme}://{prefix}{domain}/", (domain,))
    assert not allowed(f"{scheme}://{domain}/", (f"{prefix}.{domain}",))


@pytest.mark.parametrize(
    "url", ["file:///tmp/paris.md", "not a url", "https://[::1/", "mailto:someone@example.com"]
)
def test_a_url_without_a_host_is_not_allowed_once_domains_are_given(url: str) -> None:
    assert not allowed(url, ("example.com",))


# ---------------------------------------------------------------- find_in_page


def _matches(text: str, pattern: str) -> list[re.Match[str]]:
    return list(re.finditer(re.escape(pattern), text, re.IGNORECASE))


@given(st.text(max_size=400), st.text(min_size=1, max_size=4), st.integers(0, 40))
def test_excerpts_cover_each_match_in_order(text: str, pattern: str, context: int) -> None:
    spans = excerpt_spans(text, pattern, context)
    matches = _matches(text, pattern)
    assert bool(spans) == bool(matches)
    assert len(spans) <= MAX_EXCERPTS
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        assert end < next_start  # in order, apart
    for start, end in spans:
        assert 0 <= start < end <= len(text)
        assert _matches(text[start:end], pattern)
    if len(spans) < MAX_EXCERPTS:
        for match in matches:
            assert any(s <= match.start() and match.end() <= e for s, e in spans)


@given(st.text(max_size=200), st.text(min_size=1, max_size=4), st.integers(0, 40))
def test_find_in_page_is_empty_exactly_when_the_pattern_is_absent(
    text: str, pattern: str, context: int
) -> None:
    pattern = pattern.strip()
    assume(pattern)
    found = find_in_page(Page("https://example.com/", "t", text), pattern, context)
    assert bool(found) == bool(_matches(text, pattern))
    assert not found or _matches(found, pattern)


def test_find_in_page_shows_context_around_each_match_case_insensitively() -> None:
    text = "Paris is the capital of France. " + "x" * 200 + " The CAPITAL moved in 1944."
    found = find_in_page(Page("u", "t", text), "capital", 10)
    assert found.split("\n…\n") == ["is is the capital of France", "xxxxx The CAPITAL moved in"]
    assert find_in_page(Page("u", "t", text), "Berlin", 10) == ""
    assert find_in_page(Page("u", "t", text), "", 10) == ""


def test_find_in_page_stops_after_max_excerpts() -> None:
    text = " ".join(["word"] + ["padding" * 5, "word"] * (MAX_EXCERPTS + 5))
    assert len(excerpt_spans(text, "word", 3)) == MAX_EXCERPTS


# ---------------------------------------------------------------- SearXNG's JSON


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_the_captured_answers_become_sources_in_the_instances_order() -> None:
    sources = parse_searxng(_fixture("capital-of-france.json"))
    assert sources[0] == Source(
        "https://en.wikipedia.org/wiki/Paris",
        "Paris - Wikipedia",
        _fixture("capital-of-france.json")["results"][0]["content"],
    )
    assert len(sources) == 8
    trio_sources = parse_searxng(_fixture("trio.json"))
    assert [s.url.split("/")[2] for s in trio_sources] == [
        "trio.readthedocs.io",
        "github.com",
        "vorpus.org",
    ]  # the magnet: result is not a source
    assert parse_searxng(_fixture("no-results.json")) == []


RESULT = st.fixed_dictionaries(
    {
        "url": st.one_of(
            st.builds(lambda s, d, p: f"{s}://{d}/{p}", SCHEME, DOMAIN, LABEL),
            st.sampled_from(["magnet:?xt=urn:btih:00", "", "ftp://example.com/x"]),
            st.integers(),
            st.none(),
        ),
        "title": st.one_of(st.text(max_size=30), st.none()),
        "content": st.one_of(st.text(max_size=60), st.none(), st.integers()),
        "engine": st.sampled_from(["brave", "duckduckgo", "wikipedia"]),
    }
)


@given(st.lists(RESULT, max_size=12))
def test_results_become_http_sources_in_order_each_url_once(results: list[dict[str, Any]]) -> None:
    data = {"query": "q", "number_of_results": 0, "results": results, "answers": []}
    sources = parse_searxng(data)
    expected = [
        r["url"]
        for r in results
        if isinstance(r["url"], str) and r["url"].startswith(("http://", "https://"))
    ]
    assert [s.url for s in sources] == list(dict.fromkeys(expected))
    for source in sources:
        assert source.title.strip()
        assert isinstance(source.snippet, str)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(st.one_of(JSON, st.fixed_dictionaries({"results": JSON})))
def test_any_json_is_sources_or_search_failed(data: object) -> None:
    results = data.get("results") if isinstance(data, dict) else None
    if isinstance(results, list) and all(isinstance(r, dict) for r in results):
        assert all(isinstance(s, Source) for s in parse_searxng(data))
    else:
        with pytest.raises(SearchFailed, match="unexpected JSON from the search backend"):
            parse_searxng(data)


# ---------------------------------------------------------------- the source budget


@settings(max_examples=50)
@given(
    st.lists(
        st.builds(
            Source,
            st.sampled_from(
                ["https://a.org/1", "https://b.a.org/2", "https://c.net/3", "file:///x"]
            ),
            st.text(max_size=5),
            st.text(max_size=700),
        ),
        max_size=20,
    ),
    st.sampled_from(["low", "medium", "high"]),
    st.sampled_from([(), ("a.org",), ("c.net", "nowhere.example")]),
)
def test_a_search_answers_few_allowed_sources_with_short_snippets(
    sources: list[Source], size: Any, domains: tuple[str, ...]
) -> None:
    chosen = select_sources(sources, SearchOptions(domains, size))
    assert len(chosen) <= max_sources(size) == {"low": 3, "medium": 5, "high": 8}[size]
    assert len({s.url for s in chosen}) == len(chosen)
    assert all(allowed(s.url, domains) and len(s.snippet) <= SNIPPET_CHARS for s in chosen)
    wanted = [s.url for s in sources if allowed(s.url, domains)]
    assert [s.url for s in chosen] == list(dict.fromkeys(wanted))[: max_sources(size)]


@given(st.text(max_size=1000))
def test_a_trimmed_snippet_is_one_short_line(text: str) -> None:
    snippet = trim_snippet(text)
    assert len(snippet) <= SNIPPET_CHARS
    assert "\n" not in snippet
    if len(" ".join(text.split())) <= SNIPPET_CHARS:
        assert snippet == " ".join(text.split())


# ---------------------------------------------------------------- the FTS5 query


@given(st.text(max_size=80))
def test_any_query_text_is_a_valid_fts5_query(query: str) -> None:
    expression = match_expression(query)
    if expression is None:
        assert not re.search(r"\w", query)
        return
    with sqlite3.connect(":memory:") as conn:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='porter unicode61')")
        conn.execute("INSERT INTO t VALUES (?)", (query,))
        rows = conn.execute("SELECT count(*) FROM t WHERE t MATCH ?", (expression,)).fetchone()
    assert rows[0] in (0, 1)


def test_html_text_leaves_out_scripts_and_keeps_title_and_canonical() -> None:
    page = html_document(
        '<html><head><title> A  page </title><link rel="canonical" href="https://x.org/a">'
        "<script>var secret = 1;</script></head><body><h1>Head</h1><p>One &amp; two</p>"
        "<style>p{}</style><p>three</p></body></html>"
    )
    assert (page.title, page.canonical, page.text) == (
        "A page",
        "https://x.org/a",
        "Head\nOne & two\nthree",
    )


# ---------------------------------------------------------------- flags and the choice


def _parse(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, environ)
    return parser.parse_args(argv)


def test_flags_default_off_read_the_environment_and_the_command_line_wins() -> None:
    assert settings_from(_parse([], {})) == WebSearchSettings()
    env = {
        "MLX_RESPONSES_WEB_SEARCH": "searxng",
        "MLX_RESPONSES_SEARXNG_URL": "http://127.0.0.1:8888",
        "MLX_RESPONSES_WEB_SEARCH_TIMEOUT": "2.5",
        "MLX_RESPONSES_WEB_SEARCH_INDEX": "/docs",
    }
    chosen = settings_from(_parse([], env))
    assert (chosen.kind, chosen.searxng_url, chosen.timeout_s, chosen.index_dir) == (
        "searxng",
        "http://127.0.0.1:8888",
        2.5,
        Path("/docs"),
    )
    chosen = settings_from(_parse(["--web-search", "local", "--web-search-timeout", "3"], env))
    assert (chosen.kind, chosen.timeout_s) == ("local", 3.0)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--web-search", "google"], {}),
        ([], {"MLX_RESPONSES_WEB_SEARCH": "bing"}),
        (["--web-search-timeout", "0"], {}),
        ([], {"MLX_RESPONSES_WEB_SEARCH_TIMEOUT": "soon"}),
    ],
)
def test_a_bad_flag_or_environment_value_is_refused(
    argv: list[str], environ: dict[str, str]
) -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse(argv, environ)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("local", "--web-search-index"),
        ("searxng", "--searxng-url"),
        ("ddgs", "ddgs"),
        ("bing", "unknown web search backend"),
    ],
)
def test_a_backend_without_its_setting_is_a_value_error_naming_it(kind: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build_backend(kind, index_dir=None, searxng_url=None, timeout_s=1)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--web-search", "ddgs"], "--web-search ddgs is not supported by this build"),
        (["--web-search", "local"], "--web-search local needs --web-search-index"),
        (["--web-search", "local", "--web-search-index", "/no/such/folder"], "not a folder"),
        (["--web-search", "searxng"], "--web-search searxng needs --searxng-url"),
        (["--web-search", "searxng", "--searxng-url", "ftp://x"], "expected an http or https"),
    ],
)
def test_start_up_stops_with_the_flag_named(argv: list[str], words: str) -> None:
    """A backend that cannot be built stops the command line with a message, not later with
    a traceback from the server's start."""
    with pytest.raises(SystemExit) as stopped:
        settings_from_args(build_parser().parse_args(["serve", *argv]))
    assert words in str(stopped.value.code)
