"""Compact replay tapes (``replay.py``) of hosted items: which added item was given whole,
a web search's arguments from its action, and a search's sources as far as a stream shows them.

Invariants:
- Pure. Every guess here is checked by ``compact_events``, which keeps a tape only when it
  rebuilds the stream exactly: a wrong guess costs compaction, never correctness.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

JsonObject = dict[str, Any]

_MARKER: Final = re.compile(r"\[([1-9][0-9]*)\]")


def is_whole(item: Mapping[str, Any]) -> bool:
    """An item the machine was given whole: one a model's call does not open in progress."""
    if item["type"] == "mcp_list_tools":
        return True
    return item["type"] == "mcp_call" and bool(item["arguments"] or item["approval_request_id"])


def known_sources(
    done: Mapping[int, JsonObject], cited: Mapping[int, list[tuple[int, JsonObject]]]
) -> JsonObject:
    """Each good search's sources as far as the stream shows them (``replay.py``'s ``src``);
    ``done``: the items as the stream's ``output_item.done`` showed them, by output_index."""
    src: JsonObject = {}
    searches = {index for index, item in done.items() if item["type"] == "web_search_call"}
    for index in searches | set(cited) - {-1}:
        citations = cited.get(index, [])
        titles = {str(c["url"]): str(c["title"]) for _, c in reversed(citations)}
        stored = done[index]["action"].get("sources")
        if stored is not None:
            found = [[str(s["url"]), titles.get(str(s["url"]), "")] for s in stored]
        else:
            found = _placed(done, citations)
        if found:
            src[str(index)] = found
    return src


def _placed(
    done: Mapping[int, JsonObject], citations: list[tuple[int, JsonObject]]
) -> list[list[str]]:
    places: dict[int, list[str]] = {}
    loose: list[list[str]] = []
    for message, citation in citations:
        text = str(done[message]["content"][0]["text"])
        span = text[int(citation["start_index"]) : int(citation["end_index"])]
        pair = [str(citation["url"]), str(citation["title"])]
        marker = _MARKER.fullmatch(span)
        if marker is not None and span != pair[0]:
            places.setdefault(int(marker.group(1)) - 1, pair)
        else:
            loose.append(pair)
    found = [places.get(at, ["", ""]) for at in range(max(places, default=-1) + 1)]
    for pair in loose:
        if pair[0] not in {url for url, _ in found}:
            found.append(pair)
    return found


def search_arguments(action: Mapping[str, Any]) -> str:
    """Arguments that give a web search its ``action`` again (``hosted_items``' parse)."""
    keys = {"search": ("query",), "open_page": ("url",), "find_in_page": ("url", "pattern")}
    given = {key: action[key] for key in keys[str(action["type"])] if action.get(key)}
    return json.dumps(given) if given else ""
