"""The ``local`` web search backend over a real SQLite FTS5 index of
``tests/fixtures/web_index`` (Markdown and plain text with ``URL:`` lines, HTML with a
canonical link, a PDF; a document without a URL line is written to a temporary folder): ranking, allowed_domains, context sizes, open_page, refreshing the
index, and waits that stay bounded and cancellable when the index is busy."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from mlx_responses.hosted.local_index import LocalIndexBackend
from mlx_responses.hosted.web_search import SearchFailed, SearchOptions, build_backend

WEB_INDEX = Path(__file__).parent / "fixtures" / "web_index"
DEADLINE = 30
PARIS = "https://en.wikipedia.org/wiki/Paris"
LYON = "https://en.wikipedia.org/wiki/Lyon"


@pytest.fixture
async def index() -> AsyncIterator[LocalIndexBackend]:
    backend = LocalIndexBackend(WEB_INDEX, timeout_s=10)
    with trio.fail_after(DEADLINE):
        await backend.ensure_index()
    yield backend
    with trio.fail_after(DEADLINE):
        await backend.aclose()


async def test_the_capital_of_france_is_paris_first(index: LocalIndexBackend) -> None:
    with trio.fail_after(DEADLINE):
        sources = await index.search("capital of France", SearchOptions())
    assert sources[0].url == PARIS
    assert sources[0].title == "Paris"
    assert "capital" in sources[0].snippet
    assert "URL:" not in sources[0].snippet
    assert len(sources) <= 5


async def test_allowed_domains_keep_only_their_hosts(index: LocalIndexBackend) -> None:
    with trio.fail_after(DEADLINE):
        wiki = await index.search(
            "capital city nursery", SearchOptions(allowed_domains=("wikipedia.org",))
        )
        python = await index.search(
            "capital SQLite", SearchOptions(allowed_domains=("python.org",))
        )
        nowhere = await index.search("capital", SearchOptions(allowed_domains=("example.com",)))
        everywhere = await index.search("capital city nursery", SearchOptions())
    assert {s.url for s in wiki} == {PARIS, LYON, "https://en.wikipedia.org/wiki/Berlin"}
    assert [s.url for s in python] == ["https://docs.python.org/3/library/sqlite3.html"]
    assert nowhere == []
    assert len(everywhere) > len(wiki)  # the filter removed something


async def test_context_size_bounds_the_sources(index: LocalIndexBackend) -> None:
    query = "city capital France Germany Python array database"
    with trio.fail_after(DEADLINE):
        low = await index.search(query, SearchOptions(context_size="low"))
        high = await index.search(query, SearchOptions(context_size="high"))
    assert len(low) == 3
    assert len(high) == 6  # every document matches one word
    assert [s.url for s in low] == [s.url for s in high][:3]


async def test_a_plain_text_document_is_indexed_with_its_url_line(
    index: LocalIndexBackend,
) -> None:
    with trio.fail_after(DEADLINE):
        sources = await index.search("Rhône silk weaving", SearchOptions())
        page = await index.open_page(LYON)
    assert (sources[0].url, sources[0].title) == (LYON, "lyon")
    assert page.text.startswith("Lyon lies where the Rhône meets the Saône")


async def test_a_document_without_a_url_line_is_its_file_url(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "lyon.txt").write_text(
        "Lyon lies where the Rhône meets the Saône.\n\nIt is known for its silk weaving.\n",
        encoding="utf-8",
    )
    lyon = (folder / "lyon.txt").resolve().as_uri()
    backend = LocalIndexBackend(folder, timeout_s=10)
    with trio.fail_after(DEADLINE):
        await backend.ensure_index()
        sources = await backend.search("Rhône silk weaving", SearchOptions())
        page = await backend.open_page(lyon)
        # a file:// URL has no host: no allowed_domains admits it
        filtered = await backend.search("Rhône", SearchOptions(allowed_domains=("lyon.fr",)))
        await backend.aclose()
    assert lyon.startswith("file://")
    assert (sources[0].url, sources[0].title) == (lyon, "lyon")
    assert page.text.startswith("Lyon lies where the Rhône meets the Saône")
    assert filtered == []


async def test_a_pdf_is_indexed_with_its_url_line(index: LocalIndexBackend) -> None:
    with trio.fail_after(DEADLINE):
        sources = await index.search("machine learning on Apple silicon", SearchOptions())
        page = await index.open_page("https://ml-explore.github.io/mlx/")
    assert sources[0].url == "https://ml-explore.github.io/mlx/"
    assert sources[0].title == "mlx"
    assert "unified memory" in page.text
    assert not page.text.startswith("URL:")


async def test_html_is_indexed_by_its_text_title_and_canonical_link(
    index: LocalIndexBackend,
) -> None:
    with trio.fail_after(DEADLINE):
        sources = await index.search("structured concurrency nursery", SearchOptions())
        hidden = await index.search("hidden script text", SearchOptions())
        page = await index.open_page("https://trio.readthedocs.io/en/stable/")
    assert sources[0].url == "https://trio.readthedocs.io/en/stable/"
    assert sources[0].title.startswith("Trio: a friendly Python library")
    assert "https://trio.readthedocs.io/en/stable/" not in [s.url for s in hidden]
    assert "timeouts & cancellation" in page.text
    assert "var hidden" not in page.text
    assert page.title == sources[0].title


async def test_open_page_answers_the_document_or_fails_by_name(index: LocalIndexBackend) -> None:
    with trio.fail_after(DEADLINE):
        page = await index.open_page(PARIS)
        with pytest.raises(SearchFailed, match=r"no page at https://example\.com/nothing"):
            await index.open_page("https://example.com/nothing")
    assert page.title == "Paris"
    assert page.text.startswith("# Paris")
    assert "Paris is the capital and largest city of France" in " ".join(page.text.split())


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ('"unbalanced', None),
        ("NEAR(zebra quagga)", None),
        ("*", None),
        ("-capital:France^ OR", PARIS),
    ],
)
async def test_fts5_syntax_in_a_query_is_plain_words(
    index: LocalIndexBackend, query: str, first: str | None
) -> None:
    with trio.fail_after(DEADLINE):
        sources = await index.search(query, SearchOptions())
    assert (sources[0].url if sources else None) == first


async def test_ensure_index_is_idempotent_and_follows_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    shutil.copytree(WEB_INDEX, folder)
    backend = LocalIndexBackend(folder, timeout_s=10)
    with trio.fail_after(DEADLINE):
        await backend.ensure_index()
        first = await backend.search("capital of France", SearchOptions())
        await backend.ensure_index()
        assert backend.statistics().files_read == backend.statistics().documents == 6
        assert await backend.search("capital of France", SearchOptions()) == first

        berlin = folder / "berlin.md"
        berlin.write_text("URL: https://en.wikipedia.org/wiki/Berlin\n# Berlin\n\nZeppelins.\n")
        os.utime(berlin, ns=(1, 1))  # a new stamp even on a coarse-clock file system
        (folder / "lyon.txt").unlink()
        await backend.ensure_index()
        assert (backend.statistics().files_read, backend.statistics().documents) == (7, 5)
        zeppelins = await backend.search("zeppelins", SearchOptions())
        lyon = await backend.search("Rhône", SearchOptions())
        await backend.aclose()
    assert [s.url for s in zeppelins] == ["https://en.wikipedia.org/wiki/Berlin"]
    assert lyon == []


async def test_a_kept_index_is_not_read_again(tmp_path: Path) -> None:
    database = tmp_path / "index.sqlite3"
    with trio.fail_after(DEADLINE):
        first = LocalIndexBackend(WEB_INDEX, timeout_s=10, db_path=database)
        await first.ensure_index()
        await first.aclose()
        second = LocalIndexBackend(WEB_INDEX, timeout_s=10, db_path=database)
        await second.ensure_index()
        sources = await second.search("capital of France", SearchOptions())
        await second.aclose()
    assert second.statistics().files_read == 0
    assert sources[0].url == PARIS


async def test_a_search_before_ensure_index_builds_it() -> None:
    backend = build_backend("local", index_dir=WEB_INDEX, searxng_url=None, timeout_s=10)
    with trio.fail_after(DEADLINE):
        sources = await backend.search("capital of France", SearchOptions(context_size="low"))
        await backend.aclose()
        with pytest.raises(SearchFailed, match="closed"):
            await backend.search("capital of France", SearchOptions())
    assert sources[0].url == PARIS


async def test_a_missing_folder_fails_by_name(tmp_path: Path) -> None:
    backend = LocalIndexBackend(tmp_path / "absent", timeout_s=10)
    with trio.fail_after(DEADLINE), pytest.raises(SearchFailed, match="absent is not a folder"):
        await backend.ensure_index()


async def test_a_busy_index_fails_the_search_within_its_timeout(
    index: LocalIndexBackend,
) -> None:
    index.timeout_s = 0.2
    # Another worker holds the index (a slow query): the search waits at most timeout_s.
    with index._lock:
        with trio.fail_after(DEADLINE):
            with pytest.raises(SearchFailed, match=r"did not answer in 0\.2 s"):
                await index.search("capital of France", SearchOptions())
            with pytest.raises(SearchFailed, match=r"did not answer in 0\.2 s"):
                await index.open_page(PARIS)
    index.timeout_s = 10
    with trio.fail_after(DEADLINE):
        assert (await index.search("capital of France", SearchOptions()))[0].url == PARIS


async def test_a_cancel_during_a_busy_search_returns_at_once(index: LocalIndexBackend) -> None:
    index.timeout_s = 3600  # only the cancel can end it
    with index._lock, trio.fail_after(DEADLINE):
        with trio.move_on_after(0.1) as scope:
            await index.search("capital of France", SearchOptions())
        assert scope.cancelled_caught
