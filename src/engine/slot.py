"""The per-sequence outbox between the generation thread and one Trio task.

Invariants:
- Exactly one producer (the generation thread) and one consumer (the Trio task that owns the
  response). The producer never blocks on the consumer: it appends under a lock held for a few
  microseconds and, only when the slot goes from empty to non-empty, schedules a wake-up on the
  Trio loop with ``TrioToken.run_sync_soon`` (which does not wait).
- Deltas coalesce: however slow the consumer, it receives everything produced since its last
  ``receive`` as one ``SequenceOutput`` (text joined, token counts summed). Nothing is dropped;
  the buffer is bounded by the sequence's own ``max_tokens``.
- The producer wakes the consumer only when it waits: a push while the consumer is busy costs
  no wake-up. A consumer that lingers (``receive(linger=...)``: it lets output pile up under
  load) is woken by a push on or after its linger's end, or by the last push before it (one
  whose next, a step's time away as the time since the previous push tells, would come after
  it), or by a finish at once; the producer reads the clock (``time.perf_counter``) for it.
  No Trio timer runs for a linger (a timer's expiry is a cancellation: a cancel scope entered,
  expired and unwound per delta). So output never waits past a linger's end for a step that
  was expected to end before it; before work that may take longer than a decode step (a step
  that prefills, an admission) the producer ``flush``es, which ends a linger that has output
  at once.
- A linger ends on a tick of the clock shared by every slot (``tick_after``), not a linger's
  length after it began: consumers lingering with the same interval wake on the same step, in
  one pass of the event loop, so N streams cost one wake-up of the loop (and of a client that
  reads them all) per tick instead of N spread over it.
- A linger begun less than half an interval before the tick the consumer's previous linger
  was to end on ends on the tick after it. A consumer woken by the last push before its tick
  begins its next linger before that tick; ending that one on the same tick would wake it at
  the next push with one step's token alone (measured: a fifth to a third of a lone stream's
  deltas were such). So a delta waits at most one and a half intervals. A ``flush`` forgets
  the tick: the output after it waits for that tick, not the one after.
- The cache report (``report_cache``) is written and read under the same lock as the output.
- A finish is sticky: after the producer reports one, the slot accepts nothing more, and the
  consumer receives it exactly once, after all text produced before it.
- Token ids or text: a slot given a streaming detokenizer (``detokenize_with``, before the
  first push) takes token ids from the producer, and the consumer turns them into text when
  it takes them, on its own thread, outside the lock (a stop or length finish finalizes it).
  Detokenizing is not the model's work: on the generation thread it cost ~11 us a token (its
  caches cold after MLX's step), on the consumer's ~2 us a token in a run of them. From then
  on only the consumer touches the detokenizer. If it raises, the consumer receives an
  ``error`` finish and nothing more, while the sequence is still in the batch (``finished``
  stays False until the producer's finish, so the consumer's cancel still reaches it).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
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

    def __init__(
        self,
        trio_token: trio.lowlevel.TrioToken,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._token = trio_token
        self._clock = clock
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._ids: list[int] = []  # token ids the consumer detokenizes
        self._tokens = 0
        self._logprobs: list[dict[str, Any]] = []
        self._prefill_done = False
        self._prefill_reported = False
        self._finish: FinishReason | None = None
        self._error: str | None = None
        self._stop_sequence: str | None = None
        self._finish_delivered = False
        self._wake_scheduled = False
        # Whether the consumer waits (under the lock; False: it is busy, or about to take what
        # is there), and until when on ``clock`` it lingers: output before then wakes nobody.
        self._waiting = False
        self._until = -math.inf
        # The tick the consumer's last linger was to end on (the next one ends after it).
        self._tick = -math.inf
        # Whether a prefill's end alone is output the consumer wants (``receive(prefill=...)``).
        self._prefill_wakes = True
        # When the producer last pushed (on ``clock``): the time since is its step's length.
        self._pushed_at = clock()
        # Prompt tokens served from the prompt cache (``report_cache``, before the first push).
        self._cached_tokens = 0
        # Touched only on the Trio thread (by ``receive`` and ``_wake``).
        self._event = trio.Event()
        # The consumer's streaming detokenizer (``detokenize_with``); None: the producer
        # pushes text.
        self._detokenizer: Any = None

    # -- producer side (generation thread) --------------------------------------------------

    def detokenize_with(self, detokenizer: Any) -> None:
        """From now on the producer pushes token ids (``push(token=...)``) and the consumer
        detokenizes them with ``detokenizer`` (mlx-lm's streaming detokenizer, fresh), which
        the producer no longer touches. Called by the producer before its first push."""
        with self._lock:
            self._detokenizer = detokenizer

    def push(
        self,
        text: str = "",
        new_tokens: int = 0,
        *,
        token: int | None = None,
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
            if token is not None:
                self._ids.append(token)
            if logprobs:
                self._logprobs.extend(logprobs)
            self._tokens += new_tokens
            self._stop_sequence = self._stop_sequence or stop_sequence
            self._prefill_done = self._prefill_done or prefill_done
            if finish is not None:
                self._finish = finish
                self._error = error
            now = self._clock()
            step, self._pushed_at = now - self._pushed_at, now
            if self._wake_scheduled or not self._waiting:
                return
            if self._finish is None and not self._has_output():
                return  # nothing the consumer waits for (a prefill's end it did not ask for)
            if finish is None and now + step < self._until:
                return  # it lingers, and the next push is due before the tick
            self._until = -math.inf  # the linger is over: the consumer takes what is here
            self._wake_scheduled = True
        self._schedule_wake()

    def flush(self) -> None:
        """End a linger now if output waits in the slot: the producer is about to do work that
        may outlast a decode step, and the output should not wait for its end."""
        with self._lock:
            self._until = self._tick = -math.inf
            if self._wake_scheduled or not self._waiting or not self._has_output():
                return
            self._wake_scheduled = True
        self._schedule_wake()

    def _schedule_wake(self) -> None:
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

    def _take(self) -> tuple[SequenceOutput, list[int]]:
        """Everything in the slot, as one output and the token ids still to detokenize (under
        the lock; there is something)."""
        finish = None if self._finish_delivered else self._finish
        out = SequenceOutput(
            text="".join(self._text),
            new_tokens=self._tokens,
            prefill_done=self._prefill_done,
            finish=finish,
            error=self._error if finish is not None else None,
            logprobs=tuple(self._logprobs),
            stop_sequence=self._stop_sequence if finish is not None else None,
        )
        ids, self._ids = self._ids, []
        self._text.clear()
        self._logprobs.clear()
        self._tokens = 0
        self._prefill_reported = self._prefill_done
        self._finish_delivered = finish is not None or self._finish_delivered
        return out, ids

    def _detokenized(self, out: SequenceOutput, ids: list[int]) -> SequenceOutput:
        """``out`` with the text of ``ids`` (on the consumer's thread, outside the lock)."""
        detokenizer = self._detokenizer
        if detokenizer is None:
            return out
        try:
            for token in ids:
                detokenizer.add_token(token)
            if out.finish in ("stop", "length"):
                detokenizer.finalize()
            text = detokenizer.last_segment
        except Exception as exc:
            with self._lock:  # nothing more is delivered; the producer's finish is still due
                self._finish_delivered = True
            return dataclasses.replace(
                out, text="", finish="error", error=repr(exc), stop_sequence=None
            )
        return dataclasses.replace(out, text=out.text + text) if text else out

    def _ready(self) -> bool:
        """Whether a receive takes the output now (under the lock): an undelivered finish, or
        output once the linger ended."""
        if self._finish is not None and not self._finish_delivered:
            return True
        if not self._has_output():
            return False
        return self._until == -math.inf or self._clock() >= self._until

    async def receive(self, linger: float = 0.0, *, prefill: bool = True) -> SequenceOutput:
        """Wait for output; raises ``trio.EndOfChannel`` once the finish was delivered.

        With ``linger`` > 0, output waits in the slot until the clock's next ``linger`` tick
        (the push nearest it, see the module's header; a finish or a ``flush`` at once), so
        that one receive carries several steps' tokens. With ``prefill`` False the end of
        the prompt's prefill alone is not output: it comes with the first token (one step
        later), and the consumer is not woken between the two."""
        with self._lock:
            if linger > 0:
                now = self._clock()
                # Begun just before the tick the last linger was to end on (woken by the
                # push before it): the next tick, or this receive would take one step alone.
                start = self._tick if now < self._tick < now + linger / 2 else now
                self._until = self._tick = tick_after(start, linger)
            else:
                self._until = -math.inf
            self._prefill_wakes = prefill
        while True:
            with self._lock:
                if self._finish_delivered:
                    raise trio.EndOfChannel
                if self._ready():
                    out, ids = self._take()
                    break
                # A wake-up still pending sets this new event: at worst a spurious wake-up.
                self._event = trio.Event()
                self._waiting = True
                self._wake_scheduled = False
            try:
                await self._event.wait()
            finally:
                with self._lock:
                    self._waiting = False
        return self._detokenized(out, ids)

    def _has_output(self) -> bool:
        return bool(self._text or self._tokens or self._ids) or (
            self._prefill_wakes and self._prefill_done and not self._prefill_reported
        )
