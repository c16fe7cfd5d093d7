"""The request-body limit, counted as the bytes arrive (``--max-request-bytes``).

Quart checks ``MAX_CONTENT_LENGTH`` against the ``Content-Length`` header and against the bytes
its body *buffers*. A reader that iterates the body (the multipart parser behind
``request.files``) empties that buffer chunk by chunk, so a ``Transfer-Encoding: chunked``
upload was never stopped: all of it was read, spooled and only then refused.

Invariants:
- :class:`CountedBody` counts every byte received for the request, whatever the transfer
  encoding and whether the body is awaited whole or iterated. Past the limit it drops what it
  holds, keeps nothing more, and the reader gets ``RequestEntityTooLarge`` (413) at its next
  read; the app answers at once and Hypercorn closes the connection (the body was not read to
  its end), so the rest of an oversized body is never read into memory.
- A body that declares a ``Content-Length`` over the limit is refused before any of it is read,
  as Quart already does.
"""

from __future__ import annotations

from typing import IO, Any

from quart.formparser import FormDataParser
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.formparser import default_stream_factory

__all__ = ["CountedBody", "CountedRequest"]


class CountedBody(TrioBody):
    """A request body whose size limit holds for the total received, not the buffer."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        self.received = 0

    def append(self, data: bytes) -> None:
        if data == b"" or self._must_raise is not None:
            return
        self.received += len(data)
        limit = self._max_content_length
        if limit is not None and self.received > limit:
            self._data.clear()  # nothing of an oversized body stays in memory
            self._must_raise = RequestEntityTooLarge()
            self.set_complete()
            return
        super().append(data)

    async def __anext__(self) -> bytes:
        try:
            return await super().__anext__()
        except StopAsyncIteration:
            # A reader that was waiting when the limit hit wakes to an empty, complete body:
            # that is the refusal, not the end of the body.
            if self._must_raise is not None:
                raise self._must_raise from None
            raise


class CountedRequest(TrioRequest):
    """Quart-Trio's request with :class:`CountedBody` (set as the app's ``request_class``).

    Multipart parts are spooled (to disk past 500 KiB) by files this request tracks, so
    :meth:`close` also closes a part whose upload was cut off by the limit; Quart itself never
    closes a request, so a route that parses a form calls it when done."""

    body_class = CountedBody

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spools: list[IO[bytes]] = []

    def make_form_data_parser(self) -> FormDataParser:
        parser = super().make_form_data_parser()
        parser.stream_factory = self._spool
        return parser

    def _spool(
        self,
        total_content_length: int | None,
        content_type: str | None,
        filename: str | None,
        content_length: int | None = None,
    ) -> IO[bytes]:
        spool = default_stream_factory(total_content_length, content_type, filename, content_length)
        self._spools.append(spool)
        return spool

    async def close(self) -> None:
        for spool in self._spools:
            spool.close()
        self._spools.clear()
        await super().close()
