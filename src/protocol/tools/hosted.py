"""Tools the server runs: ``web_search`` (and ``web_search_preview``) and remote ``mcp``
servers, parsed strictly at the edge into values (pure).

Invariants:
- A ``web_search`` tool is offered to the model as the function ``web_search``
  (``WEB_SEARCH_PARAMETERS``): a query searches, a ``url`` opens a page, a ``url`` with a
  ``pattern`` finds text in it. Its ``FunctionTool`` carries ``hosted`` (the kind and the
  tool as sent, which the Response echoes).
- An ``mcp`` tool is an ``McpSpec``: the server's label, URL and headers, which of its tools
  are allowed and which need approval. It has no functions until its tools are listed
  (``actors/hosted_prep.py``); each listed tool ``T`` of server ``L`` is then offered as the
  function ``mcp__L__T`` (``mcp_function``).
- What the operator has not enabled is a 400 naming the flag that enables it, before any
  model work; ``--unsupported-tools drop`` drops such a tool instead, as decision 6 says.
- Fields this server cannot honour (``connector_id``, ``tunnel_id``, ``user_location``'s
  fields, ``defer_loading`` on an ``mcp`` tool) are a 400 naming the field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..errors import invalid_request
from ..items.read import json_type
from .spec import FunctionTool, Hosted, ToolChoice

log = logging.getLogger(__name__)

WEB_SEARCH_TYPES: Final = frozenset(
    {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
)
WEB_SEARCH_NAME: Final = "web_search"
WEB_SEARCH_DESCRIPTION: Final = "Search the web. Returns numbered sources; cite them as [1], [2]."
WEB_SEARCH_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        # Bounded, so a forced call ends whatever the model writes (the grammar's promise).
        "query": {"type": "string", "description": "What to search the web for.", "maxLength": 200},
        "url": {"type": "string", "description": "A page to open instead of searching."},
        "pattern": {"type": "string", "description": "With url: the text to find in that page."},
    },
    # A forced call (``tool_choice: {"type": "web_search"}``) always has something to search.
    "required": ["query"],
}
_WEB_SEARCH_KEYS: Final = frozenset(
    {
        "type",
        "filters",
        "search_context_size",
        "user_location",
        "external_web_access",
        "search_content_types",
    }
)
_MCP_KEYS: Final = frozenset(
    {
        "type",
        "server_label",
        "server_url",
        "server_description",
        "headers",
        "authorization",
        "allowed_tools",
        "require_approval",
        "connector_id",
        "tunnel_id",
        "defer_loading",
        "allowed_callers",
    }
)
CONTEXT_SIZES: Final = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class HostedSwitches:
    """What the operator enabled: a search backend, MCP hosts (``--web-search``,
    ``--mcp-allow-hosts``)."""

    web_search: bool = False
    mcp: bool = False
    drop_unsupported: bool = False


@dataclass(frozen=True, slots=True)
class WebSearchSpec:
    """A ``web_search`` tool's settings the backend honours."""

    allowed_domains: tuple[str, ...] = ()
    context_size: Literal["low", "medium", "high"] = "medium"


@dataclass(frozen=True, slots=True)
class McpSpec:
    """An ``mcp`` tool: one remote MCP server."""

    label: str
    url: str
    headers: tuple[tuple[str, str], ...]
    description: str | None
    # ``allowed_tools``: the tool names allowed (None: all), and ``read_only`` (only tools
    # whose annotations say ``readOnlyHint``).
    allowed: tuple[str, ...] | None
    read_only: bool
    # ``require_approval``: the default for tools not named, and the named exceptions.
    approval_default: bool
    always: tuple[str, ...]
    never: tuple[str, ...]
    echo: Mapping[str, Any]  # the tool as sent, less its credentials (``_SECRET_KEYS``)
    index: int  # its place in ``tools`` (the path of its errors)

    def needs_approval(self, name: str) -> bool:
        if name in self.never:
            return False
        return name in self.always or self.approval_default

    def allows(self, name: str, annotations: Mapping[str, Any] | None) -> bool:
        if self.allowed is not None and name not in self.allowed:
            return False
        return not self.read_only or bool((annotations or {}).get("readOnlyHint"))


def web_search_spec(tool: FunctionTool) -> WebSearchSpec:
    """The settings of an offered ``web_search`` function (from the tool as sent)."""
    echo = tool.hosted.echo if tool.hosted is not None else None
    if echo is None:
        return WebSearchSpec()
    filters = echo.get("filters") or {}
    domains = tuple(filters.get("allowed_domains") or ())
    size = echo.get("search_context_size")
    return WebSearchSpec(
        domains, "low" if size == "low" else "high" if size == "high" else "medium"
    )


def parse_web_search(
    tool: Mapping[str, Any], path: str, switches: HostedSwitches
) -> FunctionTool | None:
    """A ``web_search`` tool as its model-facing function; None when it is dropped."""
    if not switches.web_search:
        _not_enabled(path, "web_search tools", "--web-search local|searxng", switches)
        return None
    _no_unknown(tool, _WEB_SEARCH_KEYS, path)
    filters = tool.get("filters")
    if filters is not None:
        _web_filters(filters, f"{path}.filters")
    size = tool.get("search_context_size")
    if size is not None and size not in CONTEXT_SIZES:
        raise invalid_request(
            f"Invalid value for '{path}.search_context_size': {size!r}; expected 'low', "
            "'medium' or 'high'.",
            f"{path}.search_context_size",
        )
    _user_location(tool.get("user_location"), f"{path}.user_location")
    kinds = tool.get("search_content_types")
    if kinds is not None and kinds != ["text"]:
        raise invalid_request(
            f"Invalid value for '{path}.search_content_types': this server's search returns "
            "text only (['text']).",
            f"{path}.search_content_types",
        )
    hosted = Hosted("web_search", echo=dict(tool))
    return FunctionTool(
        WEB_SEARCH_NAME, WEB_SEARCH_DESCRIPTION, WEB_SEARCH_PARAMETERS, False, hosted=hosted
    )


def _web_filters(filters: object, path: str) -> None:
    if not isinstance(filters, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(filters)}.", path
        )
    _no_unknown(filters, frozenset({"allowed_domains"}), path)
    domains = filters.get("allowed_domains")
    if domains is None:
        return
    if not isinstance(domains, list) or not all(
        isinstance(d, str) and d.strip() and "/" not in d for d in domains
    ):
        raise invalid_request(
            f"Invalid value for '{path}.allowed_domains': expected an array of domain names "
            "(such as 'example.com', no scheme or path).",
            f"{path}.allowed_domains",
        )


def _user_location(location: object, path: str) -> None:
    """Accepted when absent or ``{"type": "approximate"}`` alone: the search backends here
    cannot localise results, so a location field is refused by name rather than ignored."""
    if location is None:
        return
    if not isinstance(location, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(location)}.",
            path,
        )
    for key, value in location.items():
        if key == "type" and value in ("approximate", None):
            continue
        if value is None:
            continue
        raise invalid_request(
            f"Invalid value for '{path}.{key}': this server's search backends cannot localise "
            "results; send user_location without location fields, or leave it out.",
            f"{path}.{key}",
        )


def parse_mcp(
    tool: Mapping[str, Any], path: str, index: int, switches: HostedSwitches
) -> McpSpec | None:
    """An ``mcp`` tool as an ``McpSpec``; None when it is dropped."""
    for key in ("connector_id", "tunnel_id"):
        if tool.get(key) is not None:
            raise invalid_request(
                f"Invalid value for '{path}.{key}': this server reaches MCP servers by "
                "'server_url' only; service connectors and tunnels are not available.",
                f"{path}.{key}",
            )
    if not switches.mcp:
        _not_enabled(path, "mcp tools (remote MCP servers)", "--mcp-allow-hosts", switches)
        return None
    _no_unknown(tool, _MCP_KEYS, path)
    label = tool.get("server_label")
    if not isinstance(label, str) or not label or not label.replace("_", "").isalnum():
        raise invalid_request(
            f"Invalid value for '{path}.server_label': expected letters, digits and '_', "
            f"but got {label!r}.",
            f"{path}.server_label",
        )
    url = tool.get("server_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise invalid_request(
            f"Invalid value for '{path}.server_url': expected an http or https URL, but got "
            f"{url!r}.",
            f"{path}.server_url",
        )
    if tool.get("defer_loading"):
        raise invalid_request(
            f"Invalid value for '{path}.defer_loading': deferred MCP servers are not "
            "supported; list the server's tools directly.",
            f"{path}.defer_loading",
        )
    description = tool.get("server_description")
    if description is not None and not isinstance(description, str):
        raise invalid_request(
            f"Invalid type for '{path}.server_description': expected a string.",
            f"{path}.server_description",
        )
    allowed, read_only = _allowed_tools(tool.get("allowed_tools"), f"{path}.allowed_tools")
    default, always, never = _approval(tool.get("require_approval"), f"{path}.require_approval")
    headers = _headers(tool, path)
    return McpSpec(
        label,
        url,
        headers,
        description,
        allowed,
        read_only,
        default,
        always,
        never,
        {key: value for key, value in tool.items() if key not in _SECRET_KEYS},
        index,
    )


# Used for the server's requests, never echoed or stored (as OpenAI does not persist them: a
# client sends them with every request).
_SECRET_KEYS = frozenset({"authorization", "headers"})


def _headers(tool: Mapping[str, Any], path: str) -> tuple[tuple[str, str], ...]:
    raw = tool.get("headers") or {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise invalid_request(
            f"Invalid value for '{path}.headers': expected an object of string values.",
            f"{path}.headers",
        )
    headers = dict(raw)
    token = tool.get("authorization")
    if token is not None:
        if not isinstance(token, str) or not token:
            raise invalid_request(
                f"Invalid value for '{path}.authorization': expected a non-empty string.",
                f"{path}.authorization",
            )
        headers["Authorization"] = f"Bearer {token}"
    return tuple(headers.items())


def _names(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise invalid_request(f"Invalid value for '{path}': expected an array of tool names.", path)
    return tuple(value)


def _allowed_tools(raw: object, path: str) -> tuple[tuple[str, ...] | None, bool]:
    """``allowed_tools``: an array of names, or ``{"tool_names": [...], "read_only": bool}``."""
    if raw is None:
        return None, False
    if isinstance(raw, list):
        return _names(raw, path), False
    if not isinstance(raw, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an array of tool names or a filter object, "
            f"but got {json_type(raw)}.",
            path,
        )
    _no_unknown(raw, frozenset({"tool_names", "read_only"}), path)
    names = raw.get("tool_names")
    read_only = raw.get("read_only", False)
    if not isinstance(read_only, bool):
        raise invalid_request(
            f"Invalid type for '{path}.read_only': expected a boolean.", f"{path}.read_only"
        )
    return (None if names is None else _names(names, f"{path}.tool_names")), read_only


def _approval(raw: object, path: str) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """``require_approval``: ``"always"`` (OpenAI's default), ``"never"``, or
    ``{"always": {"tool_names": [...]}, "never": {"tool_names": [...]}}`` (tools named in
    neither need approval, as OpenAI's default)."""
    if raw is None or raw == "always":
        return True, (), ()
    if raw == "never":
        return False, (), ()
    if not isinstance(raw, dict):
        raise invalid_request(
            f"Invalid value for '{path}': expected 'always', 'never' or an object of "
            "'always' / 'never' tool filters.",
            path,
        )
    _no_unknown(raw, frozenset({"always", "never"}), path)
    lists: list[tuple[str, ...]] = []
    for key in ("always", "never"):
        entry = raw.get(key) or {}
        if not isinstance(entry, dict):
            raise invalid_request(
                f"Invalid type for '{path}.{key}': expected an object with 'tool_names'.",
                f"{path}.{key}",
            )
        _no_unknown(entry, frozenset({"tool_names", "read_only"}), f"{path}.{key}")
        lists.append(_names(entry.get("tool_names") or [], f"{path}.{key}.tool_names"))
    return True, lists[0], lists[1]


def _no_unknown(value: Mapping[str, Any], known: frozenset[str], path: str) -> None:
    extra = sorted(set(value) - known)
    if extra:
        raise invalid_request(f"Unknown parameter: '{path}.{extra[0]}'.", f"{path}.{extra[0]}")


def _not_enabled(path: str, what: str, flag: str, switches: HostedSwitches) -> None:
    """A 400 naming ``flag``, unless ``--unsupported-tools drop`` drops the tool."""
    if switches.drop_unsupported:
        log.warning("dropping %s: %s not enabled", path, what)
        return
    raise invalid_request(
        f"Invalid value for '{path}.type': {what} are not enabled on this server (start it "
        f"with {flag}; see docs/tools.md).",
        f"{path}.type",
    )


def mcp_function(spec: McpSpec, listed: Mapping[str, Any]) -> FunctionTool:
    """A listed MCP tool (``mcp_list_tools.tools[i]``) as the function the model calls."""
    name = str(listed["name"])
    schema = listed.get("input_schema") or {"type": "object", "properties": {}}
    hosted = Hosted("mcp", server_label=spec.label, approval=spec.needs_approval(name))
    return FunctionTool(
        mcp_function_name(spec.label, name),
        listed.get("description"),
        dict(schema),
        False,
        local_name=name,
        hosted=hosted,
    )


def mcp_function_name(label: str, name: str) -> str:
    """The name the model sees for tool ``name`` of the MCP server labelled ``label``."""
    return f"mcp__{label}__{name}"


def listed_tools(items: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Server label -> the latest ``mcp_list_tools`` item for it among ``items`` without an
    error (a chain reuses its listing, as OpenAI does)."""
    found: dict[str, Mapping[str, Any]] = {}
    for item in items:
        if item.get("type") == "mcp_list_tools" and not item.get("error"):
            found[str(item.get("server_label"))] = item
    return found


@dataclass(frozen=True, slots=True)
class HostedChoice:
    """A ``tool_choice`` naming a hosted tool, resolved once the MCP tools are listed."""

    kind: Literal["web_search", "mcp"]
    server_label: str = ""
    name: str | None = None
    echo: Mapping[str, Any] | None = None


def parse_hosted_choice(
    raw: Mapping[str, Any], tools: tuple[FunctionTool, ...], servers: tuple[McpSpec, ...]
) -> HostedChoice:
    """``{"type": "web_search" | "web_search_preview"}`` or ``{"type": "mcp", "server_label",
    "name"?}``: the tool must be among ``tools``."""
    kind = raw.get("type")
    if kind in WEB_SEARCH_TYPES:
        _no_unknown(raw, frozenset({"type"}), "tool_choice")
        if not any(t.hosted is not None and t.hosted.kind == "web_search" for t in tools):
            raise invalid_request(
                "Invalid value for 'tool_choice': it names web_search, which is not one of "
                "the tools.",
                "tool_choice",
            )
        # The Response echoes it as the SDK's ToolChoiceTypes spells a forced search
        # (``web_search_preview``: it has no ``web_search`` member), so it validates.
        echoed = kind if kind.startswith("web_search_preview") else "web_search_preview"
        return HostedChoice("web_search", echo={"type": echoed})
    _no_unknown(raw, frozenset({"type", "server_label", "name"}), "tool_choice")
    label, name = raw.get("server_label"), raw.get("name")
    if label not in {s.label for s in servers}:
        raise invalid_request(
            f"Invalid value for 'tool_choice.server_label': {label!r} is not the label of "
            "one of the mcp tools.",
            "tool_choice.server_label",
        )
    if name is not None and not isinstance(name, str):
        raise invalid_request(
            "Invalid type for 'tool_choice.name': expected a string.", "tool_choice.name"
        )
    return HostedChoice("mcp", str(label), name, dict(raw))


def resolve_choice(choice: HostedChoice, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """The ``ToolChoice`` a hosted choice forces once the tools are known: a named function,
    or (an MCP server without a name) a call to any of its tools."""
    if choice.kind == "web_search":
        return ToolChoice("required", WEB_SEARCH_NAME, echo=choice.echo)
    if choice.name is not None:
        wanted = mcp_function_name(choice.server_label, choice.name)
        if wanted not in {t.name for t in tools}:
            raise invalid_request(
                f"Invalid value for 'tool_choice.name': {choice.name!r} is not a tool the MCP "
                f"server {choice.server_label!r} lists (or allows).",
                "tool_choice.name",
            )
        return ToolChoice("required", wanted, echo=choice.echo)
    names = tuple(
        t.name
        for t in tools
        if t.hosted is not None and t.hosted.server_label == choice.server_label
    )
    if not names:
        raise invalid_request(
            f"Invalid value for 'tool_choice.server_label': the MCP server "
            f"{choice.server_label!r} lists no allowed tools.",
            "tool_choice.server_label",
        )
    return ToolChoice("required", allowed=names, echo=choice.echo)


__all__ = [
    "CONTEXT_SIZES",
    "WEB_SEARCH_NAME",
    "WEB_SEARCH_PARAMETERS",
    "WEB_SEARCH_TYPES",
    "HostedChoice",
    "HostedSwitches",
    "McpSpec",
    "WebSearchSpec",
    "listed_tools",
    "mcp_function",
    "mcp_function_name",
    "parse_hosted_choice",
    "parse_mcp",
    "parse_web_search",
    "resolve_choice",
    "web_search_spec",
]
