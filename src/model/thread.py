"""The generation thread: the only place MLX runs.

Invariants:
- Every MLX call (load included) happens on this one ``threading.Thread``; MLX streams and
  unevaluated arrays are bound to the thread that made them (platform notes). At its end the
  thread calls ``mx.synchronize(); mx.clear_streams()`` so the process exits cleanly.
- The loop alternates intake and one ``BatchGenerator.next()`` (at most one prefill chunk and
  one decode step). Commands are drained before every step, so a new sequence joins the running
  batch at the next step and a removed one leaves it before the next step: cancel latency is
  one step, or one prefill chunk while prefilling.
- Output goes to each sequence's ``SequenceSlot``, which never blocks this thread.
- Every inserted sequence receives exactly one finish on its slot: stop, length, cancelled,
  shutdown or error.
- ``statistics`` is an immutable snapshot replaced after each step; readers on any thread see
  a consistent value without a lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .loader import LoadedModel, load_model
from .slot import FinishReason, SequenceSlot

log = logging.getLogger(__name__)


# -- commands (sent by the model actor's handle, any thread) -----------------------------------


@dataclass(frozen=True, slots=True)
class InsertSequence:
    """Sender: ModelHandle.submit. Add a tokenized prompt to the batch."""

    seq_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    slot: SequenceSlot


@dataclass(frozen=True, slots=True)
class RemoveSequence:
    """Sender: ModelHandle.cancel. Drop a sequence wherever it is (queued, prefill, decode)."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class StopGeneration:
    """Sender: the model actor at shutdown. Finish every sequence with ``shutdown`` and exit."""


Command = InsertSequence | RemoveSequence | StopGeneration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A snapshot of the batch. ``active`` counts every admitted, unfinished sequence."""

    active: int = 0
    queued: int = 0
    prefilling: int = 0
    decoding: int = 0
    active_ids: frozenset[int] = field(default_factory=frozenset)
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    sequences_finished: int = 0
    sequences_cancelled: int = 0
    steps: int = 0
    peak_decoding: int = 0


@dataclass(slots=True)
class _Live:
    seq_id: int
    uid: int
    slot: SequenceSlot
    detokenizer: Any
    max_tokens: int
    prefill_done: bool = False


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    model_path: str
    prefill_step_size: int = 512
    completion_batch_size: int = 32
    prefill_batch_size: int = 8


class GenerationThread:
    """Owns the model and the ``BatchGenerator``; driven only through ``send``."""

    def __init__(
        self,
        settings: ThreadSettings,
        *,
        on_loaded: Callable[[LoadedModel | None, BaseException | None], None],
        on_exit: Callable[[BaseException | None], None],
    ) -> None:
        self._settings = settings
        self._on_loaded = on_loaded
        self._on_exit = on_exit
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="mlx-generation", daemon=True)
        self.statistics = ModelStatistics()
        self._samplers: dict[tuple[float, float], Any] = {}

    def start(self) -> None:
        self._thread.start()

    def send(self, command: Command) -> None:
        """Thread-safe and non-blocking."""
        self._inbox.put(command)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        import mlx.core as mx

        error: BaseException | None = None
        try:
            try:
                loaded = load_model(self._settings.model_path)
            except BaseException as exc:
                self._on_loaded(None, exc)
                return
            self._on_loaded(loaded, None)
            self._serve(loaded)
        except BaseException as exc:
            log.exception("generation thread crashed")
            error = exc
        finally:
            mx.synchronize()
            mx.clear_streams()
            self._on_exit(error)

    def _serve(self, loaded: LoadedModel) -> None:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator, make_stop_sequences

        stream = mx.new_stream(mx.default_device())
        generator = BatchGenerator(
            loaded.model,
            completion_batch_size=self._settings.completion_batch_size,
            prefill_batch_size=self._settings.prefill_batch_size,
            prefill_step_size=self._settings.prefill_step_size,
            stream=stream,
        )
        stop_sequences = make_stop_sequences(loaded.tokenizer)
        live: dict[int, _Live] = {}
        by_uid: dict[int, _Live] = {}
        counters = {"finished": 0, "cancelled": 0}
        crashed: BaseException | None = None
        try:
            while True:
                stop = self._intake(loaded, generator, stop_sequences, live, by_uid, counters)
                if stop:
                    return
                self._publish(generator, live, counters)
                if live:
                    self._step(generator, live, by_uid, counters)
                    self._publish(generator, live, counters)
        except BaseException as exc:
            crashed = exc
            raise
        finally:
            reason: FinishReason = "error" if crashed is not None else "shutdown"
            for entry in live.values():
                entry.slot.push(finish=reason, error=repr(crashed) if crashed else None)
            live.clear()
            by_uid.clear()
            generator.close()
            self._publish(generator, live, counters)

    def _intake(
        self,
        loaded: LoadedModel,
        generator: Any,
        stop_sequences: Any,
        live: dict[int, _Live],
        by_uid: dict[int, _Live],
        counters: dict[str, int],
    ) -> bool:
        """Apply every pending command; block for one when idle. True means stop."""
        from mlx_lm.sample_utils import make_sampler

        samplers = self._samplers
        block = not live
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return False
            block = False
            match command:
                case InsertSequence(seq_id, prompt, max_tokens, temperature, top_p, slot):
                    # One sampler object per setting: mlx-lm samples a whole batch in one call
                    # only when its rows share the same sampler.
                    key = (temperature, top_p)
                    sampler = samplers.get(key)
                    if sampler is None:
                        sampler = make_sampler(temp=temperature, top_p=top_p if top_p < 1 else 0)
                        samplers[key] = sampler
                    (uid,) = generator.insert(
                        [list(prompt)],
                        max_tokens=[max_tokens],
                        samplers=[sampler],
                        stop_sequences=[stop_sequences],
                    )
                    # A fresh streaming detokenizer per sequence (the property copies one).
                    entry = _Live(seq_id, uid, slot, loaded.tokenizer.detokenizer, max_tokens)
                    live[seq_id] = entry
                    by_uid[uid] = entry
                case RemoveSequence(seq_id):
                    removed = live.pop(seq_id, None)
                    if removed is not None:
                        generator.remove([removed.uid])
                        del by_uid[removed.uid]
                        counters["cancelled"] += 1
                        removed.slot.push(finish="cancelled")
                case StopGeneration():
                    return True

    def _step(
        self,
        generator: Any,
        live: dict[int, _Live],
        by_uid: dict[int, _Live],
        counters: dict[str, int],
    ) -> None:
        prompt_responses, generation_responses = generator.next()
        for progress in prompt_responses:
            entry = by_uid.get(progress.uid)
            if entry is not None and progress.end_of_prompt and not entry.prefill_done:
                entry.prefill_done = True
                entry.slot.push(prefill_done=True)
        for response in generation_responses:
            entry = by_uid.get(response.uid)
            if entry is None:
                continue
            detokenizer = entry.detokenizer
            finish = response.finish_reason
            if not entry.prefill_done:
                entry.prefill_done = True
            if finish == "stop":
                # The token that completes a stop sequence is not part of the output.
                detokenizer.finalize()
                entry.slot.push(detokenizer.last_segment, 0, prefill_done=True, finish="stop")
            elif finish == "length":
                detokenizer.add_token(response.token)
                detokenizer.finalize()
                entry.slot.push(detokenizer.last_segment, 1, prefill_done=True, finish="length")
            else:
                detokenizer.add_token(response.token)
                entry.slot.push(detokenizer.last_segment, 1, prefill_done=True)
            if finish is not None:
                del live[entry.seq_id]
                del by_uid[entry.uid]
                counters["finished"] += 1

    def _publish(self, generator: Any, live: dict[int, _Live], counters: dict[str, int]) -> None:
        queued = len(generator._unprocessed_sequences)
        prefilling = len(generator._prompt_batch)
        decoding = len(generator._generation_batch)
        raw = generator._counters
        previous = self.statistics
        self.statistics = ModelStatistics(
            active=len(live),
            queued=queued,
            prefilling=prefilling,
            decoding=decoding,
            active_ids=frozenset(live),
            tokens_generated=int(raw.generation_tokens),
            prompt_tokens_processed=int(raw.prompt_tokens),
            sequences_finished=counters["finished"],
            sequences_cancelled=counters["cancelled"],
            steps=previous.steps + 1,
            peak_decoding=max(previous.peak_decoding, decoding),
        )
