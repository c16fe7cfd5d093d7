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
- Every inserted sequence receives exactly one finish on its slot (stop, length, cancelled,
  shutdown or error), and the owner hears of it once through ``on_ended``: that is what
  releases its admission in the model actor.
- A fault stays with its sequence: whatever one sequence's setup, logits processors, sampler
  or detokenizer raises ends that sequence alone with ``error``; the batch and the thread go
  on. Only an error of the batch itself (the model's forward pass) ends the thread.
- Stop sequences (``stop_texts``) belong to the sequence: the first one completed ends it with
  ``stop`` (the matched text is not output), as the model's own end token does.
- ``on_statistics`` receives an immutable snapshot after each step.
- Segment checkpoints (issue 12): on a model whose cache cannot be trimmed
  (``prompt_cache.needs_checkpoints``), a sequence's prompt is inserted as segments cut at the
  boundaries that survive re-rendering (``segments.boundaries``), and the cache is stored at
  each cut as its prefill passes it. On other models a prompt is one segment, as before.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from ..protocol.stops import StopMatcher
from .blas_threads import StepThreads, open_blas, set_blas_threads
from .loader import LoadedModel, load_model
from .prefix_cache import PrefixCacheStats
from .prompt_cache import DEFAULT_MAX_ENTRIES, PromptCache, default_max_bytes, needs_checkpoints
from .sampling import make_seeded_sampler, make_shared_sampler
from .segments import ChatMarks, boundaries, chat_marks, render_without_generation_prompt, split
from .slot import FinishReason, SequenceSlot

log = logging.getLogger(__name__)


# -- commands (sent by the model actor, from the Trio thread) --------------------------------


@dataclass(frozen=True, slots=True)
class InsertSequence:
    """Sender: the model actor, for an admitted sequence. Add a tokenized prompt to the batch."""

    seq_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    slot: SequenceSlot
    # Logprobs of each generated token, with this many alternatives (None: not asked).
    top_logprobs: int | None = None
    # Builds this sequence's logits processors on the generation thread (constrained decoding).
    make_processors: Callable[[], list[Any]] | None = None
    seed: int | None = None
    stop_texts: tuple[str, ...] = ()
    # The tenant: the prompt cache serves a sequence only from its own tenant's prefixes.
    owner: str = ""
    # Its prompt_cache_key: the tenant's cache keeps each key's latest entry (PrefixCache).
    cache_key: str | None = None


@dataclass(frozen=True, slots=True)
class RemoveSequence:
    """Sender: the model actor (a cancel). Drop a sequence wherever it is (queued, prefill,
    decode)."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class StopGeneration:
    """Sender: the model actor at shutdown. Finish every sequence with ``shutdown`` and exit."""


Command = InsertSequence | RemoveSequence | StopGeneration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A snapshot of the batch. ``active`` counts the sequences the thread holds; ``admitted``
    (filled in by the model actor) the sequences admitted and not yet reported ended."""

    active: int = 0
    queued: int = 0
    prefilling: int = 0
    decoding: int = 0
    active_ids: frozenset[int] = field(default_factory=frozenset)
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    sequences_finished: int = 0
    sequences_cancelled: int = 0
    sequences_failed: int = 0
    steps: int = 0
    peak_decoding: int = 0
    admitted: int = 0
    prompt_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)


class _Fault:
    """The first exception one sequence's own code raised on this thread, if any."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None


def _guard(function: Callable[..., Any], fault: _Fault, fallback: Callable[..., Any]) -> Any:
    """``function`` for one sequence, recording its exception instead of raising it into the
    batch step (``fallback`` gives a harmless value; the sequence is removed after the step)."""

    def guarded(*args: Any) -> Any:
        if fault.error is None:
            try:
                return function(*args)
            except Exception as exc:
                fault.error = exc
        return fallback(*args)

    return guarded


# Issue 12: when the batch is idle and a sequence arrives while more requests are on their way
# to the model (a burst: the event loop prepares them one after another), the thread waits for
# them, so that the burst is prefilled together as the engine alone would, instead of its first
# sequence alone while the rest queue behind that prefill. It waits at most as long as that
# prefill would take (``gather_bound``), but at least GATHER_FLOOR_SECONDS: a prefill step has a
# fixed cost the per-token rate does not show (on the bundled model most of a 10-13 ms step),
# and a 16-request burst reaches the model over 15-20 ms; never more than GATHER_SECONDS. A
# lone request never waits: nothing else is on its way.
GATHER_SECONDS = 0.05
GATHER_FLOOR_SECONDS = 0.02
GATHER_POLL_SECONDS = 0.001


def gather_bound(prompt_seconds: float, prompt_tokens: int, tokens: int) -> float:
    """How long an idle batch may wait for a burst behind a first sequence that prefills
    ``tokens``: the time the batch took per prompt token so far (``prompt_seconds`` over
    ``prompt_tokens``) times ``tokens``, at least ``GATHER_FLOOR_SECONDS``, at most
    ``GATHER_SECONDS`` (also before any prefill)."""
    if prompt_tokens <= 0 or prompt_seconds <= 0:
        return GATHER_SECONDS
    estimate = prompt_seconds / prompt_tokens * max(tokens, 1)
    return min(GATHER_SECONDS, max(GATHER_FLOOR_SECONDS, estimate))


def _prefills(generator: Any) -> bool:
    """Whether the batch's next step prefills: prompts in progress or waiting for a place
    (mlx-lm's own books; were they renamed, every step would count as prefilling, which runs
    on OpenBLAS's own count: slower decoding, never a failed step)."""
    prompts = getattr(generator, "_prompt_batch", None)
    waiting = getattr(generator, "_unprocessed_sequences", None)
    if prompts is None or waiting is None:
        return True
    return len(prompts) > 0 or len(waiting) > 0


def _keep_logits(_context: Any, logits: Any) -> Any:
    return logits


def _greedy(logprobs: Any) -> Any:
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


@dataclass(slots=True)
class _Live:
    seq_id: int
    uid: int
    slot: SequenceSlot
    detokenizer: Any
    max_tokens: int
    fault: _Fault
    stops: StopMatcher | None = None
    top_logprobs: int | None = None
    prefill_done: bool = False
    owner: str = ""
    cache_parent: tuple[int, ...] | None = None  # the prompt-cache entry it was served from
    cache_key: str | None = None
    prompt_length: int = 0
    reused: int = 0  # prompt tokens the prompt cache served
    checkpoints: frozenset[int] = frozenset()  # prompt lengths to checkpoint at (segments)


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    model_path: str
    prefill_step_size: int = 512
    completion_batch_size: int = 32
    prefill_batch_size: int = 8
    # None: a fraction of the machine's memory (prompt_cache.default_max_bytes); 0 disables.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES
    # --blas-threads: OpenBLAS's thread count; None measures (blas_threads.set_blas_threads).
    blas_threads: int | None = None


@dataclass(slots=True)
class _Counters:
    finished: int = 0
    cancelled: int = 0
    failed: int = 0


class GenerationThread:
    """Owns the model and the ``BatchGenerator``; driven only through ``send``.

    The callbacks run on this thread and must not block: ``on_loaded`` once, ``on_ended(seq_id)``
    once per inserted sequence, ``on_statistics`` after every step, ``on_exit`` last;
    ``arriving()``, read when the idle batch gets a sequence, counts the requests still on their
    way to ``send`` (see ``gather_bound``).
    """

    def __init__(
        self,
        settings: ThreadSettings,
        *,
        on_loaded: Callable[[LoadedModel | None, BaseException | None], None],
        on_ended: Callable[[int], None],
        on_statistics: Callable[[ModelStatistics], None],
        on_exit: Callable[[BaseException | None], None],
        arriving: Callable[[], int] = lambda: 0,
    ) -> None:
        self._settings = settings
        self._arriving = arriving
        self._on_loaded = on_loaded
        self._on_ended = on_ended
        self._on_statistics = on_statistics
        self._on_exit = on_exit
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="mlx-generation", daemon=True)
        self._statistics = ModelStatistics()
        self._samplers: dict[tuple[float, float], Any] = {}
        self._tokenizer: Any = None
        self._live: dict[int, _Live] = {}
        self._by_uid: dict[int, _Live] = {}
        self._counters = _Counters()
        # OpenBLAS's count per step (decode or prefill), once the model is loaded.
        self._threads: StepThreads | None = None
        # The chat template's message marks, when the model's cache needs segment checkpoints.
        self._marks: ChatMarks | None = None
        cache_bytes = settings.prompt_cache_bytes
        self._prompt_cache = PromptCache(
            default_max_bytes() if cache_bytes is None else cache_bytes,
            settings.prompt_cache_entries,
        )

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
                # Before any sequence: the count is process-wide (blas_threads).
                blas = set_blas_threads(
                    loaded.model, self._settings.blas_threads, self._settings.model_path
                )
                loaded = replace(loaded, blas=blas)
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
        stop_tokens = make_stop_sequences(loaded.tokenizer)
        self._tokenizer = loaded.tokenizer
        blas = open_blas()
        if blas is not None and loaded.blas is not None:
            self._threads = StepThreads(
                blas.set_threads, loaded.blas, lambda: mx.synchronize(stream), blas.threads()
            )
        if self._prompt_cache.enabled and needs_checkpoints(loaded.model):
            self._marks = chat_marks(render_without_generation_prompt(loaded.tokenizer))
        crashed: BaseException | None = None
        try:
            while True:
                if self._intake(loaded, generator, stop_tokens):
                    return
                self._publish(generator)
                if self._live:
                    self._step(generator)
                    self._publish(generator)
        except BaseException as exc:
            crashed = exc
            raise
        finally:
            reason: FinishReason = "error" if crashed is not None else "shutdown"
            for entry in list(self._live.values()):
                self._end(entry, reason, repr(crashed) if crashed else None)
            self._prompt_cache.clear()  # its MLX arrays are freed on this thread
            generator.close()
            self._publish(generator)

    def _end(self, entry: _Live, reason: FinishReason, error: str | None = None) -> None:
        """Take ``entry`` out of the thread's books and tell its slot and the owner."""
        self._live.pop(entry.seq_id, None)
        self._by_uid.pop(entry.uid, None)
        match reason:
            case "cancelled":
                self._counters.cancelled += 1
            case "error":
                self._counters.failed += 1
            case "stop" | "length" | "shutdown":
                self._counters.finished += 1
            case _:
                assert_never(reason)
        entry.slot.push(finish=reason, error=error)
        self._on_ended(entry.seq_id)

    def _intake(self, loaded: LoadedModel, generator: Any, stop_tokens: Any) -> bool:
        """Apply every pending command; block for one when idle, then gather the rest of a
        burst (``gather_bound``). True means stop."""
        block = not self._live
        gather_until = math.inf
        while True:
            polled = False
            try:
                if block:
                    command = self._inbox.get()
                    if isinstance(command, InsertSequence):
                        gather_until = time.monotonic() + self._gather_bound(generator, command)
                elif self._gathering(gather_until):
                    polled = True
                    command = self._inbox.get(timeout=GATHER_POLL_SECONDS)
                else:
                    command = self._inbox.get_nowait()
            except queue.Empty:
                if polled:
                    # Look again: still gathering, or the count dropped during the poll, and
                    # a request counts down only after its sequence is in the inbox.
                    continue
                return False
            block = False
            match command:
                case InsertSequence():
                    self._insert(loaded, generator, stop_tokens, command)
                case RemoveSequence(seq_id):
                    removed = self._live.get(seq_id)
                    if removed is not None:
                        generator.remove([removed.uid])
                        self._end(removed, "cancelled")
                case StopGeneration():
                    return True
                case _:
                    assert_never(command)

    def _gather_bound(self, generator: Any, first: InsertSequence) -> float:
        counters = generator._counters
        return gather_bound(
            float(counters.prompt_time), int(counters.prompt_tokens), len(first.prompt)
        )

    def _gathering(self, until: float) -> bool:
        """Whether the batch, idle until this intake, still waits for a burst's requests."""
        return until != math.inf and self._arriving() > 0 and time.monotonic() < until

    def _sampler(self, command: InsertSequence, fault: _Fault) -> Any:
        if command.seed is not None and command.temperature != 0:
            seeded = make_seeded_sampler(command.temperature, command.top_p, command.seed)
            return _guard(seeded, fault, _greedy)
        # Shared per setting, unguarded: mlx-lm samples a batch in one call only when its rows
        # share one sampler object, and these are ours and cannot fail per row.
        key = (command.temperature, command.top_p)
        shared = self._samplers.get(key)
        if shared is None:
            shared = self._samplers[key] = make_shared_sampler(*key)
        return shared

    def _insert(
        self, loaded: LoadedModel, generator: Any, stop_tokens: Any, command: InsertSequence
    ) -> None:
        fault = _Fault()
        try:
            sampler = self._sampler(command, fault)
            processors = command.make_processors() if command.make_processors else []
            # Only the part of the prompt the prompt cache does not hold is prefilled.
            reuse = self._prompt_cache.fetch(command.owner, command.prompt)
            command.slot.cached_tokens = reuse.tokens
            cuts = (
                boundaries(command.prompt, self._marks, reuse.tokens)
                if self._marks is not None
                else ()
            )
            (uid,) = generator.insert_segments(
                [split(command.prompt, reuse.tokens, cuts)],
                max_tokens=[command.max_tokens],
                caches=[reuse.cache],
                all_tokens=[list(command.prompt[: reuse.tokens])],
                samplers=[sampler],
                logits_processors=[[_guard(p, fault, _keep_logits) for p in processors]],
                stop_sequences=[stop_tokens],
            )
        except Exception as exc:
            log.exception("sequence %d could not start", command.seq_id)
            self._counters.failed += 1
            command.slot.push(finish="error", error=repr(exc))
            self._on_ended(command.seq_id)
            return
        entry = _Live(
            command.seq_id,
            uid,
            command.slot,
            # A fresh streaming detokenizer per sequence (the property copies one).
            loaded.tokenizer.detokenizer,
            command.max_tokens,
            fault,
            StopMatcher(command.stop_texts) if command.stop_texts else None,
            command.top_logprobs,
            owner=command.owner,
            cache_parent=reuse.parent,
            cache_key=command.cache_key,
            prompt_length=len(command.prompt),
            reused=reuse.tokens,
            checkpoints=frozenset(cuts),
        )
        self._live[command.seq_id] = entry
        self._by_uid[uid] = entry

    def _step(self, generator: Any) -> None:
        if self._threads is not None:
            self._threads.before_step(_prefills(generator))
        prompt_responses, generation_responses = generator.next()
        for progress in prompt_responses:
            entry = self._by_uid.get(progress.uid)
            if (
                entry is not None
                and progress.end_of_segment
                and not progress.end_of_prompt
                and entry.reused + progress.progress[0] in entry.checkpoints
            ):
                # A segment boundary: what the prefill holds now serves later prompts that
                # share this prefix (an exact prefix: the model's cache cannot be trimmed).
                self._prompt_cache.checkpoint(
                    entry.owner,
                    generator,
                    entry.uid,
                    partition=entry.cache_key,
                    at=entry.checkpoints,
                )
            if entry is not None and progress.end_of_prompt and not entry.prefill_done:
                entry.prefill_done = True
                entry.slot.push(prefill_done=True)
                self._prompt_cache.checkpoint(
                    entry.owner, generator, entry.uid, entry.cache_parent, entry.cache_key
                )
        for response in generation_responses:
            entry = self._by_uid.get(response.uid)
            if entry is None or entry.fault.error is not None:
                continue
            try:
                self._deliver(generator, entry, response)
            except Exception as exc:
                entry.fault.error = exc
        for entry in [e for e in self._live.values() if e.fault.error is not None]:
            log.error("sequence %d failed: %r", entry.seq_id, entry.fault.error)
            if entry.uid in self._by_uid:
                generator.remove([entry.uid])
            self._end(entry, "error", repr(entry.fault.error))

    def _store_finished(self, entry: _Live, response: Any) -> None:
        """Keep a finished sequence's cache (prompt and reply) for the next turn."""
        self._prompt_cache.store(
            entry.owner,
            response.all_tokens,
            response.prompt_cache,
            partition=entry.cache_key,
            prompt_tokens=entry.prompt_length,
        )

    def _deliver(self, generator: Any, entry: _Live, response: Any) -> None:
        """One generated token of ``entry``: its text to the slot, and its end if it ended."""
        detokenizer = entry.detokenizer
        finish = response.finish_reason
        entry.prefill_done = True
        if finish == "stop":
            # The token that completes a stop sequence is not part of the output.
            detokenizer.finalize()
            tokens = 0
        else:
            detokenizer.add_token(response.token)
            if finish == "length":
                detokenizer.finalize()
            tokens = 1
        text = detokenizer.last_segment
        matched: str | None = None
        if entry.stops is not None:
            text, matched = entry.stops.feed(text)
            if matched is None and finish is not None:
                text += entry.stops.flush()
        logprobs = (
            ()
            if entry.top_logprobs is None or not tokens
            else (self._logprob_entry(response, entry.top_logprobs),)
        )
        entry.slot.push(text, tokens, prefill_done=True, logprobs=logprobs, stop_sequence=matched)
        if matched is not None:
            if finish is None:
                # Keep what it computed for the next turn, then take it out of the batch.
                self._prompt_cache.checkpoint(
                    entry.owner,
                    generator,
                    entry.uid,
                    entry.cache_parent,
                    entry.cache_key,
                    entry.prompt_length,
                )
                generator.remove([entry.uid])
            else:
                self._store_finished(entry, response)
            self._end(entry, "stop")
        elif finish is not None:
            self._store_finished(entry, response)
            self._end(entry, "length" if finish == "length" else "stop")

    def _logprob_entry(self, response: Any, top: int) -> dict[str, Any]:
        """The SDK's ``Logprob`` for one generated token, with ``top`` alternatives."""
        import mlx.core as mx

        logprobs = response.logprobs
        alternatives: list[dict[str, Any]] = []
        if top > 0:
            ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
            values = logprobs[ids]
            pairs: list[tuple[int, float]] = [
                (int(i), float(v))  # type: ignore[arg-type]
                for i, v in zip(ids.tolist(), values.tolist(), strict=True)  # type: ignore[arg-type]
            ]
            pairs.sort(key=lambda pair: -pair[1])
            alternatives = [self._token_logprob(i, v) for i, v in pairs]
        entry = self._token_logprob(response.token, float(logprobs[response.token].item()))
        entry["top_logprobs"] = alternatives
        return entry

    def _token_logprob(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._tokenizer.decode([int(token)])
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}

    def _publish(self, generator: Any) -> None:
        decoding = len(generator._generation_batch)
        raw = generator._counters
        previous = self._statistics
        self._statistics = ModelStatistics(
            active=len(self._live),
            queued=len(generator._unprocessed_sequences),
            prefilling=len(generator._prompt_batch),
            decoding=decoding,
            active_ids=frozenset(self._live),
            tokens_generated=int(raw.generation_tokens),
            prompt_tokens_processed=int(raw.prompt_tokens),
            sequences_finished=self._counters.finished,
            sequences_cancelled=self._counters.cancelled,
            sequences_failed=self._counters.failed,
            steps=previous.steps + 1,
            peak_decoding=max(previous.peak_decoding, decoding),
            prompt_cache=self._prompt_cache.stats,
        )
        self._on_statistics(self._statistics)
