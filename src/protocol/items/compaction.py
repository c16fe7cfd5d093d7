"""Compaction, the pure part: where a history splits, what a compaction item replays, and the
item's content.

Invariants:
- ``split_history`` keeps every system and developer message, in order, and splits the other
  items (the *turns*) into an older part, which a summary replaces, and a retained part: the
  latest user message plus the newest whole turns whose tokens fit ``keep_tokens``. A split
  falls only before a user message or right after a function call output (or a hosted call,
  ``web_search_call`` / ``mcp_call``, which holds its own output), and never between items that
  share a ``call_id``: a call is never separated from its output, and parallel calls (whose
  outputs follow them all) stay together; nor between an ``mcp_approval_request`` and the
  ``mcp_approval_response`` that answers it. The older part is never empty; when no such
  split exists, ``NothingToSummarize`` is raised.
- The retained part is the suffix after the split, with the latest user message moved to its
  front when the split falls after it (an agent loop of tool calls after one user message can
  still be compacted). The latest user message does not count against ``keep_tokens``; when no
  suffix fits, the smallest legal one is kept.
- ``replay_view`` is what renders: the last compaction item stands in for every item before it
  except system and developer messages; its summary becomes a system message at its place, then
  its retained items, then the items after it. So a client may send back a compaction output
  whole (kept messages, retained items, compaction item), or append it to the full history, or
  reach it through a ``previous_response_id`` chain: each renders the same compacted context.
- ``encrypted_content`` is base64url (unpadded) JSON ``{"v": 1, "summary", "items"}``; it is
  not encrypted and is client data like any input. ``decode_compaction(encode_compaction(c))``
  equals ``c``; a malformed one is a 400 whose message names the problem and whose ``param`` is
  the JSON path of ``encrypted_content`` (or of the bad retained item).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from .hosted_turns import model_turns
from .images import text_of
from .read import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    Reasoning,
    TurnItem,
    WebSearchCall,
    decode_compaction,
)
from .write import encode_compaction

__all__ = [
    "DEFAULT_SUMMARY_TOKENS",
    "KEEP_TOKENS_CAP",
    "MAX_SUMMARY_TOKENS",
    "SUMMARY_PREFIX",
    "NothingToSummarize",
    "Split",
    "auto_summary_tokens",
    "decode_compaction",
    "default_keep_tokens",
    "encode_compaction",
    "item_text",
    "legal_splits",
    "replay_view",
    "split_everything",
    "split_history",
    "transcript",
]

SUMMARY_PREFIX: Final = "Summary of the conversation so far:\n"
# An image in a transcript: the summary request is text, and an image's data is no text.
IMAGE_TEXT: Final = "[image]"
# The summary's max_output_tokens defaults to 1024, from 1 to 16384.
DEFAULT_SUMMARY_TOKENS: Final = 1024
MAX_SUMMARY_TOKENS: Final = 16384
# keep_tokens defaults to 1/16 of the context window, at most 8192.
KEEP_TOKENS_CAP: Final = 8192


def default_keep_tokens(context_window: int) -> int:
    return max(1, min(KEEP_TOKENS_CAP, context_window // 16))


def auto_summary_tokens(context_window: int) -> int:
    """The summary budget of automatic compaction (``context_management`` has no field for
    it): the /compact default, but never more than ``default_keep_tokens``, so a summary takes
    no more of the window than the turns kept beside it."""
    return min(DEFAULT_SUMMARY_TOKENS, default_keep_tokens(context_window))


class NothingToSummarize(ValueError):
    """The history has no turn older than what must be kept: compaction cannot shorten it."""


@dataclass(frozen=True, slots=True)
class Split:
    """A history split for compaction (see the module's invariants)."""

    kept: tuple[InputMessage, ...]  # every system and developer message, in order
    prior_summary: str | None  # the summary of an earlier compaction item, if any
    summarized: tuple[TurnItem, ...]  # the older turns the new summary replaces
    retained: tuple[TurnItem, ...]  # the latest user message, then the newest whole turns


def _is_system(item: InputItem) -> bool:
    return isinstance(item, InputMessage) and item.role in ("system", "developer")


def _is_user(item: InputItem) -> bool:
    return isinstance(item, InputMessage) and item.role == "user"


def _expand(items: Sequence[InputItem]) -> tuple[str | None, list[TurnItem | None]]:
    """The last compaction's summary, and the items with the compaction replaced: ``None``
    marks where its summary goes."""
    last = max((i for i, item in enumerate(items) if isinstance(item, Compaction)), default=-1)
    view: list[TurnItem | None] = []
    if last < 0:
        view += [item for item in items if not isinstance(item, Compaction)]
        return None, view
    compaction = items[last]
    assert isinstance(compaction, Compaction)
    view += [item for item in items[:last] if not isinstance(item, Compaction) and _is_system(item)]
    view.append(None)
    view += compaction.retained
    view += [item for item in items[last + 1 :] if not isinstance(item, Compaction)]
    return compaction.summary, view


def replay_view(items: Sequence[InputItem]) -> list[TurnItem]:
    """The items that render (see the module's invariants)."""
    summary, view = _expand(items)
    rendered: list[TurnItem] = []
    for item in view:
        if item is not None:
            rendered.append(item)
        elif summary:
            rendered.append(InputMessage("system", SUMMARY_PREFIX + summary))
    return rendered


def item_text(item: TurnItem) -> str:
    """An item as transcript text (also what its token cost is counted on)."""
    match item:
        case InputMessage(role, text):
            return f"[{role}]\n{text_of(text, IMAGE_TEXT)}"
        case FunctionCall(call_id, name, arguments):
            return f"[assistant called {name} ({call_id})]\n{arguments}"
        case FunctionCallOutput(call_id, output):
            return f"[result of {call_id}]\n{text_of(output, IMAGE_TEXT)}"
        case Reasoning(text):
            return f"[assistant reasoning]\n{text}"
        case _:  # a hosted tool's item: as it renders (nothing for a listing or an approval)
            return "\n\n".join(item_text(turn) for turn in model_turns(item))


def transcript(prior_summary: str | None, items: Sequence[TurnItem]) -> str:
    """The older part as plain text for the summary request: templates differ in what message
    sequences they accept, one user message holding a transcript renders everywhere."""
    parts = [f"[summary of what came before]\n{prior_summary}"] if prior_summary else []
    parts += [
        text
        for item in items
        if not (isinstance(item, Reasoning) and not item.text) and (text := item_text(item))
    ]
    return "\n\n".join(parts)


def _call_id(item: TurnItem) -> str | None:
    """What ties ``item`` to others: a call's id, an MCP approval's request."""
    match item:
        case FunctionCall(call_id=call_id) | FunctionCallOutput(call_id=call_id):
            return call_id
        case (
            McpApprovalRequest(id=request_id) | McpApprovalResponse(approval_request_id=request_id)
        ):
            return f"approval {request_id}"
    return None


def _ends_step(item: TurnItem) -> bool:
    """A tool's result, after which the model goes on (a hosted call holds its own)."""
    return isinstance(item, FunctionCallOutput | WebSearchCall | McpCall)


def _unsplittable(turns: Sequence[TurnItem]) -> list[bool]:
    """``[i]``: a split before ``turns[i]`` would separate items sharing a ``call_id``."""
    spans: dict[str, tuple[int, int]] = {}
    for index, item in enumerate(turns):
        call_id = _call_id(item)
        if call_id is not None:
            first, _ = spans.get(call_id, (index, index))
            spans[call_id] = (first, index)
    depth = [0] * (len(turns) + 2)
    for first, last in spans.values():
        depth[first + 1] += 1  # a split at i with first < i <= last cuts the span
        depth[last + 1] -= 1
    inside, running = [], 0
    for index in range(len(turns) + 1):
        running += depth[index]
        inside.append(running > 0)
    return inside


def legal_splits(turns: Sequence[TurnItem]) -> list[int]:
    """Every ``i`` in ``1..len(turns)`` where the turns may split into ``[:i]`` and ``[i:]``."""
    cut = _unsplittable(turns)
    return [
        i
        for i in range(1, len(turns) + 1)
        if not cut[i] and ((i < len(turns) and _is_user(turns[i])) or _ends_step(turns[i - 1]))
    ]


def split_everything(items: Sequence[InputItem]) -> Split:
    """A remote compaction's split: every turn is summarized, nothing retained (the
    client keeps what it wants to resend, as Codex does its user messages); raises
    ``NothingToSummarize`` when there is no turn."""
    prior, view = _expand(items)
    kept = tuple(item for item in view if isinstance(item, InputMessage) and _is_system(item))
    turns = tuple(item for item in view if item is not None and not _is_system(item))
    if not turns and prior is None:
        raise NothingToSummarize("there is no turn to summarize")
    return Split(kept, prior, turns, ())


def split_history(
    items: Sequence[InputItem], cost: Callable[[TurnItem], int], keep_tokens: int
) -> Split:
    """Split a history for compaction; raises ``NothingToSummarize``."""
    prior, view = _expand(items)
    kept = tuple(item for item in view if isinstance(item, InputMessage) and _is_system(item))
    turns = [item for item in view if item is not None and not _is_system(item)]
    latest_user = max((i for i, item in enumerate(turns) if _is_user(item)), default=-1)
    costs = [0 if i == latest_user else cost(item) for i, item in enumerate(turns)]
    suffix = [0] * (len(turns) + 1)
    for i in range(len(turns) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + costs[i]
    # A split must leave something to summarize besides the latest user message.
    candidates = [i for i in legal_splits(turns) if i > 1 or not (latest_user == 0 and i == 1)]
    if not candidates:
        raise NothingToSummarize(
            "there is no turn older than the latest user message and the turn after it"
        )
    fitting = [i for i in candidates if suffix[i] <= keep_tokens]
    at = min(fitting) if fitting else max(candidates)
    summarized = tuple(item for i, item in enumerate(turns[:at]) if i != latest_user)
    moved = (turns[latest_user],) if 0 <= latest_user < at else ()
    return Split(kept, prior, summarized, moved + tuple(turns[at:]))
