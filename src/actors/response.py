"""The response actor: one response, from rendered prompt to stored final object.

Invariants:
- ``open_response`` does everything that can refuse a request (render, context check, model
  name, admission) before any event exists, so a refused request changes nothing.
- The actor runs in the task that drives it: for a foreground response that is its HTTP
  request's task (a hang-up cancels it; ``abandon`` in the caller's ``finally`` removes the
  sequence from the batch without awaiting, so it works from a cancelled or closed generator).
- Events come only from the pure ``ResponseMachine``, so numbering, pairing and the single
  terminal event hold by construction.
- With ``store`` the final object is put in the response store *before* the terminal event is
  handed out, so a client that reads the terminal event and then GETs finds it.
"""

from __future__ import annotations

import time

import trio

from ..model.loader import ChatMessage
from ..model.slot import SequenceOutput
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.ids import new_id
from ..protocol.machine import (
    Cancel,
    Fail,
    Finish,
    MachineInput,
    ResponseMachine,
    Start,
    TextDelta,
)
from ..protocol.objects import JsonObject, Usage
from ..protocol.request import CreateRequest
from ..storage.interface import StoredResponse
from .model import (
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelOverloaded,
    ModelUnavailable,
)
from .response_store import ResponseStoreHandle

# The temperature OpenAI applies when a request gives none.
DEFAULT_TEMPERATURE = 1.0


def render_messages(request: CreateRequest) -> list[ChatMessage]:
    """``instructions`` first, as a system message, then the input messages in order."""
    messages = []
    if request.config.instructions:
        messages.append(ChatMessage("system", request.config.instructions))
    messages.extend(ChatMessage(m.role, m.text) for m in request.input)
    return messages


class ResponseRun:
    """One running response. Drive it with ``next_events`` until it returns ``None``."""

    def __init__(
        self,
        request: CreateRequest,
        sequence: GenerationSequence,
        store: ResponseStoreHandle,
    ) -> None:
        self._request = request
        self._sequence = sequence
        self._store = store
        self._machine = ResponseMachine(new_id("resp"), request.config, int(time.time()))
        self._output_tokens = 0
        self._started = False

    @property
    def response_id(self) -> str:
        return self._machine.response_id

    @property
    def seq_id(self) -> int:
        return self._sequence.seq_id

    def snapshot(self) -> JsonObject:
        return self._machine.snapshot()

    def _usage(self) -> Usage:
        return Usage(input_tokens=self._sequence.prompt_tokens, output_tokens=self._output_tokens)

    async def next_events(self) -> list[JsonObject] | None:
        """The next events to publish (never empty); ``None`` after the terminal event."""
        if not self._started:
            self._started = True
            return self._machine.feed(Start())
        while not self._machine.terminal:
            output = await self._sequence.receive()
            events = await self._apply(output)
            if events:
                return events
        return None

    async def _apply(self, output: SequenceOutput) -> list[JsonObject]:
        events: list[JsonObject] = []
        if output.text:
            events += self._machine.feed(TextDelta(output.text))
        self._output_tokens += output.new_tokens
        if output.finish is None:
            return events
        terminal: MachineInput
        match output.finish:
            case "stop" | "length":
                terminal = Finish(output.finish, self._usage(), int(time.time()))
            case "cancelled":
                terminal = Cancel(self._usage())
            case "shutdown":
                terminal = Fail("server_error", "The server is shutting down.", self._usage())
            case "error":
                terminal = Fail("server_error", "The model failed while generating.", self._usage())
        closing = self._machine.feed(terminal)
        if self._request.config.store:
            # Shielded: a hang-up at this instant must not leave the store half-told.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._store.put(StoredResponse(self._machine.snapshot()))
        return events + closing

    async def run_to_end(self) -> JsonObject:
        """Drive to the terminal event without a listener; returns the final object."""
        while await self.next_events() is not None:
            pass
        return self._machine.snapshot()

    def abandon(self) -> None:
        """Called from the driver's ``finally``: free the model's work. Never blocks."""
        self._sequence.cancel()


def check_model(request: CreateRequest, model: ModelHandle) -> None:
    info = model.info
    if request.config.model not in (info.alias, info.path):
        raise not_found(
            f"The model '{request.config.model}' does not exist; this server serves "
            f"'{info.alias}'.",
            param="model",
            code="model_not_found",
        )


async def open_response(
    request: CreateRequest, model: ModelHandle, store: ResponseStoreHandle
) -> ResponseRun:
    """Validate against the model, render, admit. Raises ``ApiError`` and changes nothing."""
    check_model(request, model)
    prompt = await model.render(render_messages(request))
    window = model.info.context_window
    room = window - len(prompt)
    if room < 1:
        raise invalid_request(
            f"The input is {len(prompt)} tokens, which does not fit the model's context window "
            f"of {window} tokens.",
            "input",
            code="context_length_exceeded",
        )
    max_tokens = min(request.config.max_output_tokens or room, room)
    config = request.config
    temperature = DEFAULT_TEMPERATURE if config.temperature is None else config.temperature
    try:
        sequence = model.submit(
            GenerationRequest(
                prompt=tuple(prompt),
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=1.0 if config.top_p is None else config.top_p,
            )
        )
    except ModelUnavailable as exc:
        raise ApiError(503, "server_error", str(exc), code="server_shutting_down") from exc
    except ModelOverloaded as exc:
        raise ApiError(503, "server_error", str(exc), code="server_overloaded") from exc
    return ResponseRun(request, sequence, store)
