"""Function, namespace, custom and ``tool_search`` tools, and ``tool_choice``: strict parsing
into frozen values (pure).

Invariants:
- Each parser here reads one entry of ``tools`` (``parse.py`` dispatches the array by type,
  the hosted ``web_search`` and ``mcp`` tools to ``hosted.py``); a ``namespace`` tool that
  only wraps function tools is flattened.
- ``tool_choice`` is ``auto``, ``none``, ``required`` or one named function, in the flat
  (``{"type": "function", "name": ...}``) or the nested (``{"type": "function", "function":
  {"name": ...}}``) form; a named function must be one of ``tools``.
- Tool names are 1-128 of letters, digits, ``_-.:``; ``parameters`` is a JSON-schema object.
- A function inside a ``namespace`` tool keeps its namespace: the model sees it under its
  qualified name (``qualified_name``: ``mcp__weather`` + ``get_weather`` ->
  ``mcp__weather__get_weather``), the ``function_call`` item carries ``name`` and ``namespace``
  apart, and the Response echoes the namespace tool as it was sent (``echo_tools``).
- ``defer_loading: true`` marks a tool ``deferred``; a ``tool_search`` tool is a
  ``FunctionTool`` with ``search`` set (``tool_search.py`` decides what the model sees).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..check_memo import CheckMemo
from ..errors import invalid_request
from ..items.read import json_type, optional_str
from .spec import FunctionTool, ToolChoice, qualified_name

# The tool values live in ``tool_spec`` (so that ``items`` can name tools without importing
# the parsers); importers of ``tools`` keep finding them here.
__all__ = [
    "CUSTOM_INPUT",
    "SEARCH_NAME",
    "FunctionTool",
    "ToolChoice",
    "custom_parameters",
    "custom_tool",
    "echo_tools",
    "function_tool",
    "namespace_tools",
    "offered_tools",
    "parameters_problem",
    "parse_search_tool",
    "parse_tool_choice",
    "qualified_name",
    "schema_problem",
]

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
SEARCH_NAME = "tool_search"
_SEARCH_KEYS = frozenset({"type", "execution", "description", "parameters"})


def offered_tools(tools: tuple[FunctionTool, ...], choice: ToolChoice) -> tuple[FunctionTool, ...]:
    """The tools the model is shown: all of them, or the ``allowed_tools`` subset."""
    if choice.allowed is None:
        return tools
    return tuple(tool for tool in tools if tool.name in choice.allowed)


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (its ``$schema`` dialect, else 2020-12), or
    None when it is. Remembered per schema (an agent resends its tools every turn;
    ``check_memo.py``, exact)."""
    return _SCHEMA_PROBLEMS(schema)


def parameters_problem(parameters: object, path: str) -> str | None:
    """A tool's ``parameters`` at ``path``: a 400 unless it is a JSON object; then why it is not
    a valid JSON Schema, or None."""
    if not isinstance(parameters, dict):
        raise invalid_request(
            f"Invalid type for '{path}.parameters': expected a JSON schema object, but got "
            f"{json_type(parameters)}.",
            f"{path}.parameters",
        )
    return schema_problem(parameters)


def _schema_problem(schema: Mapping[str, Any]) -> str | None:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        return f"{exc.message}" + (f" (at {where.lstrip('.')})" if where else "")
    return None


_SCHEMA_PROBLEMS = CheckMemo(_schema_problem, max_entries=512)


def _name_and_description(spec: Mapping[str, Any], path: str, what: str) -> tuple[str, str | None]:
    """A tool's ``name`` (1-128 of letters, digits, ``_-.:``) and optional ``description``."""
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid_request(
            f"Invalid value for '{path}.name': expected a {what} name of 1-128 letters, "
            f"digits, '_', '-', '.' or ':', but got {name!r}.",
            f"{path}.name",
        )
    return name, optional_str(spec, "description", path)


def _deferred(spec: Mapping[str, Any], path: str) -> bool:
    value = spec.get("defer_loading", False)
    if not isinstance(value, bool):
        raise invalid_request(
            f"Invalid type for '{path}.defer_loading': expected a boolean, but got "
            f"{json_type(value)}.",
            f"{path}.defer_loading",
        )
    return value


def function_tool(tool: Mapping[str, Any], path: str) -> FunctionTool:
    """A ``function`` tool, flat or with its fields under ``function``."""
    spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    assert isinstance(spec, Mapping)
    name, description = _name_and_description(spec, path, "function")
    parameters = spec.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    problem = parameters_problem(parameters, path)
    if problem is not None:
        raise invalid_request(
            f"Invalid schema for function '{name}': '{path}.parameters' is not a valid JSON "
            f"Schema: {problem}.",
            f"{path}.parameters",
        )
    strict = spec.get("strict", True)
    if not isinstance(strict, bool):
        raise invalid_request(
            f"Invalid type for '{path}.strict': expected a boolean, but got {json_type(strict)}.",
            f"{path}.strict",
        )
    return FunctionTool(name, description, parameters, strict, deferred=_deferred(spec, path))


def echo_tools(tools: tuple[FunctionTool, ...]) -> list[dict[str, Any]]:
    """The ``tools`` a Response echoes: namespaced functions regrouped into their namespace."""
    echoed: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    for tool in tools:
        if tool.namespace is None:
            echoed.append(tool.echo_json())
            continue
        group = groups.get(tool.namespace)
        if group is None:
            group = {
                "type": "namespace",
                "name": tool.namespace,
                "description": tool.namespace_description,
                "tools": [],
            }
            groups[tool.namespace] = group
            echoed.append(group)
        group["tools"].append(tool.echo_json())
    return echoed


def namespace_tools(tool: Mapping[str, Any], path: str) -> list[FunctionTool]:
    """A ``namespace`` tool's functions, each under its qualified name."""
    namespace = tool.get("name")
    if not isinstance(namespace, str) or not _NAME.match(namespace):
        raise invalid_request(
            f"Invalid value for '{path}.name': expected a namespace name of 1-128 letters, "
            f"digits, '_', '-', '.' or ':', but got {namespace!r}.",
            f"{path}.name",
        )
    description = tool.get("description", "")
    if not isinstance(description, str):
        raise invalid_request(
            f"Invalid type for '{path}.description': expected a string, but got "
            f"{json_type(description)}.",
            f"{path}.description",
        )
    inner: list[FunctionTool] = []
    for j, entry in enumerate(tool["tools"]):
        function = function_tool(entry, f"{path}.tools[{j}]")
        qualified = qualified_name(namespace, function.name)
        if not _NAME.match(qualified):
            raise invalid_request(
                f"Invalid value for '{path}.tools[{j}].name': the qualified name {qualified!r} "
                "is longer than 128 characters.",
                f"{path}.tools[{j}].name",
            )
        inner.append(
            FunctionTool(
                qualified,
                function.description,
                function.parameters,
                function.strict,
                namespace=namespace,
                namespace_description=description,
                local_name=function.name,
                deferred=function.deferred,
            )
        )
    return inner


CUSTOM_INPUT = "input"
_SYNTAXES = ("lark", "regex")


def custom_parameters(fmt: Mapping[str, Any]) -> dict[str, Any]:
    """A custom tool as the model is offered it: one string parameter, ``input``; a regex format
    becomes its ``pattern`` (so a forced call is constrained to it)."""
    described = "The tool's freeform input."
    string: dict[str, Any] = {"type": "string"}
    if fmt.get("type") == "grammar":
        described += f" It must follow this {fmt['syntax']} grammar:\n{fmt['definition']}"
        if fmt["syntax"] == "regex":  # JSON Schema patterns are unanchored: anchor it
            string["pattern"] = f"^(?:{fmt['definition']})$"
    string["description"] = described
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: string},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }


def _custom_format(raw: object, path: str) -> dict[str, Any]:
    if raw is None:
        return {"type": "text"}
    if not isinstance(raw, dict):
        raise invalid_request(
            f"Invalid type for '{path}': expected an object, but got {json_type(raw)}.", path
        )
    kind = raw.get("type")
    if kind == "text":
        extra = sorted(set(raw) - {"type"})
    elif kind == "grammar":
        extra = sorted(set(raw) - {"type", "syntax", "definition"})
        syntax, definition = raw.get("syntax"), raw.get("definition")
        if syntax not in _SYNTAXES:
            raise invalid_request(
                f"Invalid value for '{path}.syntax': {syntax!r}; expected 'lark' or 'regex'.",
                f"{path}.syntax",
            )
        if not isinstance(definition, str) or not definition:
            raise invalid_request(
                f"Invalid value for '{path}.definition': expected a non-empty {syntax} grammar.",
                f"{path}.definition",
            )
        if syntax == "regex":
            try:
                re.compile(definition)
            except re.error as exc:
                raise invalid_request(
                    f"Invalid value for '{path}.definition': not a valid regex: {exc}.",
                    f"{path}.definition",
                ) from None
    else:
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r}; expected 'text' or 'grammar'.",
            f"{path}.type",
        )
    if extra:
        raise invalid_request(f"Unknown parameter: '{path}.{extra[0]}'.", f"{path}.{extra[0]}")
    return dict(raw)


def custom_tool(tool: Mapping[str, Any], path: str) -> FunctionTool:
    """A ``custom`` tool: one string parameter (``custom_parameters``) in its format."""
    name, description = _name_and_description(tool, path, "tool")
    extra = sorted(set(tool) - {"type", "name", "description", "format", "defer_loading"})
    if extra:
        raise invalid_request(f"Unknown parameter: '{path}.{extra[0]}'.", f"{path}.{extra[0]}")
    fmt = _custom_format(tool.get("format"), f"{path}.format")
    return FunctionTool(
        name,
        description,
        custom_parameters(fmt),
        True,
        custom_format=fmt,
        deferred=_deferred(tool, path),
    )


def parse_search_tool(spec: Mapping[str, Any], path: str) -> FunctionTool:
    """``{"type": "tool_search", "execution", "description", "parameters"}`` (its model-facing
    description and schema are completed by ``with_catalog`` once every tool is known)."""
    extra = sorted(set(spec) - _SEARCH_KEYS)
    if extra:
        raise invalid_request(f"Unknown parameter: '{path}.{extra[0]}'.", f"{path}.{extra[0]}")
    execution = spec.get("execution", "server")
    if execution not in ("server", "client"):
        raise invalid_request(
            f"Invalid value for '{path}.execution': {execution!r}; expected 'server' or 'client'.",
            f"{path}.execution",
        )
    description = optional_str(spec, "description", path)
    parameters = spec.get("parameters")
    if parameters is not None:
        problem = parameters_problem(parameters, path)
        if problem is not None:
            raise invalid_request(
                f"Invalid schema for '{path}.parameters': {problem}.", f"{path}.parameters"
            )
        if execution == "server":
            raise invalid_request(
                f"Invalid value for '{path}.parameters': only a client-executed tool search "
                "(execution 'client') takes a parameter schema.",
                f"{path}.parameters",
            )
    return FunctionTool(
        SEARCH_NAME,
        description,
        parameters if parameters is not None else {},
        False,
        search=execution,
        search_echo=dict(spec),
    )


def parse_tool_choice(raw: object, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto")
    if isinstance(raw, str):
        if raw in ("auto", "none", "required"):
            if raw == "required" and not tools:
                raise invalid_request(
                    "Invalid value for 'tool_choice': 'required' needs at least one tool.",
                    "tool_choice",
                )
            return ToolChoice(raw)  # type: ignore[arg-type]
        raise invalid_request(
            f"Invalid value for 'tool_choice': {raw!r}; expected 'auto', 'none', 'required' or "
            'a function {"type": "function", "name": ...}.',
            "tool_choice",
        )
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        return _allowed_tools(raw, tools)
    if isinstance(raw, dict) and raw.get("type") == "custom":
        name = raw.get("name")
        custom = {t.name for t in tools if t.is_custom}
        if not isinstance(name, str) or name not in custom:
            raise invalid_request(
                f"Invalid value for 'tool_choice.name': {name!r} is not one of the custom tools.",
                "tool_choice.name",
            )
        return ToolChoice("required", name, custom=True)
    if isinstance(raw, dict) and raw.get("type") == "function":
        nested = raw.get("function")
        name = nested.get("name") if isinstance(nested, dict) else raw.get("name")
        if not isinstance(name, str):
            raise invalid_request(
                "Missing required parameter: 'tool_choice.name'.", "tool_choice.name"
            )
        if name not in {t.name for t in tools}:
            # A namespaced function may be named by its own name when that is unambiguous.
            matches = [t.name for t in tools if t.namespace is not None and t.call_name == name]
            if len(matches) != 1:
                raise invalid_request(
                    f"Invalid value for 'tool_choice.name': {name!r} is not one of the tools.",
                    "tool_choice.name",
                )
            return ToolChoice("required", matches[0])
        return ToolChoice("required", name)
    raise invalid_request(
        f"Invalid value for 'tool_choice': expected a string or a function object, but got "
        f"{json_type(raw)}{' of type ' + repr(raw.get('type')) if isinstance(raw, dict) else ''}.",
        "tool_choice",
    )


def _allowed_tools(raw: Mapping[str, Any], tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """``{"type": "allowed_tools", "mode": "auto" | "required", "tools": [...]}``."""
    extra = sorted(set(raw) - {"type", "mode", "tools"})
    if extra:
        raise invalid_request(
            f"Unknown parameter: 'tool_choice.{extra[0]}'.", f"tool_choice.{extra[0]}"
        )
    mode = raw.get("mode")
    if mode not in ("auto", "required"):
        raise invalid_request(
            f"Invalid value for 'tool_choice.mode': {mode!r}; expected 'auto' or 'required'.",
            "tool_choice.mode",
        )
    listed = raw.get("tools")
    if not isinstance(listed, list) or not listed:
        raise invalid_request(
            "Invalid value for 'tool_choice.tools': expected a non-empty array of tools.",
            "tool_choice.tools",
        )
    by_name = {t.name: t for t in tools} | {t.call_name: t for t in tools if t.namespace}
    allowed: list[str] = []
    for i, entry in enumerate(listed):
        path = f"tool_choice.tools[{i}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        kind = entry.get("type") if isinstance(entry, dict) else None
        tool = by_name.get(name) if isinstance(name, str) else None
        if (
            tool is None
            or kind not in ("function", "custom")
            or (kind == "custom") != tool.is_custom
        ):
            raise invalid_request(
                f"Invalid value for '{path}': {name!r} is not one of the {kind or 'function'} "
                "tools.",
                path,
            )
        allowed.append(tool.name)
    return ToolChoice(mode, allowed=tuple(allowed), echo=raw)
