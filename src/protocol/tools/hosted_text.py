"""What the model reads as a hosted tool's result (pure; used by the run and by replay).

Invariants:
- The texts are fixed shapes: a search's numbered sources, an opened page, a failure, an MCP
  tool's output or error, and a stored ``web_search_call`` replayed without its results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def search_result_text(results: Sequence[tuple[str, str, str]]) -> str:
    """``(title, url, snippet)`` results as numbered sources."""
    if not results:
        return "No results."
    return "\n\n".join(
        f"[{n}] {title}\n{url}\n{snippet}" for n, (title, url, snippet) in enumerate(results, 1)
    )


def open_page_text(title: str, url: str, text: str) -> str:
    return f"{title}\n{url}\n\n{text}"


def failed_text(reason: str) -> str:
    return f"The search failed: {reason}"


def mcp_result_text(output: str | None, error: Mapping[str, Any] | str | None) -> str:
    """The output, or "Error: <message>" from the error (its ``message``, else the text of its
    ``content``, else its JSON)."""
    if error is None:
        return output or ""
    if isinstance(error, str):
        return f"Error: {error}"
    message = error.get("message")
    if isinstance(message, str):
        return f"Error: {message}"
    content = error.get("content")
    if isinstance(content, str):
        return f"Error: {content}"
    if isinstance(content, list):
        texts = [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        if texts:
            return "Error: " + "\n".join(texts)
    return "Error: " + json.dumps(error, ensure_ascii=False)


def replayed_search_text(item: Mapping[str, Any]) -> str:
    """A stored ``web_search_call`` (its JSON) as the model reads it again: its sources' URLs
    when present, else whether it failed."""
    action = item.get("action")
    sources = action.get("sources") if isinstance(action, Mapping) else None
    urls = [s["url"] for s in sources or () if isinstance(s, Mapping) and "url" in s]
    if urls:
        return "\n\n".join(f"[{n}] {url}" for n, url in enumerate(urls, 1))
    if item.get("status") == "failed":
        return "The search failed."
    return "Searched."
