"""The Files API objects and rules, and text extraction.

Pure: no I/O, no clock, no actor. The HTTP layer (``http/files.py``) parses with these and the
response actor turns an ``input_file`` into text with :func:`extract_text`.

Invariants:
- A file object is exactly the SDK's ``FileObject`` keys: ``id``, ``object: "file"``,
  ``bytes``, ``created_at``, ``expires_at`` (null without a TTL), ``filename``, ``purpose``,
  ``status: "processed"`` (uploads are processed synchronously) and ``status_details: null``.
- ``purpose`` on upload is one of ``PURPOSES`` (default ``user_data``); anything else is 400
  naming the value. A list filter accepts those plus OpenAI's other file purposes. The file
  object echoes only purposes of the SDK's ``FileObject`` literal: an ``evals`` upload (spec
  001) is kept and filtered as ``evals`` but shown as ``user_data`` (``ECHOED_PURPOSE``).
- Lists are OpenAI's cursor pages: ``limit`` 1-10,000 (default 10,000), ``order`` ``desc``
  (default, newest first) or ``asc`` by upload order, ``after`` an id on the list (else 404
  naming it); ``first_id``/``last_id`` ``""`` when the page is empty; ``has_more``.
- ``extract_text`` either returns the file's whole text or raises a 400 ``ApiError`` whose
  message names the file and its type; it never guesses past what it can decode:
  * text-like (the declared type is ``text/*``, JSON, XML, YAML, JavaScript and the like, or a
    known source/text file extension, or an untyped file whose bytes decode as UTF-8 and hold no
    NUL): the decoded text, in the declared ``charset`` or UTF-8, one leading BOM removed;
  * PDF (declared ``application/pdf``, or bytes that start with ``%PDF-``, or an untyped file
    named ``*.pdf``): the text of its pages in order, joined by blank lines (pypdf);
  * anything else, an undecodable text file, an unreadable or encrypted PDF, or a PDF without
    any text (a scan): 400.
"""

from __future__ import annotations

import codecs
import io
import mimetypes
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from . import listing
from .errors import ApiError, invalid_request, not_found
from .records import JsonObject, StoredFile

if TYPE_CHECKING:
    from pypdf import PdfReader

__all__ = [
    "DEFAULT_PURPOSE",
    "PURPOSES",
    "FileListQuery",
    "FilePage",
    "deleted_object",
    "extract_text",
    "file_list",
    "file_not_found",
    "file_object",
    "guess_content_type",
    "page_files",
    "parse_expires_after",
    "parse_list_query",
    "parse_purpose",
]

PURPOSES: Final = ("user_data", "vision", "assistants", "fine-tune", "evals")
DEFAULT_PURPOSE: Final = "user_data"
# Upload purposes the pinned SDK's FileObject literal lacks, and what the object shows instead.
ECHOED_PURPOSE: Final = {"evals": "user_data"}
# The SDK's FileObject purposes we never mint; a list filtered by one of them is simply empty.
_OTHER_PURPOSES: Final = ("assistants_output", "batch", "batch_output", "fine-tune-results")

MAX_LIST_LIMIT: Final = 10_000
# The SDK documents expires_after.seconds as 3600 (1 hour) to 2592000 (30 days).
MIN_EXPIRES_AFTER: Final = 3600
MAX_EXPIRES_AFTER: Final = 2_592_000

SUPPORTED_KINDS: Final = "text-like files (plain text, Markdown, JSON, CSV, source code) and PDF"

# -- objects --------------------------------------------------------------------------------


def file_object(record: StoredFile) -> JsonObject:
    """The SDK's ``FileObject`` for ``record``."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.size,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "filename": record.filename,
        "purpose": ECHOED_PURPOSE.get(record.purpose, record.purpose),
        "status": "processed",
        "status_details": None,
    }


def deleted_object(file_id: str) -> JsonObject:
    """The SDK's ``FileDeleted``."""
    return {"id": file_id, "object": "file", "deleted": True}


def file_not_found(file_id: str, param: str = "file_id") -> ApiError:
    """404 for an unknown, expired, evicted, deleted or other tenant's file."""
    return not_found(f"No such File object: '{file_id}'.", param=param)


# -- upload fields ----------------------------------------------------------------------------


def parse_purpose(value: str | None) -> str:
    """The upload's ``purpose`` (default ``user_data``); 400 naming any other value."""
    if value is None:
        return DEFAULT_PURPOSE
    if value not in PURPOSES:
        raise invalid_request(
            f"Invalid value for 'purpose': {value!r}; supported values are "
            f"{', '.join(repr(p) for p in PURPOSES)}.",
            "purpose",
        )
    return value


def parse_expires_after(
    anchor: str | None, seconds: str | None, *, ttl_seconds: float
) -> int | None:
    """``expires_after[anchor]`` / ``expires_after[seconds]`` (the SDK's multipart spelling):
    seconds after the upload, or None when absent. 400 when half given, out of the SDK's range
    (3600-2592000), or beyond the store's TTL (``ttl_seconds`` > 0), which it cannot extend."""
    if anchor is None and seconds is None:
        return None
    if anchor is None or seconds is None:
        missing = "expires_after[anchor]" if anchor is None else "expires_after[seconds]"
        raise invalid_request(f"Missing required parameter: '{missing}'.", missing)
    if anchor != "created_at":
        raise invalid_request(
            f"Invalid value for 'expires_after.anchor': {anchor!r}; the supported anchor is "
            "'created_at'.",
            "expires_after.anchor",
        )
    if not (seconds.isascii() and seconds.isdigit()) or not (
        MIN_EXPIRES_AFTER <= int(seconds) <= MAX_EXPIRES_AFTER
    ):
        raise invalid_request(
            f"Invalid value for 'expires_after.seconds': {seconds!r}; expected an integer from "
            f"{MIN_EXPIRES_AFTER} to {MAX_EXPIRES_AFTER}.",
            "expires_after.seconds",
        )
    value = int(seconds)
    if ttl_seconds > 0 and value > ttl_seconds:
        raise invalid_request(
            f"Invalid value for 'expires_after.seconds': {value}; files on this server expire "
            f"after at most {int(ttl_seconds)} seconds (--files-ttl-secs).",
            "expires_after.seconds",
        )
    return value


# -- lists ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileListQuery:
    limit: int = MAX_LIST_LIMIT
    order: Literal["asc", "desc"] = "desc"
    after: str | None = None
    purpose: str | None = None


@dataclass(frozen=True, slots=True)
class FilePage:
    data: tuple[StoredFile, ...]
    has_more: bool


def parse_list_query(args: Mapping[str, Sequence[str]]) -> FileListQuery:
    """``?limit=&order=&after=&purpose=`` (each key to all its values); other keys ignored."""
    base = listing.parse_list_query(args, default_limit=MAX_LIST_LIMIT, max_limit=MAX_LIST_LIMIT)
    purpose = listing.single(args, "purpose")
    if purpose is not None and purpose not in PURPOSES + _OTHER_PURPOSES:
        raise invalid_request(
            f"Invalid value for 'purpose': {purpose!r}; supported values are "
            f"{', '.join(repr(p) for p in PURPOSES + _OTHER_PURPOSES)}.",
            "purpose",
        )
    return FileListQuery(base.limit, base.order, base.after, purpose)


def page_files(files: Sequence[StoredFile], query: FileListQuery) -> FilePage:
    """A page of ``files`` (given in upload order) per ``query``; 404 if ``after`` is unknown."""
    base = listing.ListQuery(query.limit, query.order, query.after)
    found = listing.page(files, base, lambda f: f.id)
    if found is None:
        raise file_not_found(query.after or "", param="after")
    return FilePage(tuple(found[0]), found[1])


def file_list(page: FilePage) -> JsonObject:
    """OpenAI's list envelope (the SDK's ``CursorPage[FileObject]``)."""
    return listing.list_envelope([file_object(f) for f in page.data], page.has_more)


# -- content types and text extraction -------------------------------------------------------

# Types that say nothing about the content: the bytes and the name decide.
_GENERIC_TYPES: Final = frozenset(
    {
        "",
        "application/octet-stream",
        "binary/octet-stream",
        "application/binary",
        "application/x-binary",
        "application/unknown",
        "application/x-unknown",
        "application/download",
        "application/x-download",
        "application/force-download",
    }
)
_PDF_TYPES: Final = frozenset({"application/pdf", "application/x-pdf", "application/acrobat"})
_TEXT_APPLICATION_TYPES: Final = frozenset(
    {
        "application/json",
        "application/jsonl",
        "application/x-ndjson",
        "application/ndjson",
        "application/csv",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/typescript",
        "application/x-typescript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-toml",
        "application/sql",
        "application/x-sql",
        "application/graphql",
        "application/x-sh",
        "application/x-shellscript",
        "application/x-csh",
        "application/x-python",
        "application/x-perl",
        "application/x-ruby",
        "application/x-php",
        "application/x-httpd-php",
        "application/x-tex",
        "application/x-latex",
        "application/x-ipynb+json",
        "application/markdown",
        "application/x-markdown",
    }
)
_TEXT_SUFFIXES: Final = ("+json", "+xml", "+yaml", "+toml")
# Extensions of text and source files; they win over a misleading declared type (e.g. ``.ts``,
# which mimetypes calls ``video/mp2t``) when the bytes are text.
_TEXT_EXTENSIONS: Final = frozenset(
    """
    txt text md markdown mdx rst adoc asciidoc org tex bib log csv tsv json jsonl ndjson
    geojson ipynb xml xsd xsl svg html htm xhtml css scss sass less yaml yml toml ini cfg conf
    env properties lock py pyi pyx pxd ipy rb go rs java kt kts scala sc groovy gradle c h cc
    cpp cxx hpp hh hxx inl cs fs fsx fsi vb swift m mm js mjs cjs jsx ts mts cts tsx vue
    svelte astro php pl pm t r jl lua dart ex exs erl hrl hs lhs ml mli elm clj cljs cljc edn
    lisp el scm rkt nim zig v sv svh vhd vhdl sol move cairo asm s sh bash zsh fish ksh csh
    ps1 psm1 bat cmd sql graphql gql proto thrift avsc tf tfvars hcl nix cmake mk makefile
    dockerfile containerfile gitignore gitattributes editorconfig patch diff srt vtt
    """.split()
)


def guess_content_type(filename: str | None) -> str:
    """A content type for a file sent without one: from its name, else octet-stream."""
    if filename:
        guessed, _ = mimetypes.guess_type(filename, strict=False)
        if guessed:
            return guessed
        if _extension(filename) in _TEXT_EXTENSIONS:
            return "text/plain"
    return "application/octet-stream"


def extract_text(
    data: bytes,
    *,
    filename: str | None,
    content_type: str | None,
    param: str | None = None,
) -> str:
    """The text a model should read for a file, or a 400 ``ApiError`` naming its type.

    ``param`` is put on the error (e.g. ``input[0].content[1]``).
    """
    name = repr(filename) if filename else "the file"
    media, charset = _media_type(content_type)
    extension = _extension(filename)
    if _is_text_type(media):
        return _decode(data, charset, name, media, param)
    generic = media in _GENERIC_TYPES
    if media in _PDF_TYPES or data.startswith(b"%PDF-") or (generic and extension == "pdf"):
        return _pdf_text(data, name, param)
    if extension in _TEXT_EXTENSIONS and _looks_like_text(data):
        return _decode(data, charset, name, media or "text/plain", param)
    if generic:
        guessed = guess_content_type(filename)
        if _is_text_type(guessed) or (guessed in _GENERIC_TYPES and _looks_like_text(data)):
            return _decode(data, charset, name, guessed, param)
        media = guessed if guessed not in _GENERIC_TYPES else (media or guessed)
    raise invalid_request(
        f"Unsupported file type '{media}' for {name}: input_file accepts {SUPPORTED_KINDS}.",
        param,
        "unsupported_file_type",
    )


def _media_type(content_type: str | None) -> tuple[str, str | None]:
    """(lower-case ``type/subtype``, the ``charset`` parameter) of a Content-Type value."""
    if not content_type:
        return "", None
    media, *params = content_type.split(";")
    charset = None
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip('"') or None
    return media.strip().lower(), charset


def _is_text_type(media: str) -> bool:
    return (
        media.startswith("text/")
        or media in _TEXT_APPLICATION_TYPES
        or media.endswith(_TEXT_SUFFIXES)
    )


def _extension(filename: str | None) -> str:
    """The lower-case extension, or the whole lower-case base name when it has none
    (``Makefile``, ``Dockerfile``)."""
    if not filename:
        return ""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1].lower()
    stem, dot, extension = base.rpartition(".")
    return extension if dot and stem else base.lstrip(".")


def _looks_like_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _decode(data: bytes, charset: str | None, name: str, media: str, param: str | None) -> str:
    encoding = charset or "utf-8"
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        raise invalid_request(
            f"Unsupported charset '{encoding}' for {name} ({media}).",
            param,
            "unsupported_file_type",
        ) from None
    try:
        text = data.decode(codec.name)
    except UnicodeDecodeError as exc:
        raise invalid_request(
            f"The file {name} is declared as '{media}' but is not valid {codec.name} text "
            f"(byte {exc.start}).",
            param,
            "unsupported_file_type",
        ) from None
    return text.removeprefix("\ufeff")


def _pdf_text(data: bytes, name: str, param: str | None) -> str:
    # Imported on first use: pypdf costs ~150 ms at start-up and only PDFs need it.
    from pypdf import PdfReader

    try:
        try:
            reader = PdfReader(io.BytesIO(data))
        except Exception as exc:
            # No (findable) cross-reference table: let pypdf rebuild it from the objects.
            broken = "startxref" in str(exc) or b"startxref" not in data[-2048:]
            repaired = _repair_pdf(data) if broken else None
            if repaired is None:
                raise
            reader = PdfReader(io.BytesIO(repaired))
        if reader.is_encrypted and not _decrypts_without_password(reader):
            raise invalid_request(
                f"The PDF {name} is encrypted; upload it without a password.",
                param,
                "unsupported_file_type",
            )
        pages = [page.extract_text() for page in reader.pages]
    except ApiError:
        raise
    except Exception as exc:  # pypdf raises many kinds on a malformed file; all mean "unreadable"
        raise invalid_request(
            f"The file {name} could not be read as a PDF: {exc or type(exc).__name__}.",
            param,
            "unsupported_file_type",
        ) from None
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise invalid_request(
            f"The PDF {name} has no extractable text (a scanned document?); this server does "
            "not read text from images.",
            param,
            "unsupported_file_type",
        )
    return text


_PDF_OBJECT = re.compile(rb"(?m)^\s*(\d+)\s+(\d+)\s+obj\b")
_PDF_CATALOG = re.compile(rb"(\d+)\s+(\d+)\s+obj\s*<<(?:(?!endobj).)*?/Type\s*/Catalog", re.S)


def _repair_pdf(data: bytes) -> bytes | None:
    """A PDF without a cross-reference table (or its ``startxref``) made readable: pypdf
    rebuilds the table from the objects when ``startxref`` points nowhere useful, and needs a
    trailer naming the catalog. None when there is no catalog object to name."""
    tail = b""
    if b"trailer" not in data:
        catalog = _PDF_CATALOG.search(data)
        if catalog is None:
            return None
        size = 1 + max(int(m.group(1)) for m in _PDF_OBJECT.finditer(data))
        root = b"%s %s R" % (catalog.group(1), catalog.group(2))
        tail += b"\ntrailer\n<< /Size %d /Root %s >>" % (size, root)
    return data + tail + b"\nstartxref\n0\n%%EOF\n"


def _decrypts_without_password(reader: PdfReader) -> bool:
    try:
        return bool(reader.decrypt(""))
    except Exception:  # a missing crypto dependency or a bad file: not readable
        return False
