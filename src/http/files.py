"""``/v1/files``: OpenAI's Files API over the file store actor (docs/files.md).

Invariants:
- Thin: the multipart body and the query are validated here and by the pure
  ``protocol.files``; state is reached only through ``FileStoreHandle``.
- ``POST /v1/files`` takes exactly the SDK's multipart parts: one file part ``file`` and the
  fields ``purpose`` (default ``user_data``) and ``expires_after[anchor]`` /
  ``expires_after[seconds]``; any other part, a repeated one, or a non-multipart body is a 400
  naming it. A refused upload stores nothing.
- A file over ``--files-max-file-bytes``, or one the store's whole budget (``--files-max-bytes``)
  cannot hold, is 413 ``file_too_large`` (param ``file``); so is a body over the server's
  request limit, which stops being read at that limit whatever its transfer encoding
  (``limits.CountedBody``); the part's size is checked before it is read into memory.
- Every route acts for the request's tenant (``common.tenant()``); another tenant's file id is
  404 exactly like an unknown one.
- ``GET /v1/files/{id}/content`` answers the stored bytes unchanged, with the upload's content
  type (or the one guessed from its name), ``nosniff`` and an attachment file name.
- Every route is mounted with and without the ``/v1`` prefix (as every route, ``common.mount``).
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Final
from urllib.parse import quote

import trio
from quart import Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..protocol.errors import ApiError, invalid_request
from ..protocol.files import (
    deleted_object,
    file_list,
    file_not_found,
    file_object,
    guess_content_type,
    page_files,
    parse_expires_after,
    parse_list_query,
    parse_purpose,
)
from .common import json_response, mount, tenant

if TYPE_CHECKING:
    from quart.datastructures import FileStorage
    from quart_trio import QuartTrio
    from werkzeug.datastructures import MultiDict

    from ..actors.file_store import FileStoreHandle
    from ..storage.files import StoredFile

FILE_PART: Final = "file"
FIELDS: Final = ("purpose", "expires_after[anchor]", "expires_after[seconds]")


def file_too_large(message: str) -> ApiError:
    return ApiError(413, "invalid_request_error", message, param="file", code="file_too_large")


def register_file_routes(app: QuartTrio, files: FileStoreHandle) -> None:
    """Mount the Files API on ``app``; ``files`` is its only state."""

    @mount(app, "/files", ["POST"])
    async def create_file() -> Response:
        try:
            return await _create_file(files)
        finally:
            await request.close()  # the parts' spool files, a cut-off one included

    @mount(app, "/files", ["GET"])
    async def list_files() -> Response:
        query = parse_list_query(request.args.to_dict(flat=False))
        held = await files.list(tenant(), query.purpose)
        return json_response(file_list(page_files(held, query)))

    @mount(app, "/files/<file_id>", ["GET"])
    async def retrieve_file(file_id: str) -> Response:
        return json_response(file_object(await _owned(files, file_id)))

    @mount(app, "/files/<file_id>/content", ["GET"])
    async def file_content(file_id: str) -> Response:
        return _content_response(await _owned(files, file_id))

    @mount(app, "/files/<file_id>", ["DELETE"])
    async def delete_file(file_id: str) -> Response:
        if not await files.delete(file_id, tenant()):
            raise file_not_found(file_id)
        return json_response(deleted_object(file_id))


async def _owned(files: FileStoreHandle, file_id: str) -> StoredFile:
    """The request's tenant's file ``file_id``; 404 for another tenant's exactly as an unknown."""
    record = await files.get(file_id, tenant())
    if record is None:
        raise file_not_found(file_id)
    return record


async def _create_file(files: FileStoreHandle) -> Response:
    """``POST /v1/files``: validate the multipart body, then store the one file part."""
    limits = files.limits
    if request.mimetype != "multipart/form-data":
        raise invalid_request(
            "POST /v1/files takes a multipart/form-data body with a 'file' part and a "
            f"'purpose' field; got Content-Type {request.content_type or 'none'!r}.",
            None,
        )
    try:
        form = await request.form
        uploads = await request.files
    except RequestEntityTooLarge:
        raise file_too_large(
            "The upload is larger than this server accepts: a request body may have at most "
            f"{request.max_content_length} bytes, a file at most {limits.max_file_bytes} "
            "bytes (--files-max-file-bytes)."
        ) from None
    upload = _the_upload(form, uploads)
    purpose = parse_purpose(_field(form, "purpose"))
    expires_after = parse_expires_after(
        _field(form, "expires_after[anchor]"),
        _field(form, "expires_after[seconds]"),
        ttl_seconds=limits.ttl_seconds,
    )
    # The parser spooled the part to a temporary file; its size is known before reading.
    size = await trio.to_thread.run_sync(_spooled_size, upload.stream)
    if size > limits.max_file_bytes:
        raise file_too_large(
            f"The file {upload.filename!r} has {size} bytes; files on this server may "
            f"have at most {limits.max_file_bytes} bytes (--files-max-file-bytes)."
        )
    data = await trio.to_thread.run_sync(upload.stream.read)
    filename = str(upload.filename)
    record = await files.put(
        filename=filename,
        purpose=purpose,
        content_type=upload.content_type or guess_content_type(filename),
        data=data,
        owner=tenant(),
        expires_after=expires_after,
    )
    if record is None:
        raise file_too_large(
            f"The file {filename!r} ({len(data)} bytes) does not fit the file store's "
            f"budget of {limits.max_bytes} bytes (--files-max-bytes)."
        )
    return json_response(file_object(record))


def _content_response(record: StoredFile) -> Response:
    """The stored bytes unchanged, as an attachment the browser must not sniff."""
    response = Response(record.data, status=200, content_type=record.content_type)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Disposition"] = (
        f"attachment; filename*=UTF-8''{quote(record.filename, safe='')}"
    )
    return response


def _the_upload(form: MultiDict[str, str], uploads: MultiDict[str, FileStorage]) -> FileStorage:
    """The one ``file`` part; 400 for a missing, repeated, unnamed or unknown part."""
    for key in uploads:
        if key != FILE_PART:
            raise invalid_request(f"Unknown file part: '{key}'; the upload part is 'file'.", key)
    for key in form:
        if key == FILE_PART:
            raise invalid_request(
                "'file' must be a file part with a filename, not a plain form field.", FILE_PART
            )
        if key not in FIELDS:
            raise invalid_request(
                f"Unknown parameter: '{key}'; POST /v1/files takes 'file', "
                f"{', '.join(repr(f) for f in FIELDS)}.",
                key,
            )
    found = uploads.getlist(FILE_PART)
    if not found:
        raise invalid_request("Missing required parameter: 'file'.", FILE_PART)
    if len(found) > 1:
        raise invalid_request(f"Invalid 'file': given {len(found)} times.", FILE_PART)
    (upload,) = found
    if not upload.filename:
        raise invalid_request("The 'file' part has no filename.", FILE_PART)
    return upload


def _spooled_size(stream: IO[bytes]) -> int:
    """The size of an uploaded part's spool file, left positioned at its start."""
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    return size


def _field(form: MultiDict[str, str], key: str) -> str | None:
    values = form.getlist(key)
    if len(values) > 1:
        raise invalid_request(f"Invalid '{key}': given {len(values)} times.", key)
    return values[0] if values else None
