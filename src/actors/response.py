"""The response actor: one response, from rendered prompt to stored final object.

Invariants:
- ``prepare_prompt`` and ``open_response`` do everything that can refuse a request (model name,
  history lookup, render, context check, admission) before any event exists, so a refused
  request changes nothing: nothing stored, no conversation turn.
- The actor runs in the task that drives it: for a foreground response that is its HTTP
  request's task (a hang-up cancels it; ``abandon`` in the caller's ``finally`` removes the
  sequence from the batch without awaiting, so it works from a cancelled or closed generator).
- Events come only from the pure ``ResponseMachine``, so numbering, pairing and the single
  terminal event hold by construction. Every event is also appended to the response's
  ``EventLog``, from which a ``GET ?stream=true`` replays and follows it live.
- At the terminal event, in this order: the final record goes to the response store (with
  ``store``), the turn is appended to the conversation (when there is output), then the
  terminal events are published and the log closes. A client that reads the terminal event and
  then GETs the response finds it.
- Automatic compaction (``context_management``, issue 6) happens before admission: for a
  foreground response inside ``open_response`` (a refusal is an HTTP error), for a background
  one inside its job (``ResponseRun`` is created unadmitted and admits itself on its first
  ``next_events``; a refusal ends it ``failed`` with ``invalid_prompt``, the cancel endpoint
  stops the compaction and ends it ``cancelled``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ..model.chat import ChatMessage, to_chat
from ..model.constrain import Constraints, Grammar, InvalidSchema, make_logits_processor
from ..model.penalties import sampling_adjust, with_adjustments
from ..model.slot import SequenceOutput
from ..model.stream_parse import StreamParser
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.history import input_items, items_from_json
from ..protocol.ids import new_id
from ..protocol.machine import (
    Cancel,
    Compacted,
    Fail,
    Finish,
    MachineInput,
    ResponseMachine,
    Start,
)
from ..protocol.objects import JsonObject, ResponseErrorCode, Usage
from ..protocol.request import CreateRequest
from ..protocol.tools import call_targets
from ..storage.interface import StoredResponse
from .conversation_store import ConversationStoreHandle
from .live import EventLog, LiveRegistryHandle

if TYPE_CHECKING:
    from .jobs import JobSupervisorHandle
    from .reasoning_echo import ReasoningEchoHandle
from .model import (
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelOverloaded,
    ModelUnavailable,
)
from .output import OutputShaper
from .response_store import ResponseStoreHandle

# The temperature OpenAI applies when a request gives none.
DEFAULT_TEMPERATURE = 1.0
STORE_DEADLINE_SECONDS = 5
# The store bytes a background job is assumed to need per token of its output budget.
BYTES_PER_TOKEN = 16


@dataclass(frozen=True, slots=True)
class Services:
    """The handles a response actor talks to."""

    model: ModelHandle
    store: ResponseStoreHandle
    conversations: ConversationStoreHandle
    live: LiveRegistryHandle
    jobs: JobSupervisorHandle
    # How long a store: false background job's final object stays readable (spec 000).
    ephemeral_ttl_seconds: float = 600.0
    # Puts the reasoning of earlier plain replies back into replayed histories (spec 000).
    echo: ReasoningEchoHandle | None = None


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A request resolved against its history and rendered."""

    history: tuple[JsonObject, ...]  # items replayed before this request's input
    new_items: tuple[JsonObject, ...]  # this request's input, ids assigned
    prompt: tuple[int, ...]

    @property
    def all_items(self) -> tuple[JsonObject, ...]:
        return self.history + self.new_items


@dataclass(frozen=True, slots=True)
class Admission:
    """A response's prompt admitted to the batch: what it generates from."""

    prepared: PreparedPrompt
    sequence: GenerationSequence
    shaper: OutputShaper
    compaction: Compacted | None = None  # the history was compacted first


def check_model(request: CreateRequest, model: ModelHandle) -> None:
    info = model.info
    if request.config.model not in (info.alias, info.path):
        raise not_found(
            f"The model '{request.config.model}' does not exist; this server serves "
            f"'{info.alias}'.",
            param="model",
            code="model_not_found",
        )


def persistence_disabled(what: str) -> ApiError:
    return invalid_request(
        f"{what} is not available: response persistence is disabled on this server "
        "(--responses-store-max-entries 0).",
        None,
    )


async def load_history(request: CreateRequest, services: Services) -> tuple[JsonObject, ...]:
    """The items a ``previous_response_id`` or ``conversation`` replays (decision 9)."""
    config = request.config
    if config.previous_response_id is not None:
        previous_id = config.previous_response_id
        if not services.store.enabled:
            raise persistence_disabled("previous_response_id")
        record = await services.store.get(previous_id, request.owner)
        running = (
            None if record is not None else await services.live.find(previous_id, request.owner)
        )
        if running is not None and not running.closed:
            status = running.snapshot()["status"]
            raise invalid_request(
                f"previous response '{previous_id}' has not finished (status: {status})",
                "previous_response_id",
            )
        if record is None:
            raise invalid_request(
                f"Previous response with id '{previous_id}' not found. It may have been "
                "created with store: false, deleted, or evicted from the store.",
                "previous_response_id",
                code="previous_response_not_found",
            )
        return record.input_items + tuple(record.response.get("output", ()))
    if config.conversation_id is not None:
        conversation_id = config.conversation_id
        if not services.conversations.enabled:
            raise invalid_request(
                "conversation is not available: the conversation store is disabled on this "
                "server (--conversation-store-max-entries 0).",
                "conversation",
            )
        conversation = await services.conversations.get(conversation_id, request.owner)
        if conversation is None:
            raise not_found(
                f"Conversation with id '{conversation_id}' not found.",
                param="conversation",
                code="conversation_not_found",
            )
        return conversation.items
    return ()


async def render_messages(
    request: CreateRequest, services: Services, items: tuple[JsonObject, ...]
) -> list[ChatMessage]:
    """``instructions`` first (merged into the system message), then the items, with the
    reasoning of earlier plain replies echoed back where a replay dropped it."""
    parsed = items_from_json(items)
    if services.echo is not None:
        parsed = await services.echo.restore(request.owner, parsed)
    return to_chat(request.config.instructions, parsed)


async def render_items(
    request: CreateRequest, services: Services, items: tuple[JsonObject, ...]
) -> tuple[int, ...]:
    """The token ids of ``items`` rendered as ``request`` renders (instructions, tools)."""
    # With tool_choice "none" the model is not told about the tools at all.
    offered = request.tools if request.tool_choice.mode != "none" else ()
    try:
        prompt = await services.model.render(
            await render_messages(request, services, items),
            [tool.for_template() for tool in offered] or None,
            request.template_kwargs,
        )
    except Exception as exc:  # the template's own error (Jinja, a raise_exception call, ...)
        raise invalid_request(
            f"The model's chat template could not render this input: {exc}",
            "input",
            code="invalid_prompt",
        ) from exc
    return tuple(prompt)


async def prepare_prompt(request: CreateRequest, services: Services) -> PreparedPrompt:
    """Resolve history and render; raises ``ApiError`` and changes nothing."""
    check_model(request, services.model)
    history = await load_history(request, services)
    new_items = input_items(request.input)
    prompt = await render_items(request, services, history + new_items)
    return PreparedPrompt(history, new_items, prompt)


def config_background_ephemeral(request: CreateRequest) -> bool:
    return request.config.background and not request.config.store


class ResponseRun:
    """One running response. Drive it with ``next_events`` until it returns ``None``."""

    def __init__(
        self,
        request: CreateRequest,
        prepared: PreparedPrompt,
        services: Services,
        max_tokens: int = 0,
        *,
        admission: Admission | None = None,
        admit: Callable[[], Awaitable[Admission]] | None = None,
    ) -> None:
        """Give ``admission`` (admitted already), or ``admit``: run by the first
        ``next_events``, in the driver's task (a background job's compaction)."""
        assert (admission is None) != (admit is None)
        self._request = request
        self._prepared = prepared
        self._admission = admission
        self._admit = admit
        self._admitting = trio.CancelScope()  # cancelled by the cancel endpoint while admitting
        self._services = services
        self._machine = ResponseMachine(
            new_id("resp"),
            request.config,
            int(time.time()),
            seal=request.seal,  # issue 13
        )
        self.log = EventLog(
            self._machine.response_id, self._machine.snapshot, self.cancel, request.owner
        )
        self._output_tokens = 0
        self._started = False
        self._estimate = 2048 + len(json.dumps(prepared.all_items)) + BYTES_PER_TOKEN * max_tokens

    @property
    def _sequence(self) -> GenerationSequence:
        assert self._admission is not None, "the response is not admitted yet"
        return self._admission.sequence

    @property
    def _shaper(self) -> OutputShaper:
        assert self._admission is not None, "the response is not admitted yet"
        return self._admission.shaper

    @property
    def prompt_tokens(self) -> int:
        """The tokens of the prompt generation runs on (0 until admitted)."""
        return 0 if self._admission is None else self._admission.sequence.prompt_tokens

    @property
    def response_id(self) -> str:
        return self._machine.response_id

    def snapshot(self) -> JsonObject:
        return self._machine.snapshot()

    def usage(self) -> Usage:
        """Token counts so far (final once the terminal event was sent)."""
        if self._admission is None:
            return Usage(0, 0)
        reasoning = self._services.model.count_tokens(self._shaper.reasoning_text)
        return Usage(
            input_tokens=self._sequence.prompt_tokens,
            output_tokens=self._output_tokens,
            reasoning_tokens=min(reasoning, self._output_tokens),
        )

    def _start(self) -> Start:
        return Start(self._admission.compaction if self._admission is not None else None)

    async def next_events(self) -> list[JsonObject] | None:
        """The next events to publish (never empty); ``None`` after the terminal event."""
        if self._admission is None and not self._machine.terminal:
            refused = await self._admit_now()
            if refused is not None:
                return refused
        if not self._started and not self._request.config.background:
            # A foreground response is in progress from the start (OpenAI sends created and
            # in_progress at once); a background one stays queued until the model reports work.
            self._started = True
            return self._publish(self._machine.feed(self._start()))
        while not self._machine.terminal:
            output = await self._sequence.receive()
            events = await self._apply(output)
            if events:
                return events
        return None

    async def _admit_now(self) -> list[JsonObject] | None:
        """Run the deferred admission; the terminal events when it was refused or cancelled."""
        assert self._admit is not None
        ending: MachineInput | None = None
        with self._admitting:
            try:
                self._admission = await self._admit()
            except ApiError as error:
                # Spec 000: a refused compaction or render ends the job invalid_prompt.
                code: ResponseErrorCode = (
                    "invalid_prompt" if error.status == 400 else "server_error"
                )
                ending = Fail(code, error.message, None)
        if self._admitting.cancelled_caught:
            ending = Cancel(None)
        if ending is None:
            return None
        return await self._end(ending, [])

    def _publish(self, events: list[JsonObject]) -> list[JsonObject]:
        self.log.append(events)
        return events

    async def _apply(self, output: SequenceOutput) -> list[JsonObject]:
        events: list[JsonObject] = []
        working = output.prefill_done or output.text or output.finish in ("stop", "length")
        if not self._started and working:
            self._started = True
            events += self._machine.feed(self._start())
        for step in self._shaper.feed(output.text, output.logprobs):
            events += self._machine.feed(step)
        self._output_tokens += output.new_tokens
        if output.finish is None:
            return self._publish(events)
        terminal: MachineInput
        match output.finish:
            case "stop" | "length":
                for step in self._shaper.finish():
                    events += self._machine.feed(step)
                terminal = Finish(output.finish, self.usage(), int(time.time()))
            case "cancelled":
                terminal = Cancel(self.usage())
            case "shutdown":
                terminal = Fail("server_error", "The server is shutting down.", self.usage())
            case "error":
                terminal = Fail("server_error", "The model failed while generating.", self.usage())
        return await self._end(terminal, events)

    async def _end(self, terminal: MachineInput, events: list[JsonObject]) -> list[JsonObject]:
        """Publish ``events``, then the terminal ones after the records are written."""
        self.log.append(events)
        closing = self._machine.feed(terminal)
        # Shielded: a hang-up at this instant must not leave the store or the conversation
        # half-told.
        with trio.CancelScope(shield=True), trio.move_on_after(STORE_DEADLINE_SECONDS):
            await self._finish_records(closing)
        self._publish(closing)
        if config_background_ephemeral(self._request):
            self.log.retain_until = trio.current_time() + self._services.ephemeral_ttl_seconds
        self.log.close()
        return events + closing

    async def _finish_records(self, closing: list[JsonObject]) -> None:
        final = self._machine.snapshot()
        config = self._request.config
        if config.store and self._services.store.enabled:
            record = StoredResponse(
                final,
                self._prepared.all_items,
                self.log.events + tuple(closing),
                self._request.owner,
            )
            await self._services.store.put(record)
            if (
                config.background
                and await self._services.store.get(record.id, record.owner) is None
            ):
                # Spec 000: a job whose final object alone exceeds the byte budget still
                # leaves an answer for its pollers.
                await self._services.store.put(self._too_large(final, record.owner))
        output = final.get("output") or []
        finished = final["status"] in ("completed", "incomplete")
        if finished and self._services.echo is not None:
            await self._services.echo.remember(self._request.owner, output)
        if config.conversation_id is not None and output and finished:
            await self._services.conversations.append(
                config.conversation_id,
                self._prepared.new_items + tuple(output),
                self._request.owner,
            )

    def _too_large(self, final: JsonObject, owner: str) -> StoredResponse:
        failed = {
            **final,
            "status": "failed",
            "output": [],
            "completed_at": None,
            "incomplete_details": None,
            "error": {
                "code": "server_error",
                "message": "The response finished but its final object is larger than the "
                "response store's byte budget (--responses-store-max-bytes).",
            },
        }
        events = (
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {**failed, "error": None, "status": "queued"},
            },
            {"type": "response.failed", "sequence_number": 1, "response": failed},
        )
        return StoredResponse(failed, self._prepared.all_items, events, owner)

    @property
    def estimated_bytes(self) -> int:
        """What this response will roughly hold in the store: its input, and up to
        ``max_tokens`` tokens of output in its object and its events (approximate: a token's
        delta event alone is ~200 bytes, but most responses stop well before max_tokens)."""
        return self._estimate

    async def run_to_end(self) -> JsonObject:
        """Drive to the terminal event without a listener; returns the final object."""
        while await self.next_events() is not None:
            pass
        return self._machine.snapshot()

    def cancel(self) -> None:
        """The cancel endpoint: the sequence leaves the batch at the next step (or a deferred
        admission stops), and the driver then ends the response ``cancelled`` (stored,
        streamed). Never blocks."""
        if self._admission is None:
            self._admitting.cancel()
        else:
            self._admission.sequence.cancel()

    def abandon(self) -> None:
        """Called from the driver's ``finally``: free the model's work. Never blocks.

        A response abandoned before its end (its client hung up) is cancelled: the sequence
        leaves the batch, live followers receive ``response.cancelled``, nothing is stored.
        """
        self.cancel()
        if not self._machine.terminal:
            self.log.append(self._machine.feed(Cancel(self.usage())))
        self.log.close()


def _processors(constraints: Constraints, grammar: Grammar) -> list[Any]:
    return [make_logits_processor(constraints, grammar)]


async def constrain(request: CreateRequest, model: ModelHandle) -> Grammar | None:
    """The grammar a request's decoding must follow: a forced tool call (``tool_choice``
    ``required`` or a named function) or structured output; None when unconstrained.
    Compiled now, so an invalid schema is a 400 before anything exists."""
    choice, fmt = request.tool_choice, request.text_format
    tools = [tool.to_json() for tool in request.tools]
    try:
        if choice.mode == "required" and tools:
            tool_format = model.info.tool_format
            return await model.compile(
                lambda c: c.tool_call(tools, name=choice.name, tool_format=tool_format)
            )
        if fmt.kind == "json_schema":
            schema, strict = dict(fmt.schema), fmt.strict
            return await model.compile(lambda c: c.json_schema(schema, strict=strict))
        if fmt.kind == "json_object":
            return await model.compile(lambda c: c.json_object())
    except InvalidSchema as exc:
        param = "text.format.schema" if choice.mode != "required" else "tools"
        raise invalid_request(f"Invalid schema for '{param}': {exc}", param) from exc
    except (NotImplementedError, RuntimeError) as exc:
        param = "tool_choice" if choice.mode == "required" else "text.format"
        raise invalid_request(f"Unsupported '{param}' for this model: {exc}", param) from exc
    return None


def output_shaper(
    request: CreateRequest, model: ModelHandle, prompt: tuple[int, ...]
) -> OutputShaper:
    info = model.info
    calls_allowed = request.tool_choice.mode != "none" and bool(request.tools)
    limits = [n for n in (request.config.max_tool_calls,) if n is not None]
    if not request.config.parallel_tool_calls:
        limits.append(1)
    parser = StreamParser(
        tool_format=info.tool_format,
        tools_enabled=calls_allowed,
        reasoning=info.has_thinking,
        starts_in_reasoning=model.opens_reasoning(prompt),
        tool_schemas={tool.name: dict(tool.parameters) for tool in request.tools},
    )
    return OutputShaper(
        parser,
        max_calls=min(limits) if limits else None,
        targets=call_targets(request.tools),  # issue 13: namespaced and custom tools
    )


def _context_exceeded(prompt: tuple[int, ...], window: int) -> ApiError:
    return invalid_request(
        f"The input is {len(prompt)} tokens, which does not fit the model's "
        f"context window of {window} tokens.",
        "input",
        code="context_length_exceeded",
    )


def _submit(
    request: CreateRequest,
    prepared: PreparedPrompt,
    services: Services,
    grammar: Grammar | None,
    compaction: Compacted | None = None,
) -> Admission:
    """Admit the prompt to the batch; raises ``ApiError`` (no room, server busy or closing)."""
    model = services.model
    window = model.info.context_window
    room = window - len(prepared.prompt)
    if room < 1:
        raise _context_exceeded(prepared.prompt, window)
    constraints = model.constraints
    make_processors = None
    if grammar is not None and constraints is not None:
        # Bound now, called on the generation thread: the processor holds MLX state.
        make_processors = partial(_processors, constraints, grammar)
    make_processors = with_adjustments(sampling_adjust(request), make_processors)  # issue 13

    config = request.config
    # Generation is capped at the context left after the prompt (spec 000).
    max_tokens = min(config.max_output_tokens or room, room)
    temperature = DEFAULT_TEMPERATURE if config.temperature is None else config.temperature
    shaper = output_shaper(request, model, prepared.prompt)
    try:
        sequence = model.submit(
            GenerationRequest(
                prompt=prepared.prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=1.0 if config.top_p is None else config.top_p,
                top_logprobs=request.logprobs,
                seed=request.seed,
                make_processors=make_processors,
            )
        )
    except ModelUnavailable as exc:
        raise ApiError(503, "server_error", str(exc), code="server_shutting_down") from exc
    except ModelOverloaded as exc:
        raise ApiError(503, "server_error", str(exc), code="server_overloaded") from exc
    return Admission(prepared, sequence, shaper, compaction)


def needs_compaction(request: CreateRequest, prompt_tokens: int, window: int) -> bool:
    """Spec 000: the rendered input reaches ``compact_threshold`` or leaves no room."""
    threshold = request.compact_threshold
    return threshold is not None and (prompt_tokens >= threshold or prompt_tokens >= window)


async def open_response(request: CreateRequest, services: Services) -> ResponseRun:
    """Validate, resolve history, render, (compact,) admit. Raises ``ApiError`` and changes
    nothing; a background response that needs compaction is admitted by its job instead."""
    prepared = await prepare_prompt(request, services)
    model = services.model
    window = model.info.context_window
    config = request.config
    if needs_compaction(request, len(prepared.prompt), window):
        # compaction.py drives open_response itself for the summary.
        from .compaction import compact_for_request

        grammar = await constrain(request, model)

        async def admit() -> Admission:
            compacted, step = await compact_for_request(request, prepared, services)
            return _submit(request, compacted, services, grammar, step)

        if config.background:
            budget = min(config.max_output_tokens or window, window)
            run = ResponseRun(request, prepared, services, budget, admit=admit)
        else:
            admission = await admit()
            run = ResponseRun(request, prepared, services, admission=admission)
    else:
        room = window - len(prepared.prompt)
        if room < 1:  # before constrain: an over-long prompt is refused as such
            raise _context_exceeded(prepared.prompt, window)
        grammar = await constrain(request, model)
        admission = _submit(request, prepared, services, grammar)
        budget = min(config.max_output_tokens or room, room)
        run = ResponseRun(request, prepared, services, budget, admission=admission)
    try:
        await services.live.track(run.log)
    except BaseException:
        run.abandon()
        raise
    return run
