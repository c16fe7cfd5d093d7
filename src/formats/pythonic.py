"""Pythonic tool calls (LFM2): ``<|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>``.

A Python list of calls with keyword arguments. Python literals do not stream as JSON, so the
block is held until its end marker (or the end of the generation) and read whole with ``ast``;
its calls then go out at once (start, the whole arguments, end), which keeps the chunking
invariant trivially. A block that does not read as a list of calls is shown as text.
JSON spellings ``true``/``false``/``null`` (templates render nested values as JSON) are read as
``True``/``False``/``None``; a value that is no literal is kept as its source text.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from .base import CallStream, NewIndex, ParsedEvent, Step, ToolSchemas
from .region import ToolRegion
from .scan_util import take_until

OPEN = "<|tool_call_start|>"
CLOSE = "<|tool_call_end|>"

_JSON_NAMES = {"true": True, "false": False, "null": None}


def _dotted(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        parent = _dotted(func.value)
        return f"{parent}.{func.attr}" if parent else None
    return None


def _value(node: ast.expr, source: str) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_value(e, source) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {
            str(_value(k, source)) if k is not None else "": _value(v, source)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.get_source_segment(source, node) or ""


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(a=1), g()]`` -> ``[("f", {"a": 1}), ("g", {})]``; None if it is not that."""
    source = text.strip()
    if not source.startswith("["):
        source = "[" + source + "]"  # some models drop the brackets around a single call
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        if name is None or any(k.arg is None for k in node.keywords):
            return None
        calls.append((name, {str(k.arg): _value(k.value, source) for k in node.keywords}))
    return calls


class PythonicRegion(ToolRegion):
    """After ``<|tool_call_start|>``: the held block, read at its end (module docstring)."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(marker, new_index, schemas)
        self._body: list[str] = []

    def step(self, buf: str, final: bool) -> Step:
        out: list[ParsedEvent] = []
        text, pos, stop = take_until(buf, 0, (CLOSE,), final)
        self._body.append(text)
        if stop is None and not final:
            return Step(pos, out)
        body = "".join(self._body)
        calls = parse_calls(body)
        if calls is None:
            self._note(body + (stop or ""))
            return self._revert(pos, out)
        for name, arguments in calls:
            stream = CallStream(self._new_index)
            stream.start(name, out)
            stream.end(json.dumps(arguments, ensure_ascii=False), out)
        return Step(pos, out, done=True)
