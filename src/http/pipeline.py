"""The one create pipeline every transport uses: parse -> inline files -> open -> subscribe.

Invariants:
- A transport only subscribes: it opens a response through the response supervisor and reads
  the response's event log; it never drives generation or touches another actor's state.
- A foreground response opened here subscribes to the request's lifetime
  (``lifetime.presence``): when the request ends before the response does (the client left at
  any point), the response task cancels itself with the reason "client disconnected". A
  background response does not: its subscribers come and go.
- The SSE writer never holds generation back: it reads the log, which the response task fills
  whatever the writer does. Under load (more than ``COALESCE_ABOVE_STREAMS`` sequences
  decoding) it pauses after each write (``write_interval``, at most 50 ms), so one body chunk
  (one ASGI send) carries every event the stream produced meanwhile. The events are the same events,
  each whole, in order, with its own sequence number; only how many go into one write changes.
- Refusals (``ApiError``, the job limits as 429) are raised before any byte of the answer,
  and nothing is left behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import trio
from quart import request

from ..actors.event_log import EventLog
from ..actors.supervisor import TooManyJobs
from ..protocol.errors import ApiError
from ..protocol.objects import JsonObject
from ..protocol.request import CreateRequest
from .common import decode_json_body, runtime, tenant
from .file_inputs import inline_file_inputs
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


async def read_create_body() -> object:
    """The body, with ``input_file`` parts already turned into text."""
    return await inline_file_inputs(await read_body(), runtime().files, tenant())


async def open_response(create: CreateRequest) -> EventLog:
    """Start ``create`` as a response task; its log once it exists. Raises ``ApiError``."""
    # The response task owns this clone from here (and closes it when it ends).
    watching = None if create.config.background else presence()
    try:
        return await runtime().responses.open(create, watching)
    except TooManyJobs as exc:
        raise too_many_jobs(str(exc)) from None


async def final_object(log: EventLog) -> JsonObject:
    """Wait for the response's end; its final object."""
    await log.wait_closed()
    return log.snapshot()


# Under load the HTTP transport's cost per write (quart -> hypercorn -> h11 -> the socket) is
# most of the server's own work per token; fewer, fuller writes cut it (issue 12). The pause
# grows with the number of streams (each adds its writes), up to a bound a reader never notices.
COALESCE_ABOVE_STREAMS = 2
WRITE_INTERVAL_PER_STREAM_SECONDS = 0.003
MAX_WRITE_INTERVAL_SECONDS = 0.05


def write_interval(decoding: int) -> float:
    """The pause after a write while ``decoding`` sequences run (0: write as events come)."""
    if decoding <= COALESCE_ABOVE_STREAMS:
        return 0.0
    return min(MAX_WRITE_INTERVAL_SECONDS, WRITE_INTERVAL_PER_STREAM_SECONDS * decoding)


def follow(log: EventLog, start: int = 0) -> AsyncIterator[bytes]:
    """The log's events from ``start`` on as SSE, live, until the terminal event (call it in
    a request: it reads the model's load from the running server)."""
    model = runtime().model
    return write_events(log, start, lambda: write_interval(model.statistics().decoding))


async def write_events(
    log: EventLog, start: int, pause: Callable[[], float]
) -> AsyncIterator[bytes]:
    """One chunk per wake-up, with every event pending since the last one; the next wake-up
    is at least ``pause()`` seconds after a write (the log keeps filling meanwhile)."""
    position = start
    while events := await log.wait_after(position):
        end = position + len(events)
        yield log.encoded(position, end)
        position = end
        if not log.closed and (seconds := pause()) > 0:
            await trio.sleep(seconds)
