"""Input items as internal frozen values (``items.py`` reads them, ``item_json.py`` writes them;
re-exported from ``items.py``): messages, function calls and their outputs, reasoning, and
compaction. A message's and a tool output's content is ``images.Content``: its text, or its text
runs and typed images in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from ..objects import Execution
from .images import Content

JsonObject = dict[str, Any]
Role = Literal["system", "developer", "user", "assistant"]
ROLES: Final[tuple[str, ...]] = get_args(Role)


Phase = Literal["commentary", "final_answer"]
PHASES: Final[tuple[str, ...]] = get_args(Phase)

# The version of a compaction item's ``encrypted_content`` (``item_json.encode_compaction``).
COMPACTION_FORMAT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class InputMessage:
    role: Role
    text: Content  # a plain string unless the message holds images
    # An assistant message's ``phase`` as the client sent it: kept and listed back
    # (``input_items``, replays); it does not change the rendering, nor what equals what.
    phase: Phase | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    call_id: str
    name: str
    arguments: str  # a JSON object, as text; a custom tool's freeform input when ``custom``
    namespace: str | None = None  # the namespace tool the function belongs to
    custom: bool = False  # a ``custom_tool_call``
    # A ``tool_search_call``: its execution; ``name`` is ``tool_search``.
    search: Execution | None = None


@dataclass(frozen=True, slots=True)
class FunctionCallOutput:
    call_id: str
    # A plain string unless the tool returned images (Codex's ``view_image``); a
    # ``tool_search_output``'s: what the model reads (the loaded tools' names).
    output: Content
    custom: bool = False  # a ``custom_tool_call_output``
    # A ``tool_search_output``: its execution and its ``tools`` (JSON text).
    search: Execution | None = None
    search_tools: str | None = None


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str  # the reasoning text (content, else summary); "" when only encrypted
    # The item's ``encrypted_content`` as sent: opened at the HTTP edge, where the
    # server secret is (``protocol.sealed``), never trusted unopened.
    encrypted: str | None = None


TurnItem = InputMessage | FunctionCall | FunctionCallOutput | Reasoning
"""An item of a conversation's turns (everything but a compaction item)."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary standing in for the earlier turns, then the turns it kept (``compaction.py``)."""

    summary: str
    retained: tuple[TurnItem, ...]


InputItem = TurnItem | Compaction
