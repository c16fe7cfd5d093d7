"""The hosted tools' items as the model reads them: a call and its output (pure; ``text.chat``
renders them, ``compaction.item_text`` writes them in a transcript).

Invariants:
- A ``web_search_call`` is the call of the function ``web_search`` with the arguments its action
  implies (``search``: ``{"query"}``; ``open_page``: ``{"url"}``; ``find_in_page``:
  ``{"url", "pattern"}``), then its output: the text the model read when the response ran it
  (``model_text``), else ``replayed_search_text`` of the stored item.
- An ``mcp_call`` is the call of ``mcp__<server_label>__<name>`` with its arguments (``{}``
  when they are no JSON object, as a call cancelled mid-arguments may hold), then its output:
  ``mcp_result_text(output, error)``.
- Both pairs' call_id is the item's id. ``mcp_list_tools``, ``mcp_approval_request`` and
  ``mcp_approval_response`` render nothing; every other item renders as itself.
"""

from __future__ import annotations

import json
from typing import Any

from ..tools.hosted import WEB_SEARCH_NAME, mcp_function_name
from ..tools.hosted_text import mcp_result_text, replayed_search_text
from .values import (
    FunctionCall,
    FunctionCallOutput,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    SearchAction,
    TurnItem,
    WebSearchCall,
)
from .write import hosted_json


def model_turns(item: TurnItem) -> tuple[TurnItem, ...]:
    """What ``item`` renders as (see the module's invariants)."""
    match item:
        case WebSearchCall(item_id, _, action, model_text):
            text = model_text if model_text is not None else replayed_search_text(hosted_json(item))
            arguments = json.dumps(search_arguments(action), ensure_ascii=False)
            return (
                FunctionCall(item_id, WEB_SEARCH_NAME, arguments),
                FunctionCallOutput(item_id, text),
            )
        case McpCall():
            name = mcp_function_name(item.server_label, item.name)
            error = None if item.error is None else json.loads(item.error)
            return (
                FunctionCall(item.id, name, _object_text(item.arguments)),
                FunctionCallOutput(item.id, mcp_result_text(item.output, error)),
            )
        case McpListTools() | McpApprovalRequest() | McpApprovalResponse():
            return ()
    return (item,)


def search_arguments(action: SearchAction) -> dict[str, str]:
    """The ``web_search`` function's arguments that ``action`` took."""
    match action.type:
        case "find_in_page":
            return {"url": action.url or "", "pattern": action.pattern or ""}
        case "open_page":
            return {} if action.url is None else {"url": action.url}
    query = action.query if action.query is not None else next(iter(action.queries or ()), None)
    return {} if query is None else {"query": query}


def _object_text(arguments: str) -> str:
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = None
    return arguments if isinstance(parsed, dict) else "{}"
