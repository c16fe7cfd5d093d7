"""The per-sequence outbox between the generation thread and one Trio task.

Invariants:
- Exactly one producer (the generation thread) and one consumer (the Trio task that owns the
  response). The producer never blocks on the consumer: it appends under a lock held for a few
  microseconds and, only when the slot goes from empty to non-empty, schedules a wake-up on the
  Trio loop with ``TrioToken.run_sync_soon`` (which does not wait).
- Deltas coalesce: however slow the consumer, it receives everything produced since its last
  ``receive`` as one ``SequenceOutput`` (text joined, token counts summed). Nothing is dropped;
  the buffer is bounded by the sequence's own ``max_tokens``.
- The producer wakes the consumer only when it waits: a push while the consumer is busy, or
  lingers (``receive(linger=...)``: it lets output pile up under load), costs no
  wake-up, except a finish, which always ends a linger at once.
- A linger ends on a tick of the Trio clock shared by every slot (``tick_after``), not a
  linger's length after it began: consumers lingering with the same interval wake together, in
  one pass of the event loop, so N streams cost one wake-up of the loop (and of a client that
  reads them all) per tick instead of N spread over it.
- The cache report (``report_cache``) is written and read under the same lock as the output.
- A finish is sticky: after the producer reports one, the slot accepts nothing more, and the
  consumer receives it exactly once, after all text produced before it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import trio

FinishReason = Literal["stop", "length", "cancelled", "shutdown", "error"]


@dataclass(frozen=True, slots=True)
class SequenceOutput:
    """What a consumer takes from the slot in one ``receive``."""

    text: str
    new_tokens: int
    prefill_done: bool
    finish: FinishReason | None
    error: str | None = None
    # One entry per generated token when logprobs were asked for (the SDK's Logprob shape).
    logprobs: tuple[dict[str, Any], ...] = ()
    # The stop sequence (of the request's ``stop_texts``) that ended the sequence, if one did.
    stop_sequence: str | None = None


def tick_after(now: float, interval: float) -> float:
    """The first multiple of ``interval`` (> 0) after ``now``: where a linger begun at ``now``
    ends. Lingers of one interval end on the same ticks, whenever they began."""
    tick = (math.floor(now / interval) + 1) * interval
    return tick if tick > now else tick + interval  # floating-point rounding at a tick


class SequenceSlot:
    """Coalescing, thread-safe outbox for one sequence (producer: generation thread)."""

    def __init__(self, trio_token: trio.lowlevel.TrioToken) -> None:
        self._token = trio_token
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._tokens = 0
        self._logprobs: list[dict[str, Any]] = []
        self._prefill_done = False
        self._prefill_reported = False
        self._finish: FinishReason | None = None
        self._error: str | None = None
        self._stop_sequence: str | None = None
        self._finish_delivered = False
        self._wake_scheduled = False
        # What the consumer waits for (under the lock): "any" output, only a "finish" (while it
        # lingers), or nothing (None: it is busy, or about to take what is there).
        self._waiting: Literal["any", "finish"] | None = None
        # Prompt tokens served from the prompt cache (``report_cache``, before the first push).
        self._cached_tokens = 0
        # Touched only on the Trio thread (by ``receive`` and ``_wake``).
        self._event = trio.Event()

    # -- producer side (generation thread) --------------------------------------------------

    def push(
        self,
        text: str = "",
        new_tokens: int = 0,
        *,
        prefill_done: bool = False,
        finish: FinishReason | None = None,
        error: str | None = None,
        logprobs: Sequence[dict[str, Any]] = (),
        stop_sequence: str | None = None,
    ) -> None:
        with self._lock:
            if self._finish is not None:
                return
            if text:
                self._text.append(text)
            self._logprobs.extend(logprobs)
            self._tokens += new_tokens
            self._stop_sequence = self._stop_sequence or stop_sequence
            self._prefill_done = self._prefill_done or prefill_done
            if finish is not None:
                self._finish = finish
                self._error = error
            if self._wake_scheduled or self._waiting is None:
                return
            if self._waiting == "finish" and finish is None:
                return
            self._wake_scheduled = True
        try:
            self._token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass  # nobody is left to wake

    def report_cache(self, tokens: int) -> None:
        """The prompt tokens the prompt cache served (wakes nobody: it is not output)."""
        with self._lock:
            self._cached_tokens = tokens

    @property
    def finished(self) -> bool:
        with self._lock:
            return self._finish is not None

    @property
    def cached_tokens(self) -> int:
        with self._lock:
            return self._cached_tokens

    # -- consumer side (Trio thread) --------------------------------------------------------

    def _wake(self) -> None:
        self._event.set()

    def _take(self) -> SequenceOutput | None:
        with self._lock:
            self._wake_scheduled = False
            new_prefill = self._prefill_done and not self._prefill_reported
            finish = None if self._finish_delivered else self._finish
            if not self._text and not self._tokens and not new_prefill and finish is None:
                return None
            out = SequenceOutput(
                text="".join(self._text),
                new_tokens=self._tokens,
                prefill_done=self._prefill_done,
                finish=finish,
                error=self._error if finish is not None else None,
                logprobs=tuple(self._logprobs),
                stop_sequence=self._stop_sequence if finish is not None else None,
            )
            self._text.clear()
            self._logprobs.clear()
            self._tokens = 0
            self._prefill_reported = self._prefill_done
            self._finish_delivered = finish is not None or self._finish_delivered
            return out

    async def receive(self, linger: float = 0.0) -> SequenceOutput:
        """Wait for output; raises ``trio.EndOfChannel`` once the finish was delivered.

        With ``linger`` > 0, first let output pile up until the clock's next ``linger`` tick
        (at most that many seconds; sooner if the sequence finishes), so that one receive
        carries several steps' tokens."""
        if linger > 0:
            await self._wait_for("finish", tick_after(trio.current_time(), linger))
        while True:
            out = self._take()
            if out is not None:
                return out
            if self._finish_delivered:
                raise trio.EndOfChannel
            await self._wait_for("any", math.inf)

    async def _wait_for(self, what: Literal["any", "finish"], deadline: float) -> None:
        """Sleep until the producer pushes ``what`` (at once if it already has) or the Trio
        clock reaches ``deadline``. A wake-up may be spurious; callers re-check."""
        with self._lock:
            if self._finish is not None or (what == "any" and self._has_output()):
                return
            self._event = trio.Event()
            self._waiting = what
        try:
            if deadline == math.inf:
                await self._event.wait()
            else:
                with trio.move_on_at(deadline):
                    await self._event.wait()
        finally:
            with self._lock:
                self._waiting = None

    def _has_output(self) -> bool:
        return bool(self._text or self._tokens) or (
            self._prefill_done and not self._prefill_reported
        )
