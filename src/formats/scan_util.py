"""Small scanning helpers the family formats share (pure; no MLX, no Trio).

Invariant: ``take_until`` never consumes text that could still be the start of one of its stops,
so a scanner built on it decides each character from the text before it only and any chunking
of the same text gives the same result.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import find_first, partial_suffix


def take_until(
    buf: str, pos: int, stops: Sequence[str], final: bool
) -> tuple[str, int, str | None]:
    """Text from ``pos`` up to the earliest stop: ``(text, new_pos, stop)``.

    When a stop is found, ``new_pos`` is just past it. When none is, all of the rest is taken
    except a tail that could still grow into a stop (unless ``final``), and ``stop`` is None.
    """
    i, stop = find_first(buf, pos, stops)
    if i >= 0:
        return buf[pos:i], i + len(stop), stop
    end = len(buf) if final else len(buf) - partial_suffix(buf, pos, stops)
    return buf[pos:end], end, None


def unquote(text: str) -> str:
    """A name written bare, or in single or double quotes (``name="f"``)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text
