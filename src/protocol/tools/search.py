"""Hosted tool discovery: ``tool_search``, ``defer_loading`` and the
``tool_search_call`` / ``tool_search_output`` items (pure).

Invariants:
- A deferred tool (``defer_loading: true``) is not offered to the model until a
  ``tool_search_output`` in the request's input has loaded it; the ``tool_search`` tool is
  offered as a function named ``tool_search`` whose description lists what can be searched
  (each deferred namespace and top-level function, with its description).
- The model's call to ``tool_search`` comes back as a ``tool_search_call`` item. With
  ``execution: "server"`` (the default) the server runs the search (``search``) and a
  ``tool_search_output`` item with the loaded definitions follows it; with ``"client"`` the
  response ends at the call and the client answers with a ``tool_search_output``.
- ``search`` is deterministic: a path naming a deferred namespace loads all its deferred
  functions, one naming a deferred function (by its own or its qualified name) loads it, any
  other text loads the deferred tools whose name and description hold all its words.
- The items (``objects.tool_search_call_item`` / ``tool_search_output_item``) validate strictly against the pinned SDK's ``ResponseToolSearchCall`` and
  ``ResponseToolSearchOutputItem``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import invalid_request
from ..items.read import FunctionCallOutput, InputItem
from ..objects import tool_search_call_item, tool_search_output_item
from .offered import SEARCH_NAME, FunctionTool, ToolChoice, echo_tools
from .parse import parse_tools

JsonObject = dict[str, Any]

_DESCRIPTION = (
    "Loads deferred tools so that you can call them: give the names (or words) of the tools "
    "to load in `paths`."
)


def searchable(tools: Iterable[FunctionTool]) -> list[str]:
    """The names a search can load: each deferred namespace, each deferred top-level tool."""
    names: list[str] = []
    for tool in tools:
        if not tool.deferred:
            continue
        name = tool.namespace or tool.name
        if name not in names:
            names.append(name)
    return names


def _catalog_text(tools: Sequence[FunctionTool]) -> str:
    lines: list[str] = []
    for name in searchable(tools):
        members = [t for t in tools if t.deferred and (t.namespace or t.name) == name]
        head = members[0]
        described = head.namespace_description if head.namespace else head.description or ""
        line = f"- {name}" + (f": {described}" if described else "")
        if head.namespace:
            line += f" (functions: {', '.join(t.call_name for t in members)})"
        lines.append(line)
    return "\n".join(lines)


def default_parameters(names: Sequence[str]) -> dict[str, Any]:
    """The model-facing schema of a ``tool_search`` with no ``parameters`` of its own; with
    ``names`` (server execution), the paths are constrained to them when the call is forced."""
    paths: dict[str, Any] = {
        "type": "array",
        "items": {"type": "string"},
        "minItems": 1,
        "description": "Names of the deferred tools or namespaces to load.",
    }
    if names:  # a forced call names searchable tools, each at most once
        paths["items"]["enum"] = list(names)
        paths["maxItems"] = len(names)
    return {
        "type": "object",
        "properties": {"paths": paths},
        "required": ["paths"],
        "additionalProperties": False,
    }


def with_catalog(tools: tuple[FunctionTool, ...]) -> tuple[FunctionTool, ...]:
    """Check the discovery rules over all tools and complete the ``tool_search`` tool: its
    description lists what is searchable, its default schema names it."""
    search_at = [i for i, t in enumerate(tools) if t.search is not None]
    deferred = [t for t in tools if t.deferred]
    if len(search_at) > 1:
        raise invalid_request(
            "Invalid value for 'tools': only one 'tool_search' tool may be given.",
            f"tools[{search_at[1]}]",
        )
    if not search_at:
        if deferred:
            raise invalid_request(
                f"Invalid value for 'tools': the tool {deferred[0].name!r} has defer_loading "
                "but no 'tool_search' tool is given to load it.",
                "tools",
            )
        return tools
    i = search_at[0]
    search = tools[i]
    names = searchable(tools)
    description = search.description or _DESCRIPTION
    if names:
        description += "\nSearchable tools:\n" + _catalog_text(deferred)
    parameters = search.parameters or default_parameters(names if search.search == "server" else [])
    completed = FunctionTool(
        SEARCH_NAME,
        description,
        parameters,
        False,
        search=search.search,
        search_echo=search.search_echo,
        catalog=tuple(deferred),
    )
    return (*tools[:i], completed, *tools[i + 1 :])


def loaded(tool: FunctionTool) -> FunctionTool:
    """A tool a search loaded, as it is offered: no longer deferred; a top-level function's
    calls carry ``namespace`` equal to its name, as OpenAI sends them (the Agents SDK routes a
    deferred top-level function's call by that)."""
    if tool.namespace is None and not tool.is_custom and tool.search is None:
        return dataclasses.replace(tool, deferred=False, namespace=tool.name, local_name=tool.name)
    return tool.undeferred()


def loaded_tools(items: Sequence[InputItem]) -> tuple[FunctionTool, ...]:
    """The tools that the ``tool_search_output`` items of ``items`` loaded, in order (each
    parsed as a request's tool; a 400 names ``input[i].tools``)."""
    loaded: list[FunctionTool] = []
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallOutput) and item.search_tools is not None:
            raw = json.loads(item.search_tools)
            try:
                parsed = parse_tools(raw)
            except Exception as exc:
                message = getattr(exc, "message", str(exc))
                raise invalid_request(
                    f"Invalid value for 'input[{i}].tools': {message}", f"input[{i}].tools"
                ) from None
            loaded.extend(parsed)
    return tuple(loaded)


def discoverable(
    tools: tuple[FunctionTool, ...], items: Sequence[InputItem]
) -> tuple[FunctionTool, ...]:
    """The tools the model may see and call: every tool but the deferred ones, then the
    tools loaded by a search in ``items`` (a deferred tool of the request under its own
    definition), without repeating a name."""
    tools = with_catalog(tools)
    offered = [t for t in tools if not t.deferred]
    names = {t.name for t in offered}
    by_name = {t.name: t for t in tools if t.deferred}
    for tool in loaded_tools(items):
        if tool.name in names or tool.search is not None:
            continue
        own = by_name.get(tool.name, tool)
        offered.append(loaded(own))
        names.add(tool.name)
    return tuple(offered)


MAX_SERVER_SEARCHES = 1  # per response: the continuation offers no tool_search again


def after_server_search(
    tools: tuple[FunctionTool, ...], choice: ToolChoice, output: Sequence[Mapping[str, Any]]
) -> tuple[tuple[FunctionTool, ...], ToolChoice] | None:
    """When the output so far ends with a server search's ``tool_search_output``, what the
    same response goes on generating with: the offered tools less ``tool_search``, plus the
    loaded ones; a choice that named ``tool_search`` becomes ``auto``, ``required`` stays
    (it now forces a call to a loaded tool). None: nothing to continue."""
    if not output or output[-1].get("type") != "tool_search_output":
        return None
    if output[-1].get("execution") != "server":
        return None
    searches = sum(1 for item in output if item.get("type") == "tool_search_call")
    if searches > MAX_SERVER_SEARCHES:
        return None
    kept = tuple(t for t in tools if t.search is None)
    names = {t.name for t in kept}
    found = [loaded(t) for t in parse_tools(list(output[-1].get("tools") or []))]
    added = tuple(t for t in found if t.name not in names and t.search is None)
    if not kept and not added:
        return None
    if choice.name == SEARCH_NAME:
        choice = ToolChoice("auto")
    elif choice.allowed is not None:
        allowed = tuple(n for n in choice.allowed if n != SEARCH_NAME)
        choice = dataclasses.replace(choice, allowed=allowed + tuple(t.name for t in added))
    return kept + added, choice


def search(catalog: Sequence[FunctionTool], arguments: str) -> list[JsonObject]:
    """A server-executed search: the definitions of the deferred tools the model's arguments
    (``{"paths": [...]}``, or ``{"query": ...}``) name, as ``tool_search_output.tools``."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    wanted: list[str] = [p for p in parsed.get("paths") or [] if isinstance(p, str)]
    for key in ("query", "queries"):
        value = parsed.get(key)
        if isinstance(value, str):
            wanted.append(value)
        elif isinstance(value, list):
            wanted += [v.get("query", "") if isinstance(v, dict) else str(v) for v in value]
    found: list[FunctionTool] = []
    for text in wanted:
        for tool in _matches(catalog, text.strip()):
            if tool not in found:
                found.append(tool)
    ordered = [t for t in catalog if t in found]  # in the order the request gave them
    return echo_tools(tuple(ordered))


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def _matches(catalog: Sequence[FunctionTool], text: str) -> list[FunctionTool]:
    if not text:
        return []
    exact = [
        t
        for t in catalog
        if text in (t.name, t.call_name, t.namespace, f"{t.namespace}.{t.call_name}")
    ]
    if exact:
        return exact
    words = _words(text)
    if not words:
        return []
    hits = []
    for tool in catalog:
        haystack = " ".join(
            filter(None, [tool.name, tool.description, tool.namespace, tool.namespace_description])
        )
        if words <= _words(haystack):
            hits.append(tool)
    return hits


__all__ = [
    "SEARCH_NAME",
    "after_server_search",
    "discoverable",
    "loaded",
    "loaded_tools",
    "search",
    "searchable",
    "tool_search_call_item",
    "tool_search_output_item",
    "with_catalog",
]
