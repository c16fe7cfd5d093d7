"""A rendered prompt a transport keeps, so a continuation tokenizes only what is new.

Invariants:
- ``RenderedPrompt`` is a rendered chat-template text with exactly the token ids a full render
  gives it, and the places where the tokenizer splits it at added tokens (``<|im_end|>`` ...).
  Any such value is a sound hint for any later text: only
  the part both texts share up to a common split is reused (``model/incremental_render.py``).
- ``splits`` are the added-token matches of ``text`` as the tokenizer splits it, in order:
  ``(start, end, count)`` with ``count`` the number of ids up to and including that token.
- A response renders with its request's ``previous_render`` as the hint and, when asked
  (``keep_render``), keeps its own render on its log (``EventLog.rendered``, written before
  the response exists), where the transport reads it after the log closed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RenderedPrompt"]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    ids: tuple[int, ...]
    splits: tuple[tuple[int, int, int], ...]  # (start, end, ids up to and including it)
