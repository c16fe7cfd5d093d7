"""The Files API's pure parts and its memory backend: objects, validation, paging, budgets,
expiry, owners, and text extraction (text-like files and a PDF this module writes by hand).

``make_pdf`` is importable by other tests that need a real PDF with known text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from openai.types import FileDeleted, FileObject

from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.files import (
    FileListQuery,
    deleted_object,
    extract_text,
    file_list,
    file_object,
    guess_content_type,
    page_files,
    parse_expires_after,
    parse_list_query,
    parse_purpose,
)
from mlx_responses.storage.files import (
    RECORD_OVERHEAD,
    FileLimits,
    MemoryFileStorage,
    StoredFile,
    charged_bytes,
)

from .conformance import unknown_keys

SENTENCE = "The quick brown fox jumps over the lazy dog."


# -- helpers ------------------------------------------------------------------------------------


def make_pdf(pages: list[list[str]]) -> bytes:
    """A valid PDF 1.4 (Helvetica, one text line per string) with correct xref offsets."""

    def escape(line: str) -> bytes:
        raw = line.encode("latin-1")
        return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")

    page_count = len(pages)
    # Objects: 1 catalog, 2 pages, 3 font, then (page, contents) per page.
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(page_count))
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {page_count} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, lines in enumerate(pages):
        shown = b" ".join(b"(" + escape(line) + b") '" for line in lines)
        content = b"BT /F1 12 Tf 72 720 Td 14 TL " + shown + b" ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def refusal(data: bytes, *, filename: str | None, content_type: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        extract_text(data, filename=filename, content_type=content_type, param="input[0]")
    error = caught.value
    assert error.status == 400
    assert error.type == "invalid_request_error"
    assert error.code == "unsupported_file_type"
    assert error.param == "input[0]"
    return error


def stored(
    file_id: str,
    data: bytes = b"hello",
    *,
    owner: str = "",
    purpose: str = "user_data",
    filename: str = "a.txt",
) -> StoredFile:
    return StoredFile(
        id=file_id,
        filename=filename,
        purpose=purpose,
        content_type="text/plain",
        data=data,
        created_at=1_700_000_000,
        expires_at=1_700_604_800,
        owner=owner,
    )


def strict_file_object(data: dict[str, Any]) -> FileObject:
    model = FileObject.model_validate_json(json.dumps(data), strict=True)
    assert not unknown_keys(model), unknown_keys(model)
    return model


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- text extraction: text-like files -------------------------------------------------------


@given(st.text())
def test_any_utf8_text_round_trips_when_declared_as_text(text: str) -> None:
    assume(not text.startswith("\ufeff"))
    data = text.encode("utf-8")
    for content_type in ("text/plain", "text/markdown; charset=utf-8", "application/json"):
        assert extract_text(data, filename="notes.txt", content_type=content_type) == text
    assert extract_text(data, filename="notes.md", content_type=None) == text
    assert extract_text(data, filename="main.py", content_type="application/octet-stream") == text


@given(st.text().filter(lambda t: "\x00" not in t and not t.startswith(("\ufeff", "%PDF-"))))
def test_untyped_unnamed_utf8_text_is_text(text: str) -> None:
    data = text.encode("utf-8")
    assert extract_text(data, filename=None, content_type=None) == text
    assert extract_text(data, filename="upload", content_type="application/octet-stream") == text


@given(
    st.one_of(st.binary(), st.binary().map(lambda b: b"%PDF-1.4\n" + b)),
    st.sampled_from([None, "a.pdf", "a.txt", "a.png", "blob"]),
    st.sampled_from([None, "application/pdf", "text/plain", "application/octet-stream"]),
)
def test_any_bytes_give_text_or_a_400(
    data: bytes, filename: str | None, content_type: str | None
) -> None:
    result: str | ApiError
    try:
        result = extract_text(data, filename=filename, content_type=content_type)
    except ApiError as error:
        result = error
    if isinstance(result, ApiError):
        assert (result.status, result.code) == (400, "unsupported_file_type")
    else:
        assert isinstance(result, str)


def test_a_leading_bom_is_dropped_and_a_declared_charset_is_used() -> None:
    assert extract_text(b"\xef\xbb\xbfhi", filename="a.txt", content_type="text/plain") == "hi"
    latin = "café, naïve".encode("latin-1")
    decoded = extract_text(latin, filename="a.txt", content_type="text/plain; charset=latin-1")
    assert decoded == "café, naïve"


@pytest.mark.parametrize(
    ("filename", "content_type"),
    [
        ("data.csv", "text/csv"),
        ("data.json", "application/json"),
        ("README.md", "text/markdown"),
        ("schema.graphql", "application/graphql"),
        ("feed.atom", "application/atom+xml"),
        ("app.ts", "video/mp2t"),  # mimetypes' name for .ts; the extension and bytes win
        ("lib.rs", None),
        ("main.go", "application/octet-stream"),
        ("Makefile", None),
        ("config.yaml", "application/x-yaml"),
    ],
)
def test_text_like_files_are_text(filename: str, content_type: str | None) -> None:
    body = 'fn main() {\n    println!("héllo");\n}\n'
    assert extract_text(body.encode(), filename=filename, content_type=content_type) == body


def test_unsupported_files_are_400_naming_the_type() -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
    assert "'image/png'" in refusal(png, filename="photo.png", content_type="image/png").message
    # No declared type: the type guessed from the name is the one named.
    assert "'image/png'" in refusal(png, filename="photo.png", content_type=None).message
    binary = bytes(range(256))
    error = refusal(binary, filename="blob", content_type="application/octet-stream")
    assert "'application/octet-stream'" in error.message
    assert "'blob'" in error.message
    assert "PDF" in error.message
    assert "Markdown" in error.message
    error = refusal(b"PK\x03\x04\x00", filename="a.docx", content_type=None)
    assert "wordprocessingml" in error.message or "octet-stream" in error.message
    assert "'audio/mpeg'" in refusal(b"ID3", filename="a.mp3", content_type="audio/mpeg").message


def test_text_that_does_not_decode_is_400() -> None:
    error = refusal(b"caf\xe9", filename="a.txt", content_type="text/plain")
    assert "not valid utf-8" in error.message
    assert "'a.txt'" in error.message
    error = refusal(b"x", filename="a.txt", content_type="text/plain; charset=no-such-charset")
    assert "no-such-charset" in error.message


# -- text extraction: PDF ---------------------------------------------------------------------


def test_a_pdf_gives_its_text_page_by_page() -> None:
    pdf = make_pdf([[SENTENCE, "Second line (with parentheses)."], ["Page two."]])
    for filename, content_type in (
        ("report.pdf", "application/pdf"),
        ("report.pdf", None),
        ("report.pdf", "application/octet-stream"),
        ("upload", None),  # the %PDF- signature alone
    ):
        text = extract_text(pdf, filename=filename, content_type=content_type)
        assert text == f"{SENTENCE}\nSecond line (with parentheses).\n\nPage two."


def test_unreadable_or_textless_pdfs_are_400() -> None:
    error = refusal(b"%PDF-1.4 not really", filename="bad.pdf", content_type="application/pdf")
    assert "could not be read as a PDF" in error.message
    assert "'bad.pdf'" in error.message
    error = refusal(make_pdf([[]]), filename="scan.pdf", content_type="application/pdf")
    assert "no extractable text" in error.message


# -- objects and validation ---------------------------------------------------------------------


def test_file_object_is_the_sdks_strictly() -> None:
    record = stored("file-abc", b"12345", filename="n\u00e9.txt")
    data = file_object(record)
    model = strict_file_object(data)
    assert model.bytes == 5
    assert model.status == "processed"
    assert data["expires_at"] == 1_700_604_800
    assert set(data) == set(FileObject.model_fields)
    deleted = FileDeleted.model_validate_json(json.dumps(deleted_object("file-abc")), strict=True)
    assert deleted.deleted
    assert not unknown_keys(deleted)


def test_purpose() -> None:
    assert parse_purpose(None) == "user_data"
    for purpose in ("user_data", "vision", "assistants", "fine-tune", "evals"):
        assert parse_purpose(purpose) == purpose
    with pytest.raises(ApiError) as caught:
        parse_purpose("batch")
    assert caught.value.param == "purpose"
    assert "'batch'" in caught.value.message
    assert caught.value.status == 400


def test_expires_after() -> None:
    week = 604800
    assert parse_expires_after(None, None, ttl_seconds=week) is None
    assert parse_expires_after("created_at", "3600", ttl_seconds=week) == 3600
    assert parse_expires_after("created_at", "2592000", ttl_seconds=0) == 2592000
    for anchor, seconds, param in (
        ("created_at", None, "expires_after[seconds]"),
        (None, "3600", "expires_after[anchor]"),
        ("last_active_at", "3600", "expires_after.anchor"),
        ("created_at", "3599", "expires_after.seconds"),
        ("created_at", "1e4", "expires_after.seconds"),
        ("created_at", "2592000", "expires_after.seconds"),  # beyond the store's TTL
    ):
        with pytest.raises(ApiError) as caught:
            parse_expires_after(anchor, seconds, ttl_seconds=week)
        assert caught.value.param == param, (anchor, seconds)


def test_list_query() -> None:
    assert parse_list_query({}) == FileListQuery(10_000, "desc", None, None)
    query = parse_list_query(
        {"limit": ["2"], "order": ["asc"], "after": ["file-x"], "purpose": ["vision"]}
    )
    assert query == FileListQuery(2, "asc", "file-x", "vision")
    assert parse_list_query({"purpose": ["batch"]}).purpose == "batch"  # valid, never held
    for args, param in (
        ({"limit": ["0"]}, "limit"),
        ({"limit": ["10001"]}, "limit"),
        ({"limit": ["-1"]}, "limit"),
        ({"order": ["up"]}, "order"),
        ({"after": [""]}, "after"),
        ({"purpose": ["nonsense"]}, "purpose"),
        ({"limit": ["1", "2"]}, "limit"),
    ):
        with pytest.raises(ApiError) as caught:
            parse_list_query(args)
        assert caught.value.param == param
        assert caught.value.status == 400


def test_paging() -> None:
    files = [stored(f"file-{i}") for i in range(5)]  # upload order
    newest_first = page_files(files, FileListQuery(limit=2))
    assert [f.id for f in newest_first.data] == ["file-4", "file-3"]
    assert newest_first.has_more
    rest = page_files(files, FileListQuery(limit=2, after="file-3"))
    assert [f.id for f in rest.data] == ["file-2", "file-1"]
    last = page_files(files, FileListQuery(limit=2, after="file-1"))
    assert [f.id for f in last.data] == ["file-0"]
    assert not last.has_more
    exact = page_files(files, FileListQuery(limit=5, order="asc"))
    assert [f.id for f in exact.data] == [f"file-{i}" for i in range(5)]
    assert not exact.has_more
    envelope = file_list(newest_first)
    assert (envelope["first_id"], envelope["last_id"]) == ("file-4", "file-3")
    assert envelope["object"] == "list"
    for item in envelope["data"]:
        strict_file_object(item)
    empty = file_list(page_files([], FileListQuery()))
    assert empty == {
        "object": "list",
        "data": [],
        "first_id": "",
        "last_id": "",
        "has_more": False,
    }
    with pytest.raises(ApiError) as caught:
        page_files(files, FileListQuery(after="file-gone"))
    assert (caught.value.status, caught.value.param) == (404, "after")


def test_guess_content_type() -> None:
    assert guess_content_type("a.pdf") == "application/pdf"
    assert guess_content_type("main.go") == "text/plain"
    assert guess_content_type("blob") == "application/octet-stream"
    assert guess_content_type(None) == "application/octet-stream"


# -- the memory backend -------------------------------------------------------------------------


def test_budget_evicts_least_recently_used_and_get_refreshes_but_list_does_not() -> None:
    one = charged_bytes(stored("file-a", b"x" * 100))
    storage = MemoryFileStorage(FileLimits(max_bytes=2 * one, ttl_seconds=0), clock=FakeClock())
    assert storage.put(stored("file-a", b"x" * 100))
    assert storage.put(stored("file-b", b"y" * 100))
    assert storage.get("file-a") is not None  # a is now the most recent
    assert [f.id for f in storage.list()] == ["file-a", "file-b"]  # no refresh, upload order
    assert storage.put(stored("file-c", b"z" * 100))
    assert storage.get("file-b") is None
    assert [f.id for f in storage.list()] == ["file-a", "file-c"]
    stats = storage.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (2, 2 * one, 1)


def test_charge_is_data_plus_metadata() -> None:
    record = stored("file-a", b"x" * 10, owner="bob", filename="é.txt")
    expected = 10 + len("file-a") + len("é.txt".encode()) + len("user_data")
    expected += len("text/plain") + len("bob") + RECORD_OVERHEAD
    assert charged_bytes(record) == expected


def test_oversized_files_are_refused_and_evict_nothing() -> None:
    storage = MemoryFileStorage(FileLimits(max_bytes=10_000, max_file_bytes=100, ttl_seconds=0))
    assert storage.put(stored("file-a", b"x" * 100))
    assert not storage.put(stored("file-b", b"x" * 101))  # over the per-file limit
    storage = MemoryFileStorage(FileLimits(max_bytes=1_000, max_file_bytes=5_000, ttl_seconds=0))
    assert storage.put(stored("file-a", b"x" * 10))
    assert not storage.put(stored("file-b", b"x" * 1_000))  # over the whole budget
    assert [f.id for f in storage.list()] == ["file-a"]
    assert storage.statistics().rejections == 1
    nothing = MemoryFileStorage(FileLimits(max_bytes=0))
    assert not nothing.put(stored("file-a", b""))


def test_ttl_and_per_file_lifetime() -> None:
    clock = FakeClock()
    storage = MemoryFileStorage(FileLimits(ttl_seconds=100), clock=clock)
    storage.put(stored("file-ttl"))
    storage.put(stored("file-short"), lifetime=10)
    clock.now += 9.999
    assert [f.id for f in storage.list()] == ["file-ttl", "file-short"]
    clock.now += 0.001
    assert storage.get("file-short") is None
    assert storage.get("file-ttl") is not None  # a get does not extend the TTL
    clock.now += 89.999
    assert [f.id for f in storage.list()] == ["file-ttl"]
    clock.now += 0.001
    assert storage.list() == ()
    stats = storage.statistics()
    assert (stats.entries, stats.bytes, stats.expirations) == (0, 0, 2)


def test_a_deleted_file_with_a_lifetime_is_not_expired_twice() -> None:
    clock = FakeClock()
    storage = MemoryFileStorage(FileLimits(ttl_seconds=0), clock=clock)
    storage.put(stored("file-a"), lifetime=10)
    assert storage.delete("file-a")
    assert not storage.delete("file-a")
    clock.now += 20
    assert storage.statistics().expirations == 0


def test_another_owner_sees_nothing_and_touches_nothing() -> None:
    one = charged_bytes(stored("file-a", owner="alice"))
    storage = MemoryFileStorage(FileLimits(max_bytes=2 * one, ttl_seconds=0))
    storage.put(stored("file-a", owner="alice"))
    storage.put(stored("file-b", owner="alice"))
    assert storage.get("file-a", "bob") is None
    assert storage.list("bob") == ()
    assert not storage.delete("file-a", "bob")
    assert storage.get("file-a") is None  # the open tenant "" is an owner like any other
    # Bob's get did not refresh alice's file-a, so it is still the least recent.
    storage.put(stored("file-c", owner="alice"))
    assert storage.get("file-a", "alice") is None
    assert [f.id for f in storage.list("alice")] == ["file-b", "file-c"]


def test_limits_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        FileLimits(max_bytes=-1)


@pytest.mark.parametrize(
    "ending",
    [
        b"trailer\n<< /Size 6 /Root 1 0 R >>\n%%EOF\n",  # no xref, no startxref
        b"%%EOF\n",  # no xref, no trailer
        b"",  # cut off after the last object
    ],
)
def test_a_pdf_without_a_cross_reference_table_is_repaired(ending: bytes) -> None:
    pdf = make_pdf([[SENTENCE], ["Page two"]])
    broken = pdf[: pdf.index(b"xref\n")] + ending
    text = extract_text(broken, filename="a.pdf", content_type="application/pdf", param="x")
    assert text == f"{SENTENCE}\n\nPage two"
