"""The response lifecycle and its SSE event grammar, as a pure table-driven state machine.

One :class:`ResponseMachine` per response. The producer (the response actor) feeds it inputs;
each ``feed`` returns the JSON-ready events to publish, in order, numbered by ``sequence_number``.

Invariants (the rules come first, as in h11's ``_state.py``):
- The legal moves are exactly the rows of ``TRANSITIONS`` (``table.py``). An input
  without a row raises :class:`ProtocolError` *before* anything changes: state, text, ids and
  the next sequence number stay as they were. Legality depends on the input's kind only,
  never on whether it is empty.
- ``sequence_number`` runs 0, 1, 2, ... without gaps across all ``feed`` calls.
- ``response.created`` is the first event; exactly one terminal event (``response.completed``,
  ``response.incomplete``, ``response.failed``, ``response.cancelled``) is the last, after which
  every input is illegal: a stream has one end, and a late input is a producer's bug.
- At most one output item is open at a time: a ``reasoning`` item, a ``message``, a call the
  client answers, or a call the server runs (``IN_HOSTED_CALL`` while its arguments stream,
  ``HOSTED_RUNNING`` until its ``HostedResult``). Opening another closes the open one first
  (``WholeItem`` too), so items appear in generation order, each at its own ``output_index``.
- Every ``output_item.added`` / ``content_part.added`` that a terminal event reports as output is
  paired with its ``.done`` at the same ``output_index``, ``content_index`` and item id; the
  item id (``msg_``, ``rs_``, ``fc_``, ``ws_``, ``mcp_``, ``mcpr_``; a whole item's its own) is
  minted once, the same in every event and the snapshot; a ``function_call``'s ``call_id`` too.
- The concatenated ``output_text.delta`` / ``reasoning_text.delta`` of a part equal its ``.done``
  text; the concatenated ``function_call_arguments.delta`` of a call equal its ``.done``
  arguments (but see ``ToolCallEnd`` below); the final object's ``output`` equals the items sent
  in ``output_item.done``, in order.
- Logprobs: each ``output_text.delta`` carries the entries of its ``TextDelta`` in the event
  shape (no ``bytes``); the part accumulates them in the part shape; ``output_text.done`` carries
  all of them in the event shape. ``[]`` when none were given.

Decisions where OpenAI leaves room:
- An empty ``TextDelta`` / ``ReasoningDelta`` / ``ToolCallArgs`` emits nothing (and opens or
  closes nothing). A ``TextDelta`` with logprobs but no text is malformed: logprobs belong to the
  text they produced, so the producer carries a token that has no text yet to the next delta.
- ``Finish`` without any output completes with ``output: []``: no empty item is invented.
- ``Finish(reason="length")`` ends ``incomplete`` with ``incomplete_details.reason ==
  "max_output_tokens"``; the open item (reasoning, message, or a function call still streaming
  its arguments) is closed with item status ``incomplete``; a call keeps the arguments streamed
  so far, and gets its ``function_call_arguments.done`` with them, like text gets its ``.done``.
- ``Finish(reason="steered")`` ends ``incomplete`` with ``incomplete_details.reason ==
  "steered"``, closing the open item as ``length`` does.
- ``Finish(reason="stop")`` while a call is open is illegal: the end-of-generation parse is
  authoritative, so the producer ends every call it began with ``ToolCallEnd`` first.
- ``ToolCallEnd(arguments)`` is authoritative. When the streamed arguments are a prefix of it,
  the unsent rest goes out as one more delta, so the deltas join to ``.done``. When they are not
  (the producer streamed text the final parse disowns), ``.done`` and the item still carry the
  authoritative arguments: a client reading the final call is right, one joining deltas is not;
  the conformance checks flag such a stream, so producers stream only settled argument text.
  The arguments are not parsed here: JSON validity is the parser's business.
- ``function_call_arguments.done`` has no ``name``: the pinned SDK's event class does not define
  one, and an undeclared key fails strict validation.
- ``completed_at`` is set only on ``completed`` (the SDK: "only present when the status is
  completed").
- ``Fail`` emits no ``.done`` for an open item of any kind: the partial item is abandoned (not
  trustworthy; a ``.done`` would present it as finished); ``output`` holds the closed ones.
- ``Cancel`` closes the open item as ``incomplete`` (``.done`` events included), then emits
  ``response.cancelled``: what was streamed so far stays readable in the stored object.
- A ``tool_search_call`` (``ToolCallBegin(search=...)``) streams no argument
  deltas (no SDK release types a ``response.tool_search_call.*`` event): it is added, then
  done with its arguments as an object; a server search's ``ToolCallEnd(loaded=...)`` adds
  the ``tool_search_output`` item right after it (added in progress with no tools, then done).
- Hosted calls (event order in ``hosted_items.py``): a ``web_search_call`` streams no argument
  deltas and gets its action from ``ToolCallEnd``; an ``mcp_call`` streams them; an
  ``mcp_approval_request`` is closed whole by ``ToolCallEnd``, like a function call. A failed
  result ends the item ``failed``; ``Cancel``/``Finish(length|steered)`` while one runs close it
  ``incomplete``. A search's ``sources`` show only under ``config.sources_included``.
- Citations: a message closing after a good ``search`` (the latest one's sources) gets its
  ``url_citation`` s (``tools/citations.py``): one ``output_text.annotation.added`` each, before
  ``output_text.done``, and the same list in its part's ``annotations``.
- ``Fail`` and ``Cancel`` are legal before ``Start`` (a queued background job can be cancelled or
  fail to start); the stream is still well formed: ``response.created`` (status ``queued``),
  then the terminal.
- Background (``config.background``): ``Start`` emits ``response.created`` and
  ``response.queued`` with status ``queued`` (as OpenAI's background streams do), then
  ``response.in_progress``. Every non-terminal object of a background response has
  ``output: []`` and all-zero usage, so a poll never exposes partial output
  (the Responses spec's background mode, docs/api.md).
  A foreground non-terminal object has ``usage: null`` and the output produced so far, the open
  item included with status ``in_progress``.
- Reasoning items carry ``status`` (the SDK allows it), as messages do.
- Automatic compaction finished before generation, so it rides on ``Start``: after
  ``response.in_progress`` come ``mlx.compaction.started``, ``mlx.compaction.completed``, then
  the ``compaction`` item, added and done at once at ``output_index`` 0 (it is whole already).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

from ..ids import new_id
from ..objects import (
    HostedStatus,
    JsonObject,
    ResponseConfig,
    ResponseStatus,
    Usage,
    event_logprob,
    json_copy,
    part_logprob,
    response_object,
)
from ..tools.citations import url_citations
from . import hosted_items
from .inputs import (
    TERMINAL_EVENT_TYPES,
    Cancel,
    Compacted,
    Fail,
    Finish,
    HostedCall,
    HostedResult,
    MachineInput,
    ProtocolError,
    ReasoningDelta,
    Start,
    TextDelta,
    ToolCallArgs,
    ToolCallBegin,
    ToolCallEnd,
    WholeItem,
)
from .open_item import (
    CALLS,
    DELTA_EVENT,
    HOSTED,
    ID_PREFIX,
    ITEM_STATES,
    PARTLESS,
    Draft,
    ItemType,
    OpenItem,
)
from .table import STATUS, TERMINAL_EVENT, TRANSITIONS, ZERO_USAGE, State, classify

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "Cancel",
    "Compacted",
    "Fail",
    "Finish",
    "HostedCall",
    "HostedResult",
    "MachineInput",
    "ProtocolError",
    "ReasoningDelta",
    "ResponseMachine",
    "Start",
    "State",
    "TextDelta",
    "ToolCallArgs",
    "ToolCallBegin",
    "ToolCallEnd",
    "WholeItem",
]


# --- The machine -------------------------------------------------------------------------------


class ResponseMachine:
    """Turns generation milestones into the OpenAI Responses event stream of one response.

    ``id_factory`` mints item and call ids (``id_factory("msg")``, ``"rs"``, ``"fc"``,
    ``"call"``); tests pass a deterministic one.
    """

    def __init__(
        self,
        response_id: str,
        config: ResponseConfig,
        created_at: int,
        *,
        id_factory: Callable[[str], str] = new_id,
        seal: Callable[[str], str] | None = None,
    ) -> None:
        self._response_id = response_id
        self._seal = seal  # include "reasoning.encrypted_content": done reasoning items carry it
        self._config = config
        self._created_at = created_at
        self._id_factory = id_factory
        self._state = State.QUEUED
        self._seq = 0
        self._done_items: list[JsonObject] = []
        self._open: OpenItem | None = None
        self._closed_text = ""  # text of messages already closed or abandoned (for output_text)
        self._usage: Usage | None = None
        self._error: JsonObject | None = None
        self._incomplete_details: JsonObject | None = None
        self._completed_at: int | None = None
        self._sources: tuple[tuple[str, str], ...] = ()  # the latest good search's, for citations

    # -- queries --

    @property
    def response_id(self) -> str:
        return self._response_id

    @property
    def config(self) -> ResponseConfig:
        return self._config

    @property
    def state(self) -> State:
        return self._state

    @property
    def status(self) -> ResponseStatus:
        return STATUS[self._state]

    @property
    def terminal(self) -> bool:
        return self._state in TERMINAL_EVENT

    @property
    def next_sequence_number(self) -> int:
        """The ``sequence_number`` the next emitted event will carry (= events emitted so far)."""
        return self._seq

    @property
    def output_text(self) -> str:
        """All assistant message text so far (an open or abandoned message included; never
        reasoning text)."""
        if self._open is not None and self._open.type == "message":
            return self._closed_text + self._open.text
        return self._closed_text

    @property
    def has_tool_calls(self) -> bool:
        """Whether the output holds a ``function_call`` item, closed or still open (a call
        abandoned by ``Fail`` is not in the output and does not count)."""
        opened = self._open is not None and self._open.type in CALLS
        return opened or any(item["type"] in CALLS for item in self._done_items)

    @property
    def output_items(self) -> list[JsonObject]:
        """A copy of the output items closed so far (``output_item.done`` sent), in order."""
        return json_copy(self._done_items)

    def fork(self) -> ResponseMachine:
        """An independent machine in this one's state (its config and callbacks shared): feeding
        one never changes the other."""
        twin = copy.copy(self)
        twin._done_items = json_copy(self._done_items)
        opened = self._open
        if opened is not None:
            twin._open = replace(
                opened,
                chunks=list(opened.chunks),
                logprobs=json_copy(opened.logprobs),
                action=json_copy(opened.action),
                error=json_copy(opened.error),
                annotations=json_copy(opened.annotations),
            )
        twin._error = json_copy(self._error)
        twin._incomplete_details = json_copy(self._incomplete_details)
        return twin

    def snapshot(self) -> JsonObject:
        """The Response object as of now; after the terminal event, the final object."""
        return self._response(self.status)

    # -- the one command --

    def feed(self, inp: MachineInput) -> list[JsonObject]:
        """Apply one input; return the events to publish. Raises ProtocolError, changing nothing."""
        kind = classify(inp)
        target = TRANSITIONS.get((self._state, kind))
        if target is None:
            raise ProtocolError(f"{kind.value} is illegal in state {self._state.value}")
        # From here on nothing raises: the move is committed while events are built.
        events = self._events_for(inp)
        assert self._open is None or target in ITEM_STATES[self._open.type]
        self._state = target
        if target in TERMINAL_EVENT:
            events.append(self._event(TERMINAL_EVENT[target], response=self.snapshot()))
        return events

    def _events_for(self, inp: MachineInput) -> list[JsonObject]:
        """The events of a legal input, its effects applied (the state is the caller's)."""
        events: list[JsonObject] = []
        match inp:
            case Start(compaction=compaction):
                events += self._opening(in_progress=True)
                if compaction is not None:
                    drafts, item = hosted_items.compacted(self._response_id, compaction)
                    events += self._whole(drafts, item)
            case TextDelta(text=text, logprobs=logprobs) if text:
                events += self._switch_to("message")
                events += self._delta(text, [event_logprob(entry) for entry in logprobs])
                assert self._open is not None
                self._open.logprobs += map(part_logprob, logprobs)
            case ReasoningDelta(text=text) if text:
                events += self._switch_to("reasoning")
                events += self._delta(text)
            case ToolCallBegin(hosted=HostedCall() as hosted, name=name):
                events += self._close("completed")
                item_type = hosted_items.item_type(hosted)
                events += self._open_item(item_type, name, server_label=hosted.server_label)
                assert self._open is not None
                events += self._drafts(hosted_items.opened(self._open))
            case ToolCallBegin(
                name=name, call_id=call_id, namespace=namespace, custom=custom, search=search
            ):
                events += self._close("completed")
                item_type = "custom_tool_call" if custom else "function_call"
                if search is not None:
                    item_type = "tool_search_call"
                events += self._open_item(item_type, name, call_id, namespace)
                if search is not None and self._open is not None:
                    self._open.execution = search
            case ToolCallArgs(delta=delta) if delta:
                events += self._delta(delta)
            case ToolCallEnd(arguments=arguments, loaded=loaded):
                assert self._open is not None
                streamed = self._open.text
                if arguments.startswith(streamed):
                    events += self._delta(arguments[len(streamed) :])
                self._open.chunks = [arguments]
                call_id = self._open.call_id
                if self._open.type in HOSTED:
                    return events + self._drafts(hosted_items.ended(self._open))
                events += self._close("completed")
                if loaded is not None:
                    index = len(self._done_items)
                    tso = self._id_factory("tso")
                    events += self._whole(*hosted_items.search_output(tso, call_id, loaded, index))
            case HostedResult() as outcome:
                assert self._open is not None
                if self._open.type == "web_search_call" and outcome.ok:
                    if (self._open.action or {}).get("type") == "search":
                        self._sources = outcome.sources
                sources_included = self._config.sources_included
                drafts = hosted_items.result(self._open, outcome, sources_included=sources_included)
                events += self._drafts(drafts)
                events += self._close(hosted_items.result_status(outcome))
            case WholeItem(item=item):
                events += self._close("completed")
                events += self._whole(*hosted_items.whole(item, len(self._done_items)))
            case Finish(reason=reason, usage=usage, completed_at=completed_at):
                events += self._close("completed" if reason == "stop" else "incomplete")
                self._usage = usage
                if reason == "length":
                    self._incomplete_details = {"reason": "max_output_tokens"}
                elif reason == "steered":
                    self._incomplete_details = {"reason": "steered"}
                else:
                    self._completed_at = completed_at
            case Fail(code=code, message=message, usage=usage):
                events += self._opening(in_progress=False)
                self._abandon()
                self._error = {"code": code, "message": message}
                self._usage = usage
            case Cancel(usage=usage):
                events += self._opening(in_progress=False)
                events += self._close("incomplete")
                self._usage = usage
        return events

    # -- event builders (they mutate; called only after the move is known legal) --

    def _event(self, type_: str, **fields: object) -> JsonObject:
        event: JsonObject = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _opening(self, *, in_progress: bool) -> list[JsonObject]:
        """``response.created`` (+ ``queued``) if not yet sent, then ``in_progress`` if asked."""
        events: list[JsonObject] = []
        if self._state is State.QUEUED:
            first: ResponseStatus = (
                "queued" if self._config.background or not in_progress else "in_progress"
            )
            events.append(self._event("response.created", response=self._response(first)))
            if self._config.background:
                events.append(self._event("response.queued", response=self._response("queued")))
        if in_progress:
            events.append(
                self._event("response.in_progress", response=self._response("in_progress"))
            )
        return events

    def _drafts(self, drafts: Sequence[Draft]) -> list[JsonObject]:
        return [self._event(type_, **fields) for type_, fields in drafts]

    def _whole(self, drafts: Sequence[Draft], item: JsonObject) -> list[JsonObject]:
        """The events of an item shown whole; it joins the output (nothing may be open)."""
        assert self._open is None
        events = self._drafts(drafts)
        self._done_items.append(item)
        return events

    def _switch_to(self, type_: Literal["message", "reasoning"]) -> list[JsonObject]:
        """Keep the open item if it is of ``type_``; else close it and open a new one."""
        if self._open is not None and self._open.type == type_:
            return []
        return self._close("completed") + self._open_item(type_)

    def _open_item(
        self,
        type_: ItemType,
        name: str = "",
        call_id: str | None = None,
        namespace: str | None = None,
        *,
        server_label: str = "",
    ) -> list[JsonObject]:
        assert self._open is None
        item_id = self._id_factory(ID_PREFIX[type_])
        if type_ in CALLS and call_id is None:
            call_id = self._id_factory("call")
        index = len(self._done_items)
        opened = OpenItem(type_, item_id, index, call_id=call_id or "", name=name)
        opened.namespace, opened.server_label = namespace, server_label
        self._open = opened
        added = opened.item("in_progress")
        if type_ in PARTLESS:
            return [
                self._event("response.output_item.added", output_index=opened.index, item=added)
            ]
        added["content"] = []
        return [
            self._event("response.output_item.added", output_index=opened.index, item=added),
            self._event("response.content_part.added", **opened.where(), part=opened.part()),
        ]

    def _delta(self, delta: str, logprobs: list[JsonObject] | None = None) -> list[JsonObject]:
        """One delta event on the open item (none for an empty delta)."""
        assert self._open is not None
        if not delta:
            return []
        self._open.chunks.append(delta)
        if self._open.type not in DELTA_EVENT:
            return []  # no SDK type for its argument deltas (a tool search, a web search, ...)
        extra: JsonObject = {} if logprobs is None else {"logprobs": logprobs}
        return [
            self._event(DELTA_EVENT[self._open.type], **self._open.where(), delta=delta, **extra)
        ]

    def _close(self, item_status: HostedStatus) -> list[JsonObject]:
        """The ``.done`` events of the open item (none if nothing is open); it joins the output.
        A message cites the latest good search's sources first."""
        opened = self._open
        if opened is None:
            return []
        events: list[JsonObject] = []
        if opened.type == "message" and self._sources:
            cited = url_citations(opened.text, self._sources)
            events += self._drafts(hosted_items.citations(opened, cited))
        events += self._drafts(opened.closing())
        if opened.type == "message":
            self._closed_text += opened.text
        if opened.type not in PARTLESS:
            events.append(
                self._event("response.content_part.done", **opened.where(), part=opened.part())
            )
        done = opened.item(item_status)
        if opened.type == "reasoning" and self._seal is not None:
            done["encrypted_content"] = self._seal(opened.text)
        events.append(
            self._event("response.output_item.done", output_index=opened.index, item=done)
        )
        self._done_items.append(json_copy(done))
        self._open = None
        return events

    def _abandon(self) -> None:
        # Message text stays in output_text (it was streamed) but never becomes an output item.
        if self._open is not None and self._open.type == "message":
            self._closed_text += self._open.text
        self._open = None

    def _response(self, status: ResponseStatus) -> JsonObject:
        """A Response object with the given status and the machine's current contents."""
        terminal = status not in ("queued", "in_progress")
        background = self._config.background
        output: list[JsonObject]
        if terminal:
            output, usage = json_copy(self._done_items), self._usage
        elif background:
            output, usage = [], ZERO_USAGE
        else:
            output, usage = json_copy(self._done_items), None
            if self._open is not None:
                output.append(self._open.item("in_progress"))
        return response_object(
            response_id=self._response_id,
            config=self._config,
            created_at=self._created_at,
            status=status,
            output=output,
            usage=usage,
            error=self._error if terminal else None,
            incomplete_details=self._incomplete_details if terminal else None,
            completed_at=self._completed_at if status == "completed" else None,
        )
