"""Tool values (pure): the frozen ``FunctionTool`` and ``ToolChoice`` that ``tools.py`` parses
into, and ``qualified_name``, the name the model sees for a function inside a namespace.

Invariants:
- This module imports nothing of the protocol's parsers, so the items, tools and tool-search
  modules all stand on it (``items`` -> ``tool_spec`` <- ``tools`` <- ``tool_search``).
- Values are frozen; ``echo_json`` / ``to_json`` return fresh JSON the caller may mutate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


def qualified_name(namespace: str | None, name: str) -> str:
    """The name the model sees for function ``name`` of ``namespace`` (itself when None, or
    when the namespace is the name: OpenAI's wire shape of a loaded deferred top-level
    function, ``tool_search.loaded``)."""
    if not namespace or namespace == name:
        return name
    return f"{namespace}{'' if namespace.endswith('_') else '__'}{name}"


@dataclass(frozen=True, slots=True)
class Hosted:
    """A tool the server runs (``hosted.py``): a web search, or a tool of a remote MCP
    server (``server_label``; ``approval``: a call waits for the client's approval)."""

    kind: Literal["web_search", "mcp"]
    server_label: str = ""
    approval: bool = False
    echo: Mapping[str, Any] | None = None  # a web_search tool as sent (the Response echoes it)


@dataclass(frozen=True, slots=True)
class FunctionTool:
    name: str  # the name the model sees and calls: qualified when in a namespace
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool
    namespace: str | None = None
    namespace_description: str = ""
    local_name: str = ""  # the name inside its namespace ("" when not in one)
    # A ``custom`` tool (freeform input): its ``format`` as sent; None for a function tool.
    custom_format: Mapping[str, Any] | None = None
    # Tool discovery: ``defer_loading: true`` (offered once a search loads it).
    deferred: bool = False
    # A ``tool_search`` tool: its execution, the tool as sent, the deferred tools it searches.
    search: Literal["server", "client"] | None = None
    search_echo: Mapping[str, Any] | None = None
    catalog: tuple[FunctionTool, ...] = ()
    # A tool the server runs (a web search, an MCP server's tool); None: the client runs it.
    hosted: Hosted | None = None

    def undeferred(self) -> FunctionTool:
        return dataclasses.replace(self, deferred=False)

    @property
    def is_custom(self) -> bool:
        return self.custom_format is not None

    @property
    def call_name(self) -> str:
        """The ``name`` of a ``function_call`` item calling this tool."""
        return self.local_name or self.name

    def to_json(self) -> dict[str, Any]:
        """The SDK's ``FunctionTool`` shape, under the name the model sees."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
            "strict": self.strict,
        }

    def echo_json(self) -> dict[str, Any]:
        """As a Response object echoes it (inside its namespace tool when it has one)."""
        if self.search_echo is not None:
            return _thaw_json(self.search_echo)  # type: ignore[no-any-return]
        if self.hosted is not None and self.hosted.echo is not None:
            return _thaw_json(self.hosted.echo)  # type: ignore[no-any-return]
        if self.custom_format is not None:
            echoed: dict[str, Any] = {"type": "custom", "name": self.call_name}
            if self.description is not None:
                echoed["description"] = self.description
            echoed["format"] = dict(self.custom_format)
        else:
            echoed = {**self.to_json(), "name": self.call_name}
        if self.deferred:
            echoed["defer_loading"] = True
        return echoed

    def for_template(self) -> dict[str, Any]:
        """As chat templates expect it (the Chat Completions tool shape)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["auto", "none", "required"]
    name: str | None = None  # a named function: mode "required" restricted to it
    custom: bool = False  # ``name`` is a custom tool ({"type": "custom", "name": ...})
    # ``allowed_tools``: the names the model may call (the others are not offered); None: all.
    allowed: tuple[str, ...] | None = None
    echo: Mapping[str, Any] | None = None  # the allowed_tools choice as sent

    def to_json(self) -> str | dict[str, Any]:
        if self.echo is not None:
            echoed: dict[str, Any] = _thaw_json(self.echo)
            return echoed
        if self.name is not None:
            return {"type": "custom" if self.custom else "function", "name": self.name}
        return self.mode


def _thaw_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw_json(v) for v in value]
    return value
