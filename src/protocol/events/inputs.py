"""The event machine's inputs (``machine.py``): one frozen value per generation milestone,
sent by the response actor; and the machine's refusal of an illegal one.

Invariants:
- Inputs are plain frozen values; legality is the machine's table (``table.py``), not
  theirs. ``TextDelta`` keeps its own tuple of logprobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..objects import ResponseErrorCode, Usage

TERMINAL_EVENT_TYPES: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)


class ProtocolError(Exception):
    """An input that is illegal in the machine's current state; the machine is unchanged."""


# --- Inputs (sent by the response actor, one per generation milestone) -------------------------


@dataclass(frozen=True, slots=True)
class Compacted:
    """The history was compacted before generation; ``item`` is the ``compaction`` output item
    (``id``, ``type``, ``encrypted_content``), the counts the rendered input before and after."""

    item: Mapping[str, Any]
    input_tokens_before: int
    input_tokens_after: int


@dataclass(frozen=True, slots=True)
class Start:
    """Generation began (prefill started); ``compaction`` when the history was compacted first."""

    compaction: Compacted | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Visible assistant text, already detokenised.

    ``logprobs``: one part-shaped entry per token of ``text`` (``token``, ``logprob``, ``bytes``,
    ``top_logprobs`` of ``{token, bytes, logprob}``), as ``ResponseOutputText.Logprob``; empty
    when logprobs were not asked for. The machine keeps its own copy.
    """

    text: str
    logprobs: Sequence[Mapping[str, Any]] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "logprobs", tuple(self.logprobs))


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (what the model wrote inside its thinking markers), already detokenised."""

    text: str


@dataclass(frozen=True, slots=True)
class HostedCall:
    """A call of a tool the server runs: ``web_search`` (a ``web_search_call``) or ``mcp`` (an
    ``mcp_call`` of ``server_label``'s tool); ``approval``: an ``mcp_approval_request`` instead,
    which the client must answer before the tool runs."""

    kind: Literal["web_search", "mcp"]
    server_label: str = ""
    approval: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallBegin:
    """The parser saw a function call's name; ``call_id`` is minted (``call_…``) when not given
    (never for a ``hosted`` call: its items have no ``call_id``)."""

    name: str
    call_id: str | None = None
    namespace: str | None = None  # the item's ``namespace`` (a namespaced function)
    custom: bool = False  # a ``custom_tool_call`` whose input streams as plain text
    search: Literal["server", "client"] | None = None  # a ``tool_search_call``
    hosted: HostedCall | None = None  # a call of a tool the server runs


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    """A fragment of the open call's arguments (JSON text) as the parser streams them."""

    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """The open call is complete; ``arguments`` is the end-of-generation parse, authoritative.
    ``loaded``: the tools a server-executed search loaded (a ``tool_search_output`` follows)."""

    arguments: str
    loaded: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True, slots=True)
class HostedResult:
    """The server ran the open hosted call (``ToolCallEnd`` came first): it closes the item.

    ``sources``: a search's results as ``(url, title)``, numbered from 1 for citations;
    ``output`` / ``error``: an MCP tool's text or its failure (an ``McpToolCallError``-shaped
    mapping, or a short reason); a failed search's ``error`` is not shown in the item.
    """

    ok: bool
    sources: tuple[tuple[str, str], ...] = ()
    output: str | None = None
    error: Mapping[str, Any] | str | None = None


@dataclass(frozen=True, slots=True)
class WholeItem:
    """An item that is whole before it is shown: an ``mcp_list_tools``, or an ``mcp_call`` the
    server ran on an approval (built by ``objects.py``; its ``id`` is the item's own)."""

    item: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Finish:
    """The model stopped: on a stop token (``stop``), at ``max_output_tokens`` (``length``), or
    because steering input arrived for a continuation (``steered``, the WebSocket mode)."""

    reason: Literal["stop", "length", "steered"]
    usage: Usage
    completed_at: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Generation failed; ``code`` is one of the SDK's ``ResponseError.code`` values."""

    code: ResponseErrorCode
    message: str
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class Cancel:
    """The response was cancelled (client hang-up or the cancel endpoint)."""

    usage: Usage | None


MachineInput = (
    Start
    | TextDelta
    | ReasoningDelta
    | ToolCallBegin
    | ToolCallArgs
    | ToolCallEnd
    | HostedResult
    | WholeItem
    | Finish
    | Fail
    | Cancel
)
