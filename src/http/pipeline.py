"""The one create pipeline every transport uses: parse -> inline files -> open -> subscribe.

Invariants:
- A transport only subscribes: it opens a response through the response supervisor and reads
  the response's event log; it never drives generation or touches another actor's state.
- A foreground response opened here subscribes to the request's lifetime
  (``lifetime.presence``): when the request ends before the response does (the client left at
  any point), the response task cancels itself with the reason "client disconnected". A
  background response does not: its subscribers come and go.
- The SSE writer never holds generation back: it reads the log, which the response task fills
  whatever the writer does. Each write carries every event pending since the last one.
- Refusals (``ApiError``, the job limits as 429) are raised before any byte of the answer,
  and nothing is left behind.
- A create counts as on its way to the model from when it is opened (``open_response``: its
  body read and parsed) until its sequence is admitted or it is refused, so that a burst's
  requests prefill together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from quart import request

from ..actors.event_log import EventLog
from ..actors.supervisor import TooManyJobs
from ..protocol.errors import ApiError
from ..protocol.objects import JsonObject
from ..protocol.request import CreateRequest
from .common import decode_json_body, runtime, tenant
from .file_inputs import inline_file_inputs
from .image_inputs import ImageSources, inline_image_inputs
from .lifetime import presence


def too_many_jobs(why: str) -> ApiError:
    return ApiError(
        429,
        "rate_limit_exceeded",
        f"Too many active background responses: {why}; retry after one finishes.",
        code="rate_limit_exceeded",
    )


async def read_body() -> object:
    """The request's JSON body, strictly decoded (read whole: a keep-alive stays usable)."""
    return decode_json_body(await request.get_data(cache=False, as_text=False))


def image_sources() -> ImageSources | None:
    """Where this request's images may come from; None on a text-only model."""
    rt = runtime()
    vision = rt.model.vision
    if vision is None:
        return None
    return ImageSources(rt.files, tenant(), vision, rt.settings.fetch_image_urls)


async def read_create_body() -> object:
    """The body, with ``input_file`` parts already turned into text and ``input_image`` parts
    accepted (``image_inputs.py``)."""
    body = await inline_file_inputs(await read_body(), runtime().files, tenant())
    return await inline_image_inputs(body, image_sources())


async def open_response(create: CreateRequest) -> EventLog:
    """Start ``create`` as a response task; its log once it exists. Raises ``ApiError``.

    The request counts as on its way to the model from here (its body read, its files and
    images inlined, parsed) until its sequence goes to the model or it is refused; the
    response task is handed the count and ends it. A burst's first request then reaches an
    idle model while the rest are still opened and prepared one after another on this thread,
    and the model waits for them (``thread.gather_bound``) instead of prefilling the first
    alone. Not earlier: a body still uploading, or an image still being fetched, may take
    seconds, and an idle model would wait for it to its bound."""
    # The response task owns this clone from here (and closes it when it ends).
    watching = None if create.config.background else presence()
    try:
        with runtime().model.arriving() as arrival:
            return await runtime().responses.open(create, watching, arrival)
    except TooManyJobs as exc:
        raise too_many_jobs(str(exc)) from None


async def final_object(log: EventLog) -> JsonObject:
    """Wait for the response's end; its final object."""
    await log.wait_closed()
    return log.snapshot()


async def follow(log: EventLog, start: int = 0) -> AsyncIterator[bytes]:
    """The log's events from ``start`` on as SSE, live, until the terminal event: one chunk per
    wake-up, with every event pending since the last one (under load a run publishes its
    deltas in bursts, ``pacing.delta_interval``, so a burst is one write)."""
    position = start
    while events := await log.wait_after(position):
        end = position + len(events)
        yield log.encoded(position, end)
        position = end
