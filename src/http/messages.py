"""The ``/v1/messages`` routes: Anthropic's Messages encoding on the same actors.

Invariants:
- One pipeline: the body is decoded into the same ``CreateRequest`` the Responses route builds
  (``protocol/anthropic.py``), run by ``open_response`` on the same response and model actors,
  and only the events are re-encoded (``protocol/anthropic_stream.py``).
- Every refusal is Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}`` with
  Anthropic's status (503 overload -> 529 ``overloaded_error``): errors raised in these views
  are rendered here; errors the app answers before or around them (a bad API key, an unknown
  sub-route, a body over the size limit, an unexpected 500) are re-rendered by an
  ``after_request`` hook for these paths only. A refused request changes nothing.
- Lifetimes as on the Responses route: the response lives in its HTTP request; a hang-up
  cancels or closes the body, whose ``finally`` abandons the response, so the sequence leaves
  the batch at the next step. A stop sequence does the same as soon as it is seen.
- A stream has exactly one terminal (``message_stop`` or ``error``); while the model is busy
  elsewhere (a long prefill), a ``ping`` goes out every ``PING_INTERVAL_SECONDS``.
- ``message_start`` reports the prompt-cache read: it goes out with the response's
  first output (or its end), once the generation thread has consulted the cache for the
  sequence (``EventLog.cached_tokens``), so its usage split is the final one; if nothing
  comes for ``PING_INTERVAL_SECONDS``, it goes out then, with the split known by then.
- ``x-api-key`` authenticates like a bearer token (the app's hook maps it to the same tenant);
  ``anthropic-version`` and ``anthropic-beta`` are accepted and not interpreted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..actors.event_log import EventLog
from ..actors.prompt import prepare_prompt
from ..protocol.anthropic.request import (
    MessagesRequest,
    parse_count_tokens_request,
    parse_messages_request,
)
from ..protocol.anthropic.stream import PING, MessageEncoder, error_body, error_for_status
from ..protocol.errors import ApiError
from ..protocol.events.sse import encode_sse
from ..protocol.ids import new_id
from ..protocol.objects import JsonObject, Usage
from .common import json_response, mount, runtime, sse_response, tenant
from .image_inputs import inline_message_images
from .pipeline import image_sources, open_response, read_body
from .server_defaults import with_default_temperature

__all__ = ["PING_INTERVAL_SECONDS", "register_messages_routes"]

# Keep-alive while no event is ready; Anthropic's clients and proxies expect one now and then.
PING_INTERVAL_SECONDS = 10.0


def anthropic_error(status: int, message: str) -> Response:
    status, kind = error_for_status(status)
    return json_response(error_body(kind, message), status)


def _is_messages_path(path: str) -> bool:
    return any(
        path == root or path.startswith(f"{root}/") for root in ("/messages", "/v1/messages")
    )


_View = Callable[[], Awaitable[Response]]


def _anthropic_errors(view: _View) -> _View:
    @wraps(view)
    async def guarded() -> Response:
        try:
            return await view()
        except ApiError as error:
            return anthropic_error(error.status, error.message)
        except HTTPException as error:  # e.g. the body is over the size limit
            status = error.code or 500
            return anthropic_error(status, error.description or error.name)

    return guarded


def _encode(events: list[JsonObject]) -> bytes:
    return b"".join(encode_sse(event) for event in events)


def _translate(
    encoder: MessageEncoder, log: EventLog, events: list[JsonObject]
) -> list[JsonObject]:
    """Our events -> Anthropic's (a stop sequence is known once the log closed)."""
    out: list[JsonObject] = []
    for event in events:
        if event["type"] == "response.completed" and log.stop_sequence is not None:
            encoder.ended_at_stop_sequence(log.stop_sequence)
        out += encoder.feed(event)
    return out


async def anthropic_envelope(response: Response) -> Response:
    """Errors answered outside these views, re-rendered in Anthropic's envelope."""
    if (
        not _is_messages_path(request.path)
        or response.status_code < 400
        or response.mimetype != "application/json"
    ):
        return response
    try:
        data = json.loads(await response.get_data(as_text=True))
    except ValueError:
        data = {}
    if isinstance(data, dict) and data.get("type") == "error":
        return response  # already Anthropic's
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return anthropic_error(response.status_code, message or "The request failed.")


def _encoder_for(request_: MessagesRequest, input_tokens: int) -> MessageEncoder:
    return MessageEncoder(
        message_id=new_id("msg"),
        model=request_.model,
        input_tokens=input_tokens,
        max_tokens=request_.max_tokens,
        # Matched by the model actor on the generation thread, not here.
        stop_sequences=(),
        omit_thinking=request_.omit_thinking,
    )


async def _message_body() -> object:
    """The body, with its image blocks accepted (``image_inputs.py``)."""
    return await inline_message_images(await read_body(), image_sources())


@_anthropic_errors
async def create_message() -> Response:
    request_ = parse_messages_request(await _message_body(), owner=tenant())
    request_ = with_default_temperature(request_)  # --default-temperature
    if request_.max_tokens == 0:
        return await _empty_message(request_)
    log = await open_response(request_.create)
    encoder = _encoder_for(request_, log.prompt_tokens)
    if not request_.create.stream:
        await log.wait_closed()
        _translate(encoder, log, list(log.events))
        if encoder.error is not None:
            return anthropic_error(500, encoder.error[1])
        return json_response(encoder.message())
    return sse_response(_message_stream(encoder, log))


async def _empty_message(request_: MessagesRequest) -> Response:
    """``max_tokens`` 0: the prompt is validated and counted, nothing is generated."""
    rt = runtime()
    prepared = await prepare_prompt(request_.create, rt.actors, rt.responses)
    encoder = _encoder_for(request_, len(prepared.prompt))
    events = encoder.finish_empty(Usage(len(prepared.prompt), 0))
    if request_.create.stream:
        return sse_response(_once(_encode(events)))
    return json_response(encoder.message())


@_anthropic_errors
async def count_message_tokens() -> Response:
    request_ = parse_count_tokens_request(await _message_body(), owner=tenant())
    rt = runtime()
    prepared = await prepare_prompt(request_.create, rt.actors, rt.responses)
    return json_response({"input_tokens": len(prepared.prompt)})


def register_messages_routes(app: QuartTrio) -> None:
    app.after_request(anthropic_envelope)
    mount(app, "/messages", ["POST"])(create_message)
    mount(app, "/messages/count_tokens", ["POST"])(count_message_tokens)


# The response's opening events: they come before its sequence consulted the prompt cache.
PING_SSE = encode_sse(PING)
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})


async def _message_stream(encoder: MessageEncoder, log: EventLog) -> AsyncIterator[bytes]:
    """The response's events in Anthropic's encoding, with a ping while none is ready;
    ``message_start`` once the prompt-cache read is known (the first output, or the end)."""
    position = 0
    while not encoder.finished:
        events: list[JsonObject] = []
        with trio.move_on_after(PING_INTERVAL_SECONDS) as waited:
            events = await log.wait_after(position)
        if waited.cancelled_caught:
            # message_start comes with its own first ping.
            yield _encode(encoder.start(log.cached_tokens)) if not encoder.started else PING_SSE
            continue
        if not events:
            break
        position += len(events)
        if not encoder.started:
            if not log.closed and all(event["type"] in _OPENING for event in events):
                continue  # they add nothing to Anthropic's stream but message_start
            yield _encode(encoder.start(log.cached_tokens))
        if out := _translate(encoder, log, events):
            yield _encode(out)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
