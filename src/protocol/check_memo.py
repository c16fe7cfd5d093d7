"""A bounded memo of pure checks on JSON values: a tool definition that an agent
resends every turn has its JSON Schema checked once, not once a turn (pure).

Invariants:
- Exact: the key (``json_key``) is a type-faithful image of the value: dict key order, list
  against tuple, ``bool`` / ``int`` / ``float`` (by ``repr``, so ``-0.0`` is not ``0.0``),
  ``str``, ``None``, and the container's own type are all kept. Two values share a key only
  when they are the same JSON value made of the same Python types, so a memoized check (a pure
  function of its argument) returns what the check itself would.
- A value with anything else in it (or more than ``MAX_NODES`` nodes) has no key and is
  checked every time.
- Bounded: at most ``max_entries`` keys, the least recently used out first. Safe to call from
  several threads (one lock around the table; the check itself runs outside it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_NODES", "CheckMemo", "json_key"]

MAX_NODES = 4096

R = TypeVar("R")


class _TooBig(Exception):
    pass


def json_key(value: Any, max_nodes: int = MAX_NODES) -> Hashable | None:
    """The type-faithful hashable image of a JSON-like ``value``, or None (see the module)."""
    budget = [max_nodes]

    def key(v: Any) -> Hashable:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooBig
        kind = type(v)
        if kind is str or kind is int or kind is bool or v is None:
            return (kind, v)
        if kind is float:
            return (kind, repr(v))
        if isinstance(v, dict):
            return (kind, tuple((key(k), key(item)) for k, item in v.items()))
        if isinstance(v, list | tuple):
            return (kind, tuple(key(item) for item in v))
        raise _TooBig  # not JSON-like: no key

    try:
        return key(value)
    except (_TooBig, RecursionError):
        return None


class CheckMemo(Generic[R]):
    """``check(value)``, remembered per ``json_key(value)`` (LRU, ``max_entries``)."""

    def __init__(self, check: Callable[[Any], R], max_entries: int = 256) -> None:
        self._check = check
        self._max_entries = max_entries
        self._table: OrderedDict[Hashable, R] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, value: Any) -> R:
        key = json_key(value)
        if key is None:
            return self._check(value)
        with self._lock:
            if key in self._table:
                self._table.move_to_end(key)
                self.hits += 1
                return self._table[key]
        result = self._check(value)
        with self._lock:
            self.misses += 1
            self._table[key] = result
            self._table.move_to_end(key)
            while len(self._table) > self._max_entries:
                self._table.popitem(last=False)
        return result
