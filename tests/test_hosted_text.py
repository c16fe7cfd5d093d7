"""Citations (protocol.tools.citations) and the model-facing texts of hosted tools
(protocol.tools.hosted_text): properties over generated answers, and the exact texts."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses.response_output_text import AnnotationURLCitation

from mlx_responses.protocol.tools.citations import url_citations
from mlx_responses.protocol.tools.hosted_text import (
    failed_text,
    mcp_result_text,
    open_page_text,
    replayed_search_text,
    search_result_text,
)
from tests.conformance import unknown_keys

_URLS = ["https://a.org", "https://a.org/x", "https://b.org/p?q=1", "http://c.net/"]
sources = st.lists(st.tuples(st.sampled_from([*_URLS, ""]), st.text(max_size=5)), max_size=5).map(
    tuple
)
# Answers built from prose, markers (in and out of range) and the URLs, in any order.
pieces = st.one_of(
    st.text(max_size=6),
    st.integers(0, 7).map(lambda n: f"[{n}]"),
    st.sampled_from(_URLS),
    st.sampled_from([".", ", ", "/", "x", "]", "["]),
)
answers = st.lists(pieces, max_size=12).map("".join)


@given(answers, sources)
def test_citations_slice_to_their_marker_or_url_in_order_without_overlap(
    text: str, found: tuple[tuple[str, str], ...]
) -> None:
    citations = url_citations(text, found)
    reached = 0
    for citation in citations:
        model = AnnotationURLCitation.model_validate(citation, strict=True)
        assert not unknown_keys(model)
        start, end = citation["start_index"], citation["end_index"]
        assert reached <= start < end <= len(text)  # in order, never overlapping
        reached = end
        span = text[start:end]
        marker = re.fullmatch(r"\[([0-9]+)\]", span)
        if marker is not None and span != citation["url"]:
            number = int(marker.group(1))
            assert 1 <= number <= len(found)
            assert (citation["url"], citation["title"]) == found[number - 1]
        else:
            assert span == citation["url"]
            assert (citation["url"], citation["title"]) in found
        assert citation["url"]  # a source without a URL cites nothing


@given(answers, sources)
def test_every_marker_of_a_source_is_cited(text: str, found: tuple[tuple[str, str], ...]) -> None:
    """A marker in range, with a URL and not inside a cited URL, is never missed."""
    citations = url_citations(text, found)
    spans = [(c["start_index"], c["end_index"]) for c in citations]
    for match in re.finditer(r"\[([1-9][0-9]*)\]", text):
        number = int(match.group(1))
        if number > len(found) or not found[number - 1][0]:
            continue
        covered = any(s <= match.start() < e for s, e in spans)
        assert covered, (match.group(), spans)


def test_citations_of_an_answer() -> None:
    text = "Paris is the capital [1]; see https://a.org/x. Not https://a.org/xy or [4]."
    found = (("https://a.org/x", "Paris"), ("https://b.org", "B"))
    assert url_citations(text, found) == [
        {
            "type": "url_citation",
            "url": "https://a.org/x",
            "title": "Paris",
            "start_index": 21,
            "end_index": 24,
        },
        {
            "type": "url_citation",
            "url": "https://a.org/x",
            "title": "Paris",
            "start_index": 30,
            "end_index": 45,
        },
    ]
    assert url_citations(text, ()) == []


def test_the_longer_url_wins_where_two_sources_overlap() -> None:
    found = (("https://a.org", "root"), ("https://a.org/x", "page"))
    (citation,) = url_citations("at https://a.org/x", found)
    assert (citation["url"], citation["start_index"], citation["end_index"]) == (
        "https://a.org/x",
        3,
        18,
    )


def test_search_texts() -> None:
    results = [("Paris", "https://a.org/x", "Capital of France."), ("B", "https://b.org", "")]
    assert search_result_text(results) == (
        "[1] Paris\nhttps://a.org/x\nCapital of France.\n\n[2] B\nhttps://b.org\n"
    )
    assert search_result_text([]) == "No results."
    assert open_page_text("Paris", "https://a.org/x", "Text.") == "Paris\nhttps://a.org/x\n\nText."
    assert failed_text("the search backend answered 500") == (
        "The search failed: the search backend answered 500"
    )


def test_mcp_result_texts() -> None:
    assert mcp_result_text("sunny, 18C", None) == "sunny, 18C"
    assert mcp_result_text(None, None) == ""
    assert mcp_result_text(None, "refused") == "Error: refused"
    http = {"type": "http_error", "code": 401, "message": "unauthorized"}
    assert mcp_result_text(None, http) == "Error: unauthorized"
    tool = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "no city"}]}
    assert mcp_result_text("ignored", tool) == "Error: no city"
    assert mcp_result_text(None, {"type": "odd"}) == 'Error: {"type": "odd"}'


def test_replayed_search_texts() -> None:
    sources = [{"type": "url", "url": "https://a.org/x"}, {"type": "url", "url": "https://b.org"}]
    done = {"type": "web_search_call", "status": "completed"}
    assert (
        replayed_search_text({**done, "action": {"type": "search", "sources": sources}})
        == "[1] https://a.org/x\n\n[2] https://b.org"
    )
    assert replayed_search_text({**done, "action": {"type": "search"}}) == "Searched."
    failed = {**done, "status": "failed", "action": {"type": "search", "query": "q"}}
    assert replayed_search_text(failed) == "The search failed."
