"""The ``local`` web search backend: a folder of documents (.txt, .md, .html, .pdf) indexed
with SQLite FTS5, for offline machines and for the tests.

Why FTS5 rather than tantivy: it ships with Python's ``sqlite3`` (no new dependency, no
native wheel to build), ranks with BM25, and cuts snippets around the matched words itself;
a folder of documents an operator hands a local model is small enough for it.

Invariants:
- One SQLite connection, used only by worker threads holding ``_lock``; every wait on it
  (search, open_page) is bounded by ``timeout_s`` and a Trio cancel abandons the thread at once
  (``abandon_on_cancel``), so a cancelled search returns without waiting for SQLite.
- ``ensure_index`` is idempotent: a file whose size and modification time are unchanged is not
  read again; a changed one is read again; a removed one leaves the index. A cancel stops it
  between two files, each file's update committed whole.
- A document's URL is its first line ``URL: <url>`` when present (for HTML also its
  ``<link rel="canonical">``), else ``file://`` and its absolute path; its title is its first
  markdown heading, its HTML ``<title>``, else the file's stem. ``open_page`` answers the text
  of an indexed document by its URL, and nothing else.
- The user's query is never FTS5 syntax: its words are quoted and joined with OR, so
  punctuation, quotes or ``NEAR`` in a query cannot make it fail.
"""

from __future__ import annotations

import io
import logging
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import trio

from .web_search import Page, SearchFailed, SearchOptions, Source, html_document, select_sources

logger = logging.getLogger(__name__)

SUFFIXES = frozenset({".txt", ".md", ".markdown", ".html", ".htm", ".pdf"})
# Largest file read; a bigger one is left out of the index (logged).
MAX_FILE_BYTES = 32 * 1024 * 1024
# Rows fetched when allowed_domains filters them afterwards.
FILTERED_ROWS = 64
_URL_LINE = re.compile(r"^\s*URL:\s*(\S+)\s*$", re.IGNORECASE)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_WORD = re.compile(r"\w+")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files("
    " id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, stamp TEXT NOT NULL, url TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS files_url ON files(url)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS pages USING fts5(title, body, tokenize='porter unicode61')",
)
_SEARCH = (
    "SELECT files.url, pages.title, snippet(pages, 1, '', '', '…', 48) FROM pages"
    " JOIN files ON files.id = pages.rowid WHERE pages MATCH ?"
    " ORDER BY bm25(pages, 5.0, 1.0) LIMIT ?"
)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Document:
    url: str
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class IndexStatistics:
    documents: int
    files_read: int  # files read (and parsed) since this backend was made
    indexed: bool


def match_expression(query: str) -> str | None:
    """The FTS5 query for ``query``'s words, each quoted, any of them matching; None when it
    has no word."""
    words = list(dict.fromkeys(word.lower() for word in _WORD.findall(query)))[:32]
    if not words:
        return None
    return " OR ".join(f'"{word}"' for word in words)


def read_document(path: Path) -> Document:
    """The URL, title and text of one file (see the module's invariants)."""
    suffix = path.suffix.lower()
    absolute = path.resolve()
    if suffix == ".pdf":
        body, canonical, title = _pdf_text(absolute), "", ""
    elif suffix in (".html", ".htm"):
        page = html_document(absolute.read_text(encoding="utf-8", errors="replace"))
        body, canonical, title = page.text, page.canonical, page.title
    else:
        body, canonical = absolute.read_text(encoding="utf-8", errors="replace"), ""
        heading = _HEADING.search(body) if suffix in (".md", ".markdown") else None
        title = heading.group(1) if heading else ""
    body = body.removeprefix("\ufeff")
    first_line, _, rest = body.partition("\n")
    found = _URL_LINE.match(first_line)
    if found:  # the URL line wins over a canonical link
        canonical, body = found.group(1), rest
    url = canonical or absolute.as_uri()
    return Document(url=url, title=title.strip() or path.stem, text=body.strip())


def _pdf_text(path: Path) -> str:
    # Imported on first use: pypdf costs ~150 ms at start-up and only PDFs need it.
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(path.read_bytes()))
    pages = (page.extract_text() or "" for page in reader.pages)
    return "\n\n".join(text.strip() for text in pages if text.strip())


class LocalIndexBackend:
    """Searches and opens the documents of ``index_dir``; the index lives in memory unless
    ``db_path`` names a file to keep it in between starts."""

    def __init__(self, index_dir: Path, timeout_s: float, *, db_path: Path | None = None) -> None:
        self.index_dir = Path(index_dir)
        self.timeout_s = timeout_s
        self._db_path = db_path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._indexed = False
        self._files_read = 0
        self._documents = 0

    # ------------------------------------------------------------ the backend's API

    async def ensure_index(self) -> None:
        """Builds or refreshes the index in a worker thread; the caller scopes its time."""
        stop = threading.Event()
        try:
            await trio.to_thread.run_sync(self._refresh, stop, abandon_on_cancel=True)
        finally:
            stop.set()  # a cancelled refresh stops at the next file

    async def search(self, query: str, options: SearchOptions) -> list[Source]:
        expression = match_expression(query)
        if expression is None:
            return []
        limit = FILTERED_ROWS if options.allowed_domains else 8
        rows = await self._bounded(lambda: self._search_rows(expression, limit))
        found = [Source(url, title, snippet) for url, title, snippet in rows]
        return select_sources(found, options)

    async def open_page(self, url: str) -> Page:
        found = await self._bounded(lambda: self._page_row(url))
        if found is None:
            raise SearchFailed(f"no page at {url}")
        title, text = found
        return Page(url=url, title=title, text=text)

    async def aclose(self) -> None:
        self._closed = True
        with trio.move_on_after(self.timeout_s):
            await trio.to_thread.run_sync(self._close, abandon_on_cancel=True)

    def statistics(self) -> IndexStatistics:
        return IndexStatistics(self._documents, self._files_read, self._indexed)

    # ------------------------------------------------------------ Trio side

    async def _bounded(self, work: Callable[[], T]) -> T:
        """``work`` in a worker thread, after the index is built, within ``timeout_s``."""
        if self._closed:
            raise SearchFailed("the search index is closed")
        with trio.move_on_after(self.timeout_s):
            if not self._indexed:
                await self.ensure_index()
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        raise SearchFailed(f"the search index did not answer in {self.timeout_s:g} s")

    # ------------------------------------------------------------ worker threads

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise SearchFailed("the search index is closed")
        if self._conn is None:
            target = str(self._db_path) if self._db_path is not None else ":memory:"
            conn = sqlite3.connect(target, check_same_thread=False)
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.commit()
            except sqlite3.Error as exc:
                conn.close()
                raise SearchFailed(f"the search index could not be opened: {exc}") from None
            self._conn = conn
        return self._conn

    def _refresh(self, stop: threading.Event) -> None:
        if not self.index_dir.is_dir():
            raise SearchFailed(f"the web search index folder {self.index_dir} is not a folder")
        with self._lock:
            conn = self._connection()
            known = dict(conn.execute("SELECT path, stamp FROM files").fetchall())
            present: set[str] = set()
            for path in sorted(self.index_dir.rglob("*")):
                if stop.is_set():
                    return
                if path.suffix.lower() not in SUFFIXES or not path.is_file():
                    continue
                try:
                    key, stamp = str(path.resolve()), _stamp(path)
                except OSError:  # gone since the listing
                    continue
                present.add(key)
                if known.get(key) != stamp:
                    self._store(conn, path, key, stamp)
            for gone in known.keys() - present:
                _remove(conn, gone)
            conn.commit()
            self._documents = conn.execute("SELECT count(*) FROM files").fetchone()[0]
            self._indexed = True

    def _store(self, conn: sqlite3.Connection, path: Path, key: str, stamp: str) -> None:
        """Reads one file into the index (one transaction); logs and skips an unreadable one."""
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            document = read_document(path)
        except Exception as exc:  # a bad PDF raises many kinds; all mean "left out"
            logger.warning("web search index: %s left out: %s", path, exc)
            _remove(conn, key)
            conn.commit()
            return
        self._files_read += 1
        _remove(conn, key)
        cursor = conn.execute(
            "INSERT INTO files(path, stamp, url) VALUES (?, ?, ?)", (key, stamp, document.url)
        )
        conn.execute(
            "INSERT INTO pages(rowid, title, body) VALUES (?, ?, ?)",
            (cursor.lastrowid, document.title, document.text),
        )
        conn.commit()

    def _search_rows(self, expression: str, limit: int) -> list[tuple[str, str, str]]:
        with self._lock:
            try:
                rows = self._connection().execute(_SEARCH, (expression, limit)).fetchall()
            except sqlite3.Error as exc:
                raise SearchFailed(f"the search index failed: {exc}") from None
        return [(str(url), str(title), str(snippet)) for url, title, snippet in rows]

    def _page_row(self, url: str) -> tuple[str, str] | None:
        with self._lock:
            row = (
                self._connection()
                .execute(
                    "SELECT pages.title, pages.body FROM files JOIN pages"
                    " ON pages.rowid = files.id WHERE files.url = ? ORDER BY files.path LIMIT 1",
                    (url,),
                )
                .fetchone()
            )
        return None if row is None else (str(row[0]), str(row[1]))

    def _close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _stamp(path: Path) -> str:
    status = path.stat()
    return f"{status.st_mtime_ns}:{status.st_size}"


def _remove(conn: sqlite3.Connection, key: str) -> None:
    row = conn.execute("SELECT id FROM files WHERE path = ?", (key,)).fetchone()
    if row is not None:
        conn.execute("DELETE FROM pages WHERE rowid = ?", (row[0],))
        conn.execute("DELETE FROM files WHERE id = ?", (row[0],))
