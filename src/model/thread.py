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
from .prefix_cache import PrefixCacheStats
from .prompt_cache import DEFAULT_MAX_ENTRIES, PromptCache, default_max_bytes
from .sampling import make_seeded_sampler, make_shared_sampler
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
    # Logprobs of each generated token, with this many alternatives (None: not asked).
    top_logprobs: int | None = None
    # Builds this sequence's logits processors on the generation thread (constrained decoding).
    make_processors: Callable[[], list[Any]] | None = None
    seed: int | None = None
    # The tenant: the prompt cache serves a sequence only from its own tenant's prefixes.
    owner: str = ""


@dataclass(frozen=True, slots=True)
class RemoveSequence:
    """Sender: ModelHandle.cancel. Drop a sequence wherever it is (queued, prefill, decode)."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class StopGeneration:
    """Sender: the model actor at shutdown. Finish every sequence with ``shutdown`` and exit."""


@dataclass(frozen=True, slots=True)
class CrashForTest:
    """Sender: tests only (ModelHandle.crash_for_test). The thread dies as on an MLX error."""


Command = InsertSequence | RemoveSequence | StopGeneration | CrashForTest


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
    prompt_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)


@dataclass(slots=True)
class _Live:
    seq_id: int
    uid: int
    slot: SequenceSlot
    detokenizer: Any
    max_tokens: int
    top_logprobs: int | None = None
    prefill_done: bool = False
    owner: str = ""
    cache_parent: tuple[int, ...] | None = None  # the prompt-cache entry it was served from


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    model_path: str
    prefill_step_size: int = 512
    completion_batch_size: int = 32
    prefill_batch_size: int = 8
    # None: a fraction of the machine's memory (prompt_cache.default_max_bytes); 0 disables.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES


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
        self._tokenizer: Any = None
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
        self._tokenizer = loaded.tokenizer
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
            self._prompt_cache.clear()  # its MLX arrays are freed on this thread
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
        samplers = self._samplers
        block = not live
        while True:
            try:
                command = self._inbox.get(block=block)
            except queue.Empty:
                return False
            block = False
            match command:
                case InsertSequence(
                    seq_id, prompt, max_tokens, temperature, top_p, slot, top_logprobs, make, seed
                ):
                    if seed is not None:
                        sampler = make_seeded_sampler(temperature, top_p, seed)
                    else:
                        shared = samplers.get((temperature, top_p))
                        if shared is None:
                            shared = make_shared_sampler(temperature, top_p)
                            samplers[(temperature, top_p)] = shared
                        sampler = shared
                    try:
                        processors = make() if make is not None else []
                    except Exception as exc:
                        log.exception("could not build logits processors")
                        slot.push(finish="error", error=repr(exc))
                        continue
                    # Only the part of the prompt the prompt cache does not hold is prefilled.
                    reuse = self._prompt_cache.fetch(command.owner, prompt)
                    slot.cached_tokens = reuse.tokens
                    (uid,) = generator.insert(
                        [list(prompt[reuse.tokens :])],
                        max_tokens=[max_tokens],
                        caches=[reuse.cache],
                        all_tokens=[list(prompt[: reuse.tokens])],
                        samplers=[sampler],
                        logits_processors=[processors],
                        stop_sequences=[stop_sequences],
                    )
                    # A fresh streaming detokenizer per sequence (the property copies one).
                    entry = _Live(
                        seq_id, uid, slot, loaded.tokenizer.detokenizer, max_tokens, top_logprobs
                    )
                    entry.owner, entry.cache_parent = command.owner, reuse.parent
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
                case CrashForTest():
                    raise RuntimeError("generation thread crash injected by a test")

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
                self._prompt_cache.checkpoint(entry.owner, generator, entry.uid, entry.cache_parent)
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
            else:
                detokenizer.add_token(response.token)
                if finish == "length":
                    detokenizer.finalize()
                logprobs = (
                    ()
                    if entry.top_logprobs is None
                    else (self._logprob_entry(response, entry.top_logprobs),)
                )
                entry.slot.push(
                    detokenizer.last_segment,
                    1,
                    prefill_done=True,
                    finish="length" if finish == "length" else None,
                    logprobs=logprobs,
                )
            if finish is not None:
                self._prompt_cache.store(entry.owner, response.all_tokens, response.prompt_cache)
                del live[entry.seq_id]
                del by_uid[entry.uid]
                counters["finished"] += 1

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
            prompt_cache=self._prompt_cache.stats,
        )
