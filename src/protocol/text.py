"""Text validated once, at the edge: every string of a JSON body must be encodable as UTF-8.

JSON's ``\\uXXXX`` escapes can spell a lone UTF-16 surrogate (``"\\ud800"``). Python's
``json`` module accepts it and yields a ``str`` that cannot be encoded as UTF-8, so anything
later that writes the string out (the store, an SSE event, an error message echoing it) fails.
The HTTP edge refuses such a body instead, before anything is created.

Invariants:
- Pure: :func:`find_unencodable` walks a decoded JSON value (keys included) without recursion,
  so its depth is bounded only by what the decoder produced.
- The path it reports uses the request's own spelling, ``input[0].content[1].text``; a bad key
  is reported at the object that holds it.
- The messages it builds never contain the offending string itself, so they always encode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["Unencodable", "find_unencodable", "json_path"]

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Unencodable:
    """Where a body holds a string that is not valid Unicode text."""

    path: str  # "" for the body itself
    index: int  # the character offset of the first lone surrogate
    in_key: bool  # the string is a key of the object at ``path``
    code_point: int

    def message(self) -> str:
        where = (
            f"a key of '{self.path}'"
            if self.in_key and self.path
            else ("a key of the request body" if self.in_key else f"'{self.path}'")
        )
        return (
            f"Invalid {where}: the string is not valid Unicode text; it contains a lone "
            f"UTF-16 surrogate (\\u{self.code_point:04x}) at character {self.index}. "
            "Strings must be encodable as UTF-8."
        )


def json_path(parts: tuple[str | int, ...]) -> str:
    """``("input", 0, "content")`` -> ``input[0].content``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _surrogate_at(text: str) -> int | None:
    if text.isascii():
        return None
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def find_unencodable(value: object) -> Unencodable | None:
    """A string (a key or a value) that UTF-8 cannot encode, or ``None``."""
    stack: list[tuple[tuple[str | int, ...], object]] = [((), value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            at = _surrogate_at(node)
            if at is not None:
                return Unencodable(json_path(path), at, False, ord(node[at]))
        elif isinstance(node, dict):
            children: list[tuple[tuple[str | int, ...], object]] = []
            for key, child in node.items():
                key = str(key)
                at = _surrogate_at(key)
                if at is not None:
                    return Unencodable(json_path(path), at, True, ord(key[at]))
                children.append(((*path, key), child))
            stack.extend(reversed(children))
        elif isinstance(node, list):
            stack.extend(((*path, i), child) for i, child in reversed(list(enumerate(node))))
    return None
