"""Our Responses events -> Anthropic's Messages stream and ``message`` object (pure).

One :class:`MessageEncoder` per message. The route feeds it the events the response actor
publishes (``response.created``, ``response.output_text.delta``, ...); ``feed`` returns the
Anthropic events to write, in order. Non-streaming requests drive the same encoder and answer
``message()``, so both modes give the same content.

Invariants (Anthropic's grammar):
- ``message_start`` first, then a ``ping``; one ``content_block_start`` .. ``content_block_stop``
  per block with ``index`` 0, 1, 2, ... and only deltas of the block's kind between them
  (``text_delta``, ``thinking_delta`` then one ``signature_delta``, ``input_json_delta``);
  then ``message_delta`` (stop reason, cumulative usage) and ``message_stop``. A failure after
  ``message_start`` ends with an ``error`` event instead: exactly one terminal, last.
- Blocks are opened on their first content (text and thinking) or when the call is named
  (``tool_use``), so no empty text or thinking block is ever sent. Concatenated deltas equal
  the block in ``message()``; ``thinking.display == "omitted"`` sends thinking blocks with no
  text, as Anthropic does.
- Stop sequences apply to visible text: text that may begin a stop sequence is held back until
  it cannot, so the text sent never contains one, whatever the chunking. The first sequence to
  be completed wins (the earliest end; on a tie the longest). Then the text block is closed,
  ``stopped_at`` is set and every later input is ignored: the caller abandons the response and
  ends the message with :meth:`MessageEncoder.stop_on_sequence`.
- ``stop_reason``: ``tool_use`` when a tool was called, else ``end_turn``; ``max_tokens`` when
  ``max_tokens`` ran out, ``model_context_window_exceeded`` when the context window ran out
  first; ``stop_sequence`` as above.
- ``usage.input_tokens`` excludes cached prompt tokens, reported apart as
  ``cache_read_input_tokens`` (Anthropic's accounting); ``output_tokens_details.thinking_tokens``
  counts the reasoning. ``message_start`` carries the split ``start`` was given (the route
  waits for the prompt-cache lookup), so it agrees with ``message_delta``'s final usage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..objects import JsonObject, Usage
from ..stops import StopMatcher

__all__ = [
    "PING",
    "MessageEncoder",
    "StopMatcher",
    "error_body",
    "error_for_status",
    "usage_from_response",
]

PING: Final[JsonObject] = {"type": "ping"}

StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
]

# HTTP status -> (Anthropic status, error type). Overload is 529 on Anthropic.
_ERROR_TYPES: Final[Mapping[int, tuple[int, str]]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    429: (429, "rate_limit_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
    529: (529, "overloaded_error"),
}


def error_for_status(status: int) -> tuple[int, str]:
    """Our HTTP status -> Anthropic's (status, ``error.type``)."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return (status, "invalid_request_error") if 400 <= status < 500 else (500, "api_error")


def error_body(kind: str, message: str) -> JsonObject:
    """Anthropic's error envelope (also the ``error`` stream event)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def usage_from_response(response: Mapping[str, Any]) -> Usage | None:
    """The ``usage`` of a Responses object as a :class:`Usage` (None when it has none)."""
    usage = response.get("usage")
    if not usage:
        return None
    return Usage(
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
        reasoning_tokens=(usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0),
    )


# Fields of the pinned SDK's ``Usage`` with no local meaning: no billed cache writes, no server
# tools, one service tier, no inference region (docs/messages.md).
_NO_SERVER_TOOLS: Final = {"web_fetch_requests": 0, "web_search_requests": 0}


def _message_usage_extras() -> JsonObject:
    return {
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "inference_geo": None,
        "server_tool_use": dict(_NO_SERVER_TOOLS),
        "service_tier": "standard",
    }


def usage_json(usage: Usage, *, delta: bool = False) -> JsonObject:
    """A message's ``usage`` (the SDK's ``Usage``), or with ``delta`` a ``message_delta``'s
    (``MessageDeltaUsage``, which has no cache breakdown, region or tier)."""
    body: JsonObject = {
        "input_tokens": usage.input_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"thinking_tokens": usage.reasoning_tokens},
    }
    if delta:
        body["server_tool_use"] = dict(_NO_SERVER_TOOLS)
        return body
    return {**body, **_message_usage_extras()}


@dataclass(slots=True)
class _Block:
    """One content block as sent so far."""

    kind: Literal["text", "thinking", "tool_use"]
    index: int
    text: list[str] = field(default_factory=list)  # text, thinking, or tool input JSON
    call_id: str = ""
    name: str = ""
    arguments: str | None = None  # the authoritative tool input once its item is done

    def json(self, omit_thinking: bool) -> JsonObject:
        joined = "".join(self.text)
        match self.kind:
            case "text":
                return {"type": "text", "text": joined, "citations": None}
            case "thinking":
                shown = "" if omit_thinking else joined
                return {"type": "thinking", "thinking": shown, "signature": _signature(joined)}
            case "tool_use":
                return {
                    "type": "tool_use",
                    "caller": {"type": "direct"},
                    "id": self.call_id,
                    "name": self.name,
                    "input": _tool_input(self.arguments if self.arguments is not None else joined),
                }


def _signature(thinking: str) -> str:
    # Opaque to clients; passed back, it is not checked (another model's thinking is read as is).
    return hashlib.sha256(thinking.encode()).hexdigest()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _tool_input(arguments: str) -> JsonObject:
    try:
        value = json.loads(arguments, parse_constant=_no_constant)
    except ValueError:
        return {}  # arguments cut off by max_tokens, or not JSON (NaN / Infinity)
    return value if isinstance(value, dict) else {}


class MessageEncoder:
    """Anthropic's events for one message, from our Responses events."""

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        input_tokens: int,
        max_tokens: int,
        stop_sequences: Sequence[str] = (),
        omit_thinking: bool = False,
    ) -> None:
        self._id = message_id
        self._model = model
        self._input_tokens = input_tokens
        self._max_tokens = max_tokens
        self._omit_thinking = omit_thinking
        self._matcher = StopMatcher(stop_sequences)
        self._blocks: list[_Block] = []
        self._open: _Block | None = None
        self._started = False
        self._stop_reason: StopReason | None = None
        self._stop_sequence: str | None = None
        self._usage: Usage | None = None
        self._cached_at_start = 0
        self.stopped_at: str | None = None  # a stop sequence matched; the caller must stop
        self.error: tuple[str, str] | None = None  # (type, message) of a failed response
        self.finished = False  # message_stop or error was sent

    # -- queries --

    def message(self) -> JsonObject:
        """The ``message`` object as of now (final once ``finished``)."""
        usage = self._usage
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [block.json(self._omit_thinking) for block in self._blocks],
            "stop_reason": self._stop_reason,
            "stop_sequence": self._stop_sequence,
            "stop_details": None,  # a refusal's details; this server never refuses
            "container": None,
            "usage": usage_json(usage) if usage is not None else self._start_usage(),
        }

    def _start_usage(self) -> JsonObject:
        return {
            "input_tokens": self._input_tokens - self._cached_at_start,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self._cached_at_start,
            "output_tokens": 0,
            "output_tokens_details": {"thinking_tokens": 0},
            **_message_usage_extras(),
        }

    # -- inputs --

    @property
    def started(self) -> bool:
        return self._started

    def start(self, cached_tokens: int = 0) -> list[JsonObject]:
        """``message_start`` and a first ``ping`` (once); ``cached_tokens``: the prompt tokens
        the prompt cache served (at most the prompt)."""
        if self._started:
            return []
        self._started = True
        self._cached_at_start = max(0, min(cached_tokens, self._input_tokens))
        opening = self.message()
        opening["usage"] = self._start_usage()
        return [{"type": "message_start", "message": opening}, dict(PING)]

    def feed(self, event: Mapping[str, Any]) -> list[JsonObject]:
        """One Responses event -> the Anthropic events it causes (possibly none)."""
        if self.finished or self.stopped_at is not None:
            return []
        out = self.start()
        kind = event["type"]
        if kind == "response.output_item.added":
            item = event["item"]
            if item["type"] == "function_call":
                out += self._open_block("tool_use", call_id=item["call_id"], name=item["name"])
        elif kind == "response.output_text.delta":
            out += self._text(event["delta"])
        elif kind == "response.reasoning_text.delta":
            out += self._ensure_open("thinking") + self._delta(event["delta"])
        elif kind == "response.function_call_arguments.delta":
            out += self._delta(event["delta"])
        elif kind == "response.output_item.done":
            out += self._close(event["item"])
        elif kind in ("response.completed", "response.incomplete"):
            out += self._end(event["response"], kind == "response.incomplete")
        elif kind in ("response.failed", "response.cancelled"):
            error = event["response"].get("error") or {}
            message = error.get("message") or "The response was cancelled."
            self.error = ("api_error", message)
            self.finished = True
            out.append(error_body("api_error", message))
        return out

    def finish_empty(self, usage: Usage) -> list[JsonObject]:
        """The whole stream of a message that generates nothing (``max_tokens`` 0)."""
        return self.start() + self._finish("max_tokens", usage)

    def ended_at_stop_sequence(self, sequence: str) -> None:
        """The generation ended on ``sequence`` (matched by the model actor, which output
        nothing of it): the terminal event ends the message with ``stop_sequence``."""
        self._stop_sequence = sequence

    def stop_on_sequence(self, usage: Usage) -> list[JsonObject]:
        """End the message after ``stopped_at`` matched, with the usage counted so far."""
        assert self.stopped_at is not None
        assert not self.finished
        self._stop_sequence = self.stopped_at
        return self._finish("stop_sequence", usage)

    # -- builders --

    def _open_block(
        self, kind: Literal["text", "thinking", "tool_use"], *, call_id: str = "", name: str = ""
    ) -> list[JsonObject]:
        block = _Block(kind, len(self._blocks), call_id=call_id, name=name)
        self._blocks.append(block)
        self._open = block
        start = block.json(self._omit_thinking)
        if kind == "tool_use":
            start["input"] = {}
        elif kind == "thinking":
            start["signature"] = ""
        return [{"type": "content_block_start", "index": block.index, "content_block": start}]

    def _delta(self, text: str) -> list[JsonObject]:
        block = self._open
        if block is None or not text:
            return []
        block.text.append(text)
        match block.kind:
            case "text":
                delta: JsonObject = {"type": "text_delta", "text": text}
            case "thinking":
                if self._omit_thinking:
                    return []
                delta = {"type": "thinking_delta", "thinking": text}
            case "tool_use":
                delta = {"type": "input_json_delta", "partial_json": text}
        return [{"type": "content_block_delta", "index": block.index, "delta": delta}]

    def _text(self, chunk: str) -> list[JsonObject]:
        safe, matched = self._matcher.feed(chunk)
        out = self._send_text(safe)
        if matched is not None:
            out += self._close_open()
            self.stopped_at = matched
        return out

    def _ensure_open(self, kind: Literal["text", "thinking"]) -> list[JsonObject]:
        if self._open is not None and self._open.kind == kind:
            return []
        return self._close_open() + self._open_block(kind)

    def _send_text(self, text: str) -> list[JsonObject]:
        if not text:
            return []
        return self._ensure_open("text") + self._delta(text)

    def _close(self, item: Mapping[str, Any]) -> list[JsonObject]:
        out: list[JsonObject] = []
        if item["type"] == "message":
            out += self._send_text(self._matcher.flush())
        elif item["type"] == "function_call" and self._open is not None:
            self._open.arguments = item["arguments"]
        return out + self._close_open()

    def _close_open(self) -> list[JsonObject]:
        block, self._open = self._open, None
        if block is None:
            return []
        out: list[JsonObject] = []
        if block.kind == "thinking":
            signature = _signature("".join(block.text))
            delta = {"type": "signature_delta", "signature": signature}
            out.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        out.append({"type": "content_block_stop", "index": block.index})
        return out

    def _end(self, response: Mapping[str, Any], incomplete: bool) -> list[JsonObject]:
        usage = usage_from_response(response) or Usage(self._input_tokens, 0)
        out = self._close_open()
        reason: StopReason
        if self._stop_sequence is not None:
            reason = "stop_sequence"
        elif incomplete:
            exhausted = usage.output_tokens >= self._max_tokens
            reason = "max_tokens" if exhausted else "model_context_window_exceeded"
        elif any(block.kind == "tool_use" for block in self._blocks):
            reason = "tool_use"
        else:
            reason = "end_turn"
        return out + self._finish(reason, usage)

    def _finish(self, reason: StopReason, usage: Usage) -> list[JsonObject]:
        self._stop_reason = reason
        self._usage = usage
        self.finished = True
        delta = {
            "stop_reason": reason,
            "stop_sequence": self._stop_sequence,
            "stop_details": None,
            "container": None,
        }
        return [
            {"type": "message_delta", "delta": delta, "usage": usage_json(usage, delta=True)},
            {"type": "message_stop"},
        ]
