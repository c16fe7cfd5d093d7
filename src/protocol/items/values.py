"""Input items as internal frozen values (``read.py`` reads them, ``write.py`` writes them;
re-exported from ``read.py``): messages, function calls and their outputs, reasoning, the
hosted tools' items, and compaction. A message's and a tool output's content is
``images.Content``: its text, or its text runs and typed images in order. A hosted item's id is
its own (required by its shape; a ``web_search_call``'s or ``mcp_call``'s is the call_id it
renders under), never minted again when it is written.
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


# --- the hosted tools' items (``hosted_read.py`` reads them, ``hosted_turns.py`` renders them) ---

WebSearchStatus = Literal["in_progress", "searching", "completed", "failed", "incomplete"]
WEB_SEARCH_STATUSES: Final[tuple[str, ...]] = get_args(WebSearchStatus)
McpCallStatus = Literal["in_progress", "completed", "incomplete", "calling", "failed"]
MCP_CALL_STATUSES: Final[tuple[str, ...]] = get_args(McpCallStatus)
SearchActionType = Literal["search", "open_page", "find_in_page"]
SEARCH_ACTIONS: Final[tuple[str, ...]] = get_args(SearchActionType)


@dataclass(frozen=True, slots=True)
class SearchAction:
    """A ``web_search_call``'s ``action``: ``search`` (``query``, ``queries``, ``sources``: their
    URLs), ``open_page`` (``url``) or ``find_in_page`` (``url``, ``pattern``); None: absent."""

    type: SearchActionType
    query: str | None = None
    queries: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    url: str | None = None
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class WebSearchCall:
    """A ``web_search_call``: renders as the call of ``web_search`` and its result."""

    id: str  # also the call_id of the call and output it renders as
    status: WebSearchStatus
    action: SearchAction
    # What the model read as the result (the response's own item, for its continuation:
    # ``hosted_read.with_model_texts``); never listed nor stored, so not compared.
    model_text: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class McpListTools:
    """An ``mcp_list_tools`` item: kept and listed, renders nothing."""

    id: str
    server_label: str
    tools: str  # the ``tools`` array as JSON text
    error: str | None = None


@dataclass(frozen=True, slots=True)
class McpCall:
    """An ``mcp_call``: renders as the call of ``mcp__<server_label>__<name>`` and its result."""

    id: str  # also the call_id of the call and output it renders as
    server_label: str
    name: str
    arguments: str  # as sent: a JSON object as text, or what the model wrote before a cancel
    status: McpCallStatus | None = None
    output: str | None = None
    error: str | None = None  # the ``error`` object as JSON text
    approval_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class McpApprovalRequest:
    """An ``mcp_approval_request``: kept and listed, renders nothing."""

    id: str
    server_label: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class McpApprovalResponse:
    """A client's ``mcp_approval_response``: kept and listed, renders nothing."""

    approval_request_id: str
    approve: bool
    reason: str | None = None
    # The client's id, listed back when it sent one (else one is minted, as for a message).
    id: str | None = field(default=None, compare=False)


HostedItem = WebSearchCall | McpListTools | McpCall | McpApprovalRequest | McpApprovalResponse
"""An item of a tool the server runs (``web_search``, ``mcp``)."""

TurnItem = InputMessage | FunctionCall | FunctionCallOutput | Reasoning | HostedItem
"""An item of a conversation's turns (everything but a compaction item)."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary standing in for the earlier turns, then the turns it kept (``compaction.py``)."""

    summary: str
    retained: tuple[TurnItem, ...]


InputItem = TurnItem | Compaction
