"""The WebSocket mode of ``/v1/responses``: the openai SDK's
``client.responses.connect()`` grammar, on the same pipeline as HTTP.

Invariants:
- A socket is just another subscriber: each ``response.create`` goes through the one create
  pipeline (``pipeline.open_response``), and its response's events are forwarded as JSON text
  frames, exactly the SSE events, with ``stream_id`` added when the create gave one.
- Lanes: creates with the same ``stream_id`` run one after another, in order; lanes run
  concurrently (in the model's batch). A refusal is an ``error`` event on its lane and ends that
  request, not the connection.
- Continuation: the connection keeps its latest response that finished (``completed`` or
  ``incomplete``, ``store: false`` included), so ``previous_response_id`` plus only the new items
  continues it; any other id is looked up in the store as over HTTP (unknown:
  ``previous_response_not_found``). A turn that fails or is cancelled evicts the kept response,
  and so does a refused continuation of it (Open Responses' failed-continuation rule); a
  continuation's tool output must answer a call of the kept history (or of its own input).
- Incremental prompts: the kept response carries its prompt as rendered and tokenized
  (``RenderedPrompt``, read from the response's log); a continuation hands it to the response
  task in its (frozen) request, which tokenizes only the text after what both renders share
  (``model/incremental_render.py``: the same ids as a full render) and keeps its own render on
  its log for the next turn.
- Lifetime: every response opened on the socket subscribes to the socket's lifetime, so closing
  the socket cancels them all (their sequences leave the batch at the next step). A connection
  lives ``--websocket-max-seconds``; then, once no response is running on it, it closes with
  1001 (the SDK and Codex reconnect). At
  shutdown the running responses end with their terminal event, then each socket is closed
  with 1001.
- Steering (``response.steer``): accepted for a response running on this connection; the
  response ends ``incomplete`` / ``steered`` (or finishes on its own first), and a successor
  with the target's settings continues from it with the steering input. When the target ends
  with function calls for the client to answer, the input stays queued
  (``response.steer.pending``) and is prepended to the next ``response.create`` that continues
  it. The connection owns this state; every task that touches it is one of the connection's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import Response, websocket

from ..actors.event_log import EventLog
from ..protocol.errors import ApiError, invalid_request
from ..protocol.ids import new_id
from ..protocol.items.read import FunctionCall, FunctionCallOutput, InputMessage
from ..protocol.objects import JsonObject
from ..protocol.prompt_memo import RenderedPrompt
from ..protocol.request import CreateRequest, parse_input
from .common import decode_json_body, error_response, runtime, sealer, tenant
from .file_inputs import inline_file_inputs
from .image_inputs import ImageSources, inline_image_inputs
from .pipeline import open_response
from .request_log import log_socket
from .schemas import parse_create_request
from .server_defaults import default_temperature

log = logging.getLogger(__name__)

# Close codes the openai SDK's reconnect logic understands (it reconnects on 1001).
GOING_AWAY = 1001
OUTBOX_SIZE = 64


@dataclass(frozen=True, slots=True)
class _Order:
    """One ``response.create`` for a lane."""

    body: JsonObject  # the POST body's fields (no type, stream_id, generate)
    stream_id: str | None
    generate: bool = True


@dataclass(frozen=True, slots=True)
class _Kept:
    """The connection's latest finished response: what a continuation replays."""

    response_id: str
    history: tuple[JsonObject, ...]
    # Its prompt as rendered and tokenized: a continuation tokenizes only what comes after it.
    rendered: RenderedPrompt | None = None


@dataclass(slots=True)
class _Running:
    log: EventLog
    order: _Order
    steers: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)  # (id, raw input)


def _check_call_outputs(history: tuple[JsonObject, ...], new: tuple[Any, ...]) -> None:
    """A continuation's tool outputs answer calls the continued history (or the new input
    itself) made: an output for no call is refused (Open Responses' failed-continuation rule)."""
    calls = {
        item.get("call_id")
        for item in history
        if item.get("type") in ("function_call", "custom_tool_call")
    }
    for index, item in enumerate(new):
        if isinstance(item, FunctionCall):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput) and item.call_id not in calls:
            raise invalid_request(
                f"No tool call found for function call output with call_id '{item.call_id}'.",
                f"input[{index}].call_id",
            )


async def responses_socket() -> Response | None:
    """``GET /v1/responses`` with a WebSocket upgrade."""
    rt = runtime()
    owner = tenant()
    if rt.settings.websocket_max_connections == 0:
        # The mode is off: a 404 is what makes a client fall back to HTTP (Codex CLI does on
        # 404 and 426, and retries a 429 until it gives up).
        return error_response(
            ApiError(
                404,
                "not_found_error",
                "The WebSocket mode is off on this server (--websocket-max-connections 0); "
                "use POST /v1/responses.",
                code="websocket_disabled",
            )
        )
    if not await rt.responses.open_socket(owner):
        return error_response(
            ApiError(
                429,
                "rate_limit_exceeded",
                f"Too many open WebSocket connections for this API key (at most "
                f"{rt.settings.websocket_max_connections}); close one first.",
                code="websocket_connection_limit_reached",
            )
        )
    connection = new_id("ws")
    started = time.perf_counter()
    log_socket("open", connection=connection, tenant=str(owner))
    try:
        await websocket.accept()
        await _Connection(owner, connection).serve()
    finally:
        await rt.responses.close_socket(owner)
        log_socket("close", connection=connection, tenant=str(owner), duration_ms=_ms(started))
    return None


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


class _Connection:
    def __init__(self, owner: str, connection: str) -> None:
        self._owner = owner
        self._connection = connection  # the request log's name for it
        self._runtime = runtime()
        self._sealer = sealer()
        self._temperature = default_temperature()
        self._send, self._outbox = trio.open_memory_channel[str](OUTBOX_SIZE)
        self._lanes: dict[str | None, trio.MemorySendChannel[_Order]] = {}
        self._running: dict[str, _Running] = {}
        self._idle = trio.Event()
        self._idle.set()
        self._kept: _Kept | None = None
        self._pending_steers: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
        self._sequence = 0  # numbers the connection's own events (steering)
        self._nursery: trio.Nursery | None = None
        # Frames handed to the outbox, and frames the writer has sent (``_close`` waits for
        # them to meet).
        self._emitted = 0
        self._written = 0

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write)
            nursery.start_soon(self._expire)
            nursery.start_soon(self._watch_shutdown)
            await self._read()
            nursery.cancel_scope.cancel()

    # -- frames out ------------------------------------------------------------------------

    async def _write(self) -> None:
        async with self._outbox:
            async for text in self._outbox:
                await websocket.send(text)
                self._written += 1

    async def _emit(self, event: Mapping[str, Any], stream_id: str | None = None) -> None:
        data = dict(event) if stream_id is None else {**event, "stream_id": stream_id}
        self._emitted += 1
        await self._send.send(json.dumps(data, ensure_ascii=False, separators=(",", ":")))

    async def _error(self, error: ApiError, stream_id: str | None) -> None:
        envelope = error.envelope()["error"]
        await self._emit({"type": "error", "status": error.status, "error": envelope}, stream_id)

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    async def _close(self, reason: str) -> None:
        # Let the frames already emitted go out first (queued, or in the writer's hands).
        with trio.move_on_after(self._runtime.settings.graceful_timeout):
            while self._written < self._emitted:  # noqa: ASYNC110
                await trio.sleep(0.005)
        await websocket.close(GOING_AWAY, reason)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _expire(self) -> None:
        await trio.sleep(self._runtime.settings.websocket_max_seconds)
        # A response running when the connection's life ends finishes on it first: a client
        # cannot pick up a running response on another connection (Codex CLI would retry the
        # turn from the start).
        while self._running:
            await self._idle.wait()
        await self._close("the connection reached its maximum lifetime; reconnect")

    async def _watch_shutdown(self) -> None:
        await self._runtime.wait_stopping()
        with trio.move_on_after(self._runtime.settings.graceful_timeout):
            await self._idle.wait()  # the running responses end with their terminal events
        await self._close("the server is shutting down")

    # -- frames in -------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            raw = await websocket.receive()
            try:
                event = decode_json_body(raw)
                if not isinstance(event, dict):
                    raise invalid_request("Each client event must be a JSON object.", None)
                kind = event.get("type")
                if kind == "response.create":
                    await self._create(event)
                elif kind == "response.steer":
                    await self._steer(event)
                else:
                    raise invalid_request(
                        f"Invalid value for 'type': {kind!r}; expected 'response.create' or "
                        "'response.steer'.",
                        "type",
                    )
            except ApiError as error:
                await self._error(error, None)

    async def _create(self, event: dict[str, Any]) -> None:
        body = {key: value for key, value in event.items() if key != "type"}
        stream_id = body.pop("stream_id", None)
        if stream_id is not None and not isinstance(stream_id, str):
            raise invalid_request("Invalid type for 'stream_id': expected a string.", "stream_id")
        generate = body.pop("generate", True)
        if not isinstance(generate, bool):
            raise invalid_request("Invalid type for 'generate': expected a boolean.", "generate")
        # Every response on the socket streams: `stream: true` (Codex sends it) says so
        # again; `false` asks for what the socket cannot do (docs/websocket.md).
        stream = body.pop("stream", True)
        if stream is not True:
            raise invalid_request(
                f"Invalid value for 'stream': {stream!r}. On the WebSocket every response "
                "streams; 'stream' may be omitted or true.",
                "stream",
            )
        if "background" in body:
            raise invalid_request(
                "Unknown parameter: 'background'. Background mode is not available on the "
                "WebSocket; use POST /v1/responses.",
                "background",
            )
        await self._lane(stream_id).send(_Order(body, stream_id, generate))

    def _lane(self, stream_id: str | None) -> trio.MemorySendChannel[_Order]:
        lane = self._lanes.get(stream_id)
        if lane is None:
            lane, orders = trio.open_memory_channel[_Order](OUTBOX_SIZE)
            self._lanes[stream_id] = lane
            assert self._nursery is not None
            self._nursery.start_soon(self._run_lane, orders)
        return lane

    async def _run_lane(self, orders: trio.MemoryReceiveChannel[_Order]) -> None:
        async with orders:
            async for order in orders:
                await self._respond(order)

    # -- one response ----------------------------------------------------------------------

    def _request(self, order: _Order) -> CreateRequest:
        rt = self._runtime
        create = parse_create_request(
            {**order.body, "stream": True},
            drop_unsupported_tools=rt.settings.drop_unsupported_tools,
            hosted=rt.settings.hosted_switches,
            owner=self._owner,
            sealer=self._sealer,
            default_temperature=self._temperature,
            background_key=self._runtime.settings.background_key,
        )
        previous = create.config.previous_response_id
        if previous is None:
            return dataclasses.replace(create, generate=order.generate, keep_render=True)
        queued = self._pending_steers.pop(previous, [])
        steering = tuple(item for _, raw in queued for item in parse_input(list(raw)))
        kept = self._kept if self._kept and self._kept.response_id == previous else None
        if kept is not None:
            _check_call_outputs(kept.history, create.input)
        return dataclasses.replace(
            create,
            input=steering + create.input,
            replay=kept.history if kept is not None else None,
            generate=order.generate,
            keep_render=True,
            previous_render=kept.rendered if kept is not None else None,
        )

    def _image_sources(self) -> ImageSources | None:
        vision = self._runtime.model.vision
        if vision is None:
            return None
        return ImageSources(
            self._runtime.files, self._owner, vision, self._runtime.settings.fetch_image_urls
        )

    async def _respond(self, order: _Order) -> None:
        started = time.perf_counter()
        try:
            inlined = await inline_file_inputs(order.body, self._runtime.files, self._owner)
            inlined = await inline_image_inputs(inlined, self._image_sources())
            assert isinstance(inlined, dict)
            response_log = await open_response(
                self._request(dataclasses.replace(order, body=inlined))
            )
        except ApiError as error:
            previous = order.body.get("previous_response_id")
            if error.code == "previous_response_not_found" or (
                self._kept is not None and previous == self._kept.response_id
            ):
                self._kept = None  # a refused continuation evicts what it continued
            self._log_create(order, started, error.status, None, error.code or error.type)
            await self._error(error, order.stream_id)
            return
        running = _Running(response_log, order)
        self._running[response_log.response_id] = running
        self._idle = trio.Event()
        try:
            position = 0
            while events := await response_log.wait_after(position):
                position += len(events)
                for event in events:
                    await self._emit(event, order.stream_id)
        finally:
            del self._running[response_log.response_id]
            if not self._running:
                self._idle.set()
            final = response_log.final or {}
            outputs = tuple(str(item.get("type")) for item in final.get("output") or ())
            self._log_create(
                order, started, 200, response_log.response_id, final.get("status"), outputs
            )
        await self._finished(running)

    def _log_create(
        self,
        order: _Order,
        started: float,
        status: int,
        response_id: str | None,
        outcome: object,
        outputs: tuple[str, ...] = (),
    ) -> None:
        log_socket(
            "response.create",
            connection=self._connection,
            status=status,
            duration_ms=_ms(started),
            response_id=response_id,
            response_status=outcome,  # the response's terminal status, or the refusal's code
            generate=order.generate,
            output=list(outputs),  # the output items' types, e.g. ["compaction"]
            tenant=str(self._owner),
        )

    async def _finished(self, running: _Running) -> None:
        final = running.log.final or {}
        response_id = running.log.response_id
        if final.get("status") in ("completed", "incomplete"):
            history = running.log.input_items + tuple(final.get("output") or ())
            self._kept = _Kept(response_id, history, running.log.rendered)
        else:
            self._kept = None  # a failed or cancelled turn is no continuation point
        if not running.steers:
            return
        calls = [i for i in final.get("output") or () if i.get("type") == "function_call"]
        if final.get("status") in ("completed", "incomplete") and calls:
            # The client owes tool output: keep the input for its explicit continuation.
            self._pending_steers.setdefault(response_id, []).extend(running.steers)
            stubs = [{"type": "function_call_output", "call_id": c["call_id"]} for c in calls]
            for steer_id, _ in running.steers:
                await self._emit(
                    {
                        "type": "response.steer.pending",
                        "sequence_number": self._next_sequence(),
                        "reason": "waiting_for_required_input",
                        "required_input": stubs,
                        "steer": {"id": steer_id, "previous_response_id": response_id},
                    },
                    running.order.stream_id,
                )
            return
        if self._kept is None:
            for steer_id, raw in running.steers:
                await self._steer_failed(
                    steer_id,
                    response_id,
                    list(raw),
                    "successor_creation_failed",
                    f"Response '{response_id}' ended {final.get('status')}; its steering input "
                    "was not applied.",
                )
            return
        # The successor: the target's settings, continuing from it with the steering input.
        steering = [item for _, raw in running.steers for item in raw]
        body = {**running.order.body, "previous_response_id": response_id, "input": steering}
        await self._respond(_Order(body, running.order.stream_id))

    # -- steering --------------------------------------------------------------------------

    async def _steer(self, event: dict[str, Any]) -> None:
        extra = set(event) - {"type", "previous_response_id", "input"}
        if extra:
            key = sorted(extra)[0]
            raise invalid_request(f"Unknown parameter: '{key}' (response.steer).", key)
        target = event.get("previous_response_id")
        if not isinstance(target, str):
            raise invalid_request(
                "Missing required parameter: 'previous_response_id'.", "previous_response_id"
            )
        raw = event.get("input")
        steer_id = new_id("steer")
        items = [raw] if isinstance(raw, str) else raw
        try:
            parsed = parse_input(raw)
            if not all(isinstance(i, InputMessage) and i.role == "user" for i in parsed):
                raise invalid_request("Steering input may hold only user messages.", "input")
        except ApiError as error:
            await self._steer_failed(steer_id, target, raw, "invalid_input", error.message)
            return
        steering = tuple(
            {"role": "user", "content": item} if isinstance(item, str) else item
            for item in items or ()
        )
        running = self._running.get(target)
        if running is None:
            known = self._kept is not None and self._kept.response_id == target
            code = "response_already_completed" if known else "response_not_found"
            message = (
                f"Response '{target}' has already completed."
                if known
                else f"Response '{target}' is not running on this connection."
            )
            await self._steer_failed(steer_id, target, list(steering), code, message)
            return
        running.steers.append((steer_id, steering))
        await self._emit(
            {
                "type": "response.steer.accepted",
                "sequence_number": self._next_sequence(),
                "steer": {"id": steer_id, "previous_response_id": target},
            },
            running.order.stream_id,
        )
        # Ends it incomplete/steered at its next step; if it finished meanwhile, its own end
        # starts the successor all the same.
        await self._runtime.responses.steer(target, self._owner)

    async def _steer_failed(
        self, steer_id: str, target: str, given: Any, code: str, message: str
    ) -> None:
        """The steering input returned uncommitted (as it was given)."""
        await self._emit(
            {
                "type": "response.steer.failed",
                "sequence_number": self._next_sequence(),
                "error": {"code": code, "message": message, "type": "invalid_request_error"},
                "steer": {
                    "id": steer_id,
                    "previous_response_id": target,
                    "input": given,
                },
            }
        )
