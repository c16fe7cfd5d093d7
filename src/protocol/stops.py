"""Stop sequences: the first completed stop sequence in text that arrives in chunks (pure).

Invariants:
- Whatever the chunking, the text returned by ``feed`` (and ``flush`` when the text ended
  without a match) concatenates to the input text up to the first stop sequence (the one
  that completes first; the longest at the same end), never beyond it.
- Text that could begin a stop sequence is held back until it is known not to.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Finds the first completed stop sequence in text that arrives in chunks."""

    __slots__ = ("_held", "_sequences")

    def __init__(self, sequences: Sequence[str]) -> None:
        self._sequences = tuple(s for s in sequences if s)
        self._held = ""

    def feed(self, chunk: str) -> tuple[str, str | None]:
        """(text safe to send now, the stop sequence completed or None)."""
        text = self._held + chunk
        found: tuple[int, int, str] | None = None
        for sequence in self._sequences:
            start = text.find(sequence)
            if start >= 0:
                candidate = (start + len(sequence), -len(sequence), sequence)
                found = candidate if found is None else min(found, candidate)
        if found is not None:
            end, negative_length, sequence = found
            self._held = ""
            return text[: end + negative_length], sequence
        keep = self._longest_open_prefix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """The held-back text, when the text it might have continued has ended."""
        held, self._held = self._held, ""
        return held

    def _longest_open_prefix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a sequence."""
        longest = max((len(s) for s in self._sequences), default=1) - 1
        for size in range(min(longest, len(text)), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) and len(s) > size for s in self._sequences):
                return size
        return 0
