"""``NaN`` / ``Infinity`` in a request body: refused, naming the key that holds one.

Invariants:
- ``Constants.record`` is the ``parse_constant`` hook: it stands a marker in for the value, so
  decoding finishes and the marker's JSON path can be found (``tools[0].parameters.x[1]``).
- ``Constants.refuse_any(decoded)`` raises a 400 naming the first such path; a body without one
  passes untouched.
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import invalid_request


class _Constant:
    def __init__(self, name: str) -> None:
        self.name = name


def _path_of(value: object, path: str = "") -> tuple[str, str] | None:
    """(JSON path, constant name) of the first marker in a decoded value."""
    if isinstance(value, _Constant):
        return path, value.name
    if isinstance(value, dict):
        items: Any = ((f"{path}.{k}" if path else k, v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub_path, sub in items:
        found = _path_of(sub, sub_path)
        if found is not None:
            return found
    return None


class Constants:
    """One body's ``NaN`` / ``Infinity`` constants, seen while decoding it."""

    def __init__(self) -> None:
        self._seen: list[_Constant] = []

    def record(self, name: str) -> Any:
        self._seen.append(_Constant(name))
        return self._seen[-1]

    def refuse_any(self, decoded: object) -> None:
        if not self._seen:
            return
        found = _path_of(decoded)
        path, name = found if found is not None else ("", self._seen[0].name)
        raise invalid_request(
            f"Invalid value for '{path or 'body'}': {name} is not valid JSON (use a finite "
            "number or null).",
            path or None,
        )
