"""``url_citation`` annotations for an answer that used a web search's results.

The model sees the results numbered ``[1] ... [n]`` (``hosted_text.search_result_text``); its
answer cites them with those markers or by writing a source's URL. Each becomes an annotation
``{"type": "url_citation", "url", "title", "start_index", "end_index"}`` on the text.

Invariants:
- ``text[start_index:end_index]`` is exactly the marker ``[n]`` (its source is the n-th, 1-based)
  or the source's URL; indices count characters (Python ``str`` indices), end exclusive.
- The annotations are in text order and never overlap: where two candidates overlap, the one
  starting first wins, and at the same start the longer one.
- A marker out of range, a source without a URL, or a URL that runs on into a longer one
  (``https://a.com`` inside ``https://a.com/page``) cites nothing.
- Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from ..objects import JsonObject

__all__ = ["url_citations"]

_MARKER: Final = re.compile(r"\[([1-9][0-9]{0,5})\]")
_URL_CHARS: Final = frozenset("/-_~%?#=&+:@!$*'();")
"""Characters that continue a URL right after a source's URL (it was a longer one)."""


def url_citations(text: str, sources: Sequence[tuple[str, str]]) -> list[JsonObject]:
    """The citations in ``text`` of ``sources`` (``(url, title)``, numbered from 1)."""
    found: list[tuple[int, int, str, str]] = []
    for match in _MARKER.finditer(text):
        number = int(match.group(1))
        if number <= len(sources) and sources[number - 1][0]:
            url, title = sources[number - 1]
            found.append((match.start(), match.end(), url, title))
    seen: set[str] = set()
    for url, title in sources:
        if not url or url in seen:
            continue
        seen.add(url)
        start = text.find(url)
        while start >= 0:
            end = start + len(url)
            if not _runs_on(text, end):
                found.append((start, end, url, title))
            start = text.find(url, start + 1)
    found.sort(key=lambda hit: (hit[0], -hit[1]))
    citations: list[JsonObject] = []
    reached = 0
    for start, end, url, title in found:
        if start < reached:
            continue
        reached = end
        citations.append(
            {
                "type": "url_citation",
                "url": url,
                "title": title,
                "start_index": start,
                "end_index": end,
            }
        )
    return citations


def _runs_on(text: str, end: int) -> bool:
    """Whether the URL ending at ``end`` continues (a sentence's final ``.`` or ``,`` does not)."""
    if end >= len(text):
        return False
    after = text[end]
    if after.isalnum() or after in _URL_CHARS:
        return True
    if after in ".,":
        return end + 1 < len(text) and (text[end + 1].isalnum() or text[end + 1] in _URL_CHARS)
    return False
