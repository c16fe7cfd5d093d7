"""How many prompt tokens the prompt cache served a request, for a transport that reports it
before the response ends (the Anthropic stream's ``message_start``; issue 12).

Invariants:
- The HTTP edge makes one ``CacheReport`` per request and puts it on the ``CreateRequest``;
  admission attaches the first sequence admitted for it (``actors/admission.py``); later ones
  (a tool search's continuation) do not replace it.
- ``cached_tokens`` is the count the generation thread set on that sequence when it consulted
  the cache, which happens before the sequence's first output: so it is final once any output
  of the response was seen, and 0 before the sequence is admitted. All on the Trio thread but
  the thread's one write of an ``int``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["CacheReport"]


class CacheReport:
    """The prompt-cache reuse of a request's first sequence (0 until one is attached)."""

    __slots__ = ("_read",)

    def __init__(self) -> None:
        self._read: Callable[[], int] | None = None

    def attach(self, read: Callable[[], int]) -> None:
        """Sender: admission, once per admitted sequence; only the first is kept."""
        if self._read is None:
            self._read = read

    @property
    def attached(self) -> bool:
        return self._read is not None

    @property
    def cached_tokens(self) -> int:
        return self._read() if self._read is not None else 0
