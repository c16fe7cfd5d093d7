"""What the model reads back from a tool the server ran: the texts that follow its call.

Used by the run (right after a call) and by replay (a stored ``web_search_call`` /
``mcp_call`` rendered for a later turn), so a model sees the same shape either way.

Invariants:
- Search results are numbered from 1 in the order given, the numbering that ``[n]`` citations
  refer to (``citations.url_citations``).
- Pure; every function returns text, never raises on odd input (a missing field reads as
  empty).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "failed_text",
    "mcp_result_text",
    "open_page_text",
    "replayed_search_text",
    "search_result_text",
]


def search_result_text(results: Sequence[tuple[str, str, str]]) -> str:
    """``(title, url, snippet)`` results as ``[1] <title>\\n<url>\\n<snippet>``, blank-line
    separated; ``No results.`` when there are none."""
    if not results:
        return "No results."
    return "\n\n".join(
        f"[{number}] {title}\n{url}\n{snippet}"
        for number, (title, url, snippet) in enumerate(results, 1)
    )


def open_page_text(title: str, url: str, text: str) -> str:
    """An opened page (or the excerpts a ``find_in_page`` found) under its title and URL."""
    return f"{title}\n{url}\n\n{text}"


def failed_text(reason: str) -> str:
    """A search that failed; ``reason`` is short and human (the backend's trouble)."""
    return f"The search failed: {reason}"


def mcp_result_text(output: str | None, error: Mapping[str, Any] | str | None) -> str:
    """An MCP tool's output, or ``Error: <message>`` when it failed."""
    if error is None:
        return output or ""
    return f"Error: {_error_message(error)}"


def _error_message(error: Mapping[str, Any] | str) -> str:
    if isinstance(error, str):
        return error
    message = error.get("message")
    if isinstance(message, str) and message:
        return message
    content = error.get("content")
    if isinstance(content, list | tuple):
        texts = [
            str(part["text"]) for part in content if isinstance(part, Mapping) and "text" in part
        ]
        if texts:
            return "\n".join(texts)
    return json.dumps(dict(error), default=str, sort_keys=True)


def replayed_search_text(item: Mapping[str, Any]) -> str:
    """A stored ``web_search_call`` for the model: its sources' URLs numbered as the results
    were, when stored; else whether it failed."""
    action = item.get("action")
    sources = action.get("sources") if isinstance(action, Mapping) else None
    urls = [
        str(source["url"])
        for source in sources or ()
        if isinstance(source, Mapping) and isinstance(source.get("url"), str)
    ]
    if urls:
        return "\n\n".join(f"[{number}] {url}" for number, url in enumerate(urls, 1))
    if item.get("status") == "failed":
        return "The search failed."
    return "Searched."
