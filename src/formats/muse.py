"""Muse's addressed messages around its ATEM tool calls (Muse Glimmer's template, the notation
mlx-lm's ``muse_spark`` parser reads the calls of).

After the generation prompt's ``<|start|>assistant`` the model writes messages, each addressed:
`` to=self<|message|>...<|eom|>`` is reasoning, `` to=user<|message|>...<|eot|>`` the answer,
and `` to=NAME<|message|><atem:function_calls>...</atem:function_calls><|eot|>`` a call (the
ATEM block names the function again; that name is the one read). Another message follows after
``<|start|>assistant``.

The family parser reads these with its own machinery: the reasoning header and ``<|eom|>`` are
its think markers, the answer's header and the message framing are hidden markers, and a
`` to=`` header that is neither opens ``AddressedRegion``, which reads ``NAME<|message|>`` and
then the ATEM block (``xml_kv.KvRegion``). A header not followed by an ATEM block is shown as
text, as any marker that starts no call.
"""

from __future__ import annotations

from .base import NewIndex, ParsedEvent, Step, ToolSchemas, skip_ws
from .region import ToolRegion
from .scan_util import take_until
from .xml_kv import MUSE_SPARK, KvRegion

__all__ = ["ADDRESSED", "FRAMING", "MESSAGE", "THINK", "AddressedRegion"]

MESSAGE = "<|message|>"
ADDRESSED = " to="  # a header's start; the reasoning and answer headers are matched first
THINK = (" to=self" + MESSAGE, "<|eom|>")
FRAMING = ("<|start|>assistant", " to=user" + MESSAGE, "<|eot|>", "<|eom|>")

_HEADER_MAX = 300


class AddressedRegion(ToolRegion):
    """After `` to=``: the recipient up to ``<|message|>``, then an ATEM block of calls."""

    def __init__(self, marker: str, new_index: NewIndex, schemas: ToolSchemas | None) -> None:
        super().__init__(marker, new_index, schemas)
        self._header: list[str] = []
        self._opened = False  # the header is read: an ATEM block must follow
        self._inner: KvRegion | None = None

    def step(self, buf: str, final: bool) -> Step:
        if self._inner is not None:
            return self._inner.step(buf, final)
        out: list[ParsedEvent] = []
        pos = 0
        if not self._opened:
            text, pos, stop = take_until(buf, 0, (MESSAGE,), final)
            self._header.append(text)
            header = "".join(self._header)
            bad = any(c.isspace() or c == "<" for c in header) or len(header) > _HEADER_MAX
            if bad or (stop is None and final):
                return Step(pos, out, done=True, revert=self._marker + header)
            if stop is None:
                return Step(pos, out)
            if not header:
                return Step(pos, out, done=True, revert=self._marker + MESSAGE)
            self._opened = True
        start = skip_ws(buf, pos)
        opener = MUSE_SPARK.region_open
        shown = self._marker + "".join(self._header) + MESSAGE
        if buf.startswith(opener, start):
            self._inner = KvRegion(MUSE_SPARK, shown + buf[pos:start] + opener, *self._deps())
            inner = self._inner.step(buf[start + len(opener) :], final)
            used = start + len(opener) + inner.consumed
            return Step(used, out + inner.events, inner.done, inner.revert, inner.pushback)
        if not final and opener.startswith(buf[start:]):
            return Step(pos, out)  # the block's marker may still be coming
        return Step(pos, out, done=True, revert=shown)  # no call here: the header is text

    def _deps(self) -> tuple[NewIndex, ToolSchemas | None]:
        return self._new_index, self._schemas
