"""The batch on the generation thread: one ``BatchGenerator``, the sequences in it, the
prompt cache. ``GenerationThread`` applies its inbound messages here and steps it.

Invariants:
- Called only on the generation thread (every MLX call happens there).
- Every admitted sequence receives exactly one finish on its slot (stop, length, cancelled,
  shutdown or error) and is listed once in ``take_ended`` after it: that is what releases its
  admission in the model actor.
- A fault stays with its sequence: whatever one sequence's setup, logits processors, sampler
  or detokenizer raises ends that sequence alone with ``error``; the batch goes on. Only an
  error of the batch itself (the model's forward pass) propagates.
- Text is made off this thread where it can be: a sequence without stop sequences pushes its
  token ids and its slot's consumer detokenizes them (``SequenceSlot.detokenize_with``); one
  with stop sequences needs its text here to match them, and is detokenized here.
- Stop sequences (``stop_texts``) belong to the sequence: the first one completed ends it with
  ``stop`` (the matched text is not output), as the model's own end token does.
- The books are ours, not mlx-lm's: each sequence's phase (queued, prefilling, decoding) follows
  the responses ``next()`` returns, and the token counts and prefill time come from
  ``BatchGenerator.stats()`` around each step; mlx-lm is used through its public API only.
- Segment checkpoints: on a model whose cache cannot be trimmed
  (``prompt_cache.needs_checkpoints``), a sequence's prompt is inserted as segments cut at the
  boundaries that survive re-rendering (``segments.boundaries``), and the cache is stored at
  each cut as its prefill passes it. On other models a prompt is one segment.
- Identical messages and steps give identical output: nothing here reads the clock or any
  state but the messages' own (seeded samplers draw from their own keys).
- A sequence alone decodes outside the generator ("solo"): when the batch holds one sequence,
  decoding, with nothing the generator alone does for it (no grammar, seeded sampler, images
  or segment checkpoints, on a one-process model whose cache is plain ``KVCache`` layers, not
  quantized), its cache leaves the generator and each step is one call of the model on that
  plain cache. Its penalties and ``top_k`` (logits processors that read only the tokens and
  the logits) go with it, over the same token context the generator keeps (mlx-lm's
  ``TokenBuffer``); a grammar's matcher keeps state of its own and stays in the generator.
  ``BatchGenerator`` pays for batching even in a batch of one (a left-padded cache, masks,
  rows split per step): ~12% of a step on the bundled model, ~3% on the bench model
  (``bench/batch_of_one.py``). The tokens are the same (greedy: identical, tested); the step
  is pipelined as the generator's is (the next token computes while this one is delivered).
  The sequence goes back into the generator before anything else touches it: another
  sequence's admission, a ``stop`` (its consumer's, or a stop text matched here). Going
  alone copies the cache, so a sequence first generates a token per ``SOLO_BYTES_PER_TOKEN``
  of it in the generator: a short answer to a long context stays there. Entering and
  leaving each recompute one token (the cache is trimmed by one and its last token fed
  again), so the token in flight at the switch is never lost or doubled.
- A lone sequence that may go alone, with no logits processors and a prompt of at most one
  prefill chunk, is prefilled alone too ("a prefill alone"): admitted into an empty batch and
  still alone at the next step, it leaves the generator before its prefill, and that step is
  one call of the model on the prompt (after what the prompt cache served) that samples the
  first token, then a solo step that delivers it. The generator takes three calls for the same
  token (the prompt, its last token, the step that returns the token): the first delta of a
  lone streamed request 1.3 ms sooner on the bundled model, 5.5 ms on the 10M bench model
  (``bench/first_token_ab.py``, against the code without it).
  The end-of-prompt checkpoint is stored after the first token is out. A second sequence
  admitted before that step sends it through the generator as any other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Literal, assert_never

from ..protocol.stops import StopMatcher
from .blas_threads import StepThreads, open_blas
from .constrain import make_logits_processor
from .faults import Fault, guard
from .inbound import Admit, SequenceSpec
from .kv_bytes import batch_kv_bytes
from .loader import LoadedModel
from .outbound import ModelStatistics
from .prompt_cache import PromptCache, needs_checkpoints
from .sampling import make_seeded_sampler, make_shared_sampler
from .segments import ChatMarks, boundaries, chat_marks, render_without_generation_prompt, split
from .slot import FinishReason, SequenceSlot
from .vision_prefill import CacheMatch, KeyedGenerator, admission_start, keyed, match_cache

log = logging.getLogger(__name__)

Phase = Literal["queued", "prefilling", "decoding"]


def _keep_logits(_context: Any, logits: Any) -> Any:
    return logits


# Going alone copies the sequence's KV cache twice (out of the generator's batch cache, then
# into a buffer with room to grow) and computes one token again: ~25 ms at 8,000 tokens of
# context on the bench model here, 64 MB of KV, where a step alone saves ~0.1-0.3 ms. So a
# sequence goes alone only once it has generated a token for each this many bytes of its cache
# (a sequence that has generated that many is likely to generate about as many more): at once
# on a short context, after ~250 tokens at 8,000 tokens of the bench model's context; a short
# answer to a long context never pays the copies.
SOLO_BYTES_PER_TOKEN = 256 << 10

# Steps alone between two returns of MLX's freed buffers to the system (``mx.clear_cache``):
# the generator returns them every 512 of its steps, mlx-lm's one-sequence loop every 256.
SOLO_CLEAR_EVERY = 512


def _plain_cache(model: Any) -> bool:
    """Whether every layer of ``model``'s cache is a plain ``KVCache`` (trims; what the
    generator's batch cache gives back for one sequence)."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


def _exact(cache: list[Any], tokens: int | None = None) -> list[Any]:
    """Copies of plain KV layers holding exactly their tokens (no room to grow), as the
    generator's finished sequences' caches are; with ``tokens``, only their first ``tokens``."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    copies = []
    for layer in cache:
        held = layer.offset if tokens is None else tokens
        copy = KVCache()
        copy.keys = mx.contiguous(layer.keys[..., :held, :])
        copy.values = mx.contiguous(layer.values[..., :held, :])
        copy.offset = held
        copies.append(copy)
    return copies


def _greedy(logprobs: Any) -> Any:
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


class _Discard:
    """The output of a sequence nobody reads (``Admit.output`` None)."""

    def push(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def report_cache(self, _tokens: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def detokenize_with(self, _detokenizer: Any) -> None:
        pass


@dataclass(slots=True)
class _Live:
    seq_id: int
    uid: int
    slot: SequenceSlot | _Discard
    detokenizer: Any  # None: the slot's consumer detokenizes (the sequence has no stops)
    fault: Fault
    stops: StopMatcher | None = None
    top_logprobs: int | None = None
    phase: Phase = "queued"
    owner: str = ""
    cache_parent: tuple[int, ...] | None = None  # the prompt-cache entry it was served from
    cache_key: str | None = None
    prompt_length: int = 0
    reused: int = 0  # prompt tokens the prompt cache served
    checkpoints: frozenset[int] = frozenset()  # prompt lengths to checkpoint at (segments)
    keyed: tuple[int, ...] | None = None  # an image prompt's cache key (vision_prefill.keyed)
    sampler: Any = None
    max_tokens: int = 0
    generated: int = 0  # tokens delivered (the finishing one included)
    solo: bool = False  # it may decode alone outside the generator (the module header)
    solo_after: int | None = None  # tokens it generates in the generator first (None: not known)
    processors: tuple[Any, ...] = ()  # its logits processors, guarded (``faults.guard``)
    alone: _AloneStart | None = None  # while queued: what a prefill alone starts from


@dataclass(frozen=True, slots=True)
class _AloneStart:
    """What a prefill alone starts from (the module header): the prompt, how many of its tokens
    the cache holds, and that cache (None: an empty one)."""

    prompt: tuple[int, ...]
    start: int
    cache: list[Any] | None


@dataclass(slots=True)
class _Solo:
    """The sequence decoding alone: its cache and the tokens in it, and the next token (with
    its log-probabilities), computing, not yet in the cache."""

    entry: _Live
    cache: list[Any]
    tokens: list[int]
    pending: Any
    logprobs: Any
    matcher: Any  # mlx-lm's stop-token matcher
    context: Any = None  # the tokens its processors read (a ``TokenBuffer``; None without any)


@dataclass(frozen=True, slots=True)
class _SoloResponse:
    """A solo step's token, shaped as the generator's responses are read here."""

    token: int
    logprobs: Any
    finish_reason: str | None
    prompt_cache: Any = None
    all_tokens: Any = None


@dataclass(slots=True)
class _Totals:
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generated: int = 0
    steps: int = 0  # batch steps taken (the statistics, and each rank's figure for rank 0)
    solo_entries: int = 0  # times a sequence alone left the generator to decode on its own
    solo_steps: int = 0  # steps a sequence took alone
    solo_prefills: int = 0  # sequences prefilled alone, never in the generator until another came


class Batch:
    """The sequences the thread holds and the generator they run in (see the module header)."""

    def __init__(
        self,
        loaded: LoadedModel,
        prompt_cache: PromptCache,
        *,
        prefill_step_size: int,
        completion_batch_size: int,
        prefill_batch_size: int,
        solo: bool = False,
    ) -> None:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator, make_stop_sequences

        self._loaded = loaded
        self._mx = mx
        self._step = prefill_step_size
        self._prefill_batch = prefill_batch_size
        self._stream = mx.new_stream(mx.default_device())
        self._generator = BatchGenerator(
            loaded.model,
            completion_batch_size=completion_batch_size,
            prefill_batch_size=prefill_batch_size,
            prefill_step_size=prefill_step_size,
            stream=self._stream,
        )
        self._stop_tokens = make_stop_sequences(loaded.tokenizer)
        self._tokenizer = loaded.tokenizer
        self._prompt_cache = prompt_cache
        self._samplers: dict[tuple[float, float], Any] = {}
        self._live: dict[int, _Live] = {}
        self._by_uid: dict[int, _Live] = {}
        self._ended: list[int] = []
        # Ended sequences' finishes, given to their slots only once the thread has published
        # the statistics without them (``release_finishes``).
        self._finishing: list[tuple[SequenceSlot | _Discard, FinishReason, str | None]] = []
        self._found: CacheMatch | None = None  # ``lookup``'s, for the Admit about to be applied
        self.totals = _Totals()
        # Whether a sequence came, went or changed phase since ``take_changed`` (the thread
        # builds the statistics after a step only then, or when they are old).
        self._changed = False
        self._decoding = 0  # live sequences in the decoding phase (the rest prefill)
        # The faults recorded since the last step (``Fault.record``): only then does a step
        # look for the sequences to remove.
        self._faults: list[Fault] = []
        # OpenBLAS's count per step (decode or prefill).
        self._threads: StepThreads | None = None
        blas = open_blas()
        if blas is not None and loaded.blas is not None:
            stream = self._stream
            self._threads = StepThreads(
                blas.set_threads, loaded.blas, lambda: mx.synchronize(stream), blas.threads()
            )
        # The chat template's message marks, when the model's cache needs segment checkpoints.
        self._marks: ChatMarks | None = None
        if prompt_cache.enabled and needs_checkpoints(loaded.model):
            self._marks = chat_marks(render_without_generation_prompt(loaded.tokenizer))
        # Whether a sequence alone may decode outside the generator (the module header).
        self._solo_allowed = (
            solo
            and loaded.vision is None
            and loaded.kv_quant is None
            and loaded.topology is None
            and _plain_cache(loaded.model)
        )
        self._solo: _Solo | None = None

    @property
    def stream(self) -> Any:
        """The MLX stream the batch computes on (the ranks' exchanges join it)."""
        return self._stream

    @property
    def live(self) -> bool:
        return bool(self._live)

    @property
    def sequences(self) -> int:
        """How many sequences it holds (each rank's figure for rank 0)."""
        return len(self._live)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prompt cache has served since start (each rank's figure,
        equal on every rank when they reuse alike)."""
        return self._prompt_cache.stats.tokens_reused

    @property
    def prefill_full(self) -> bool:
        """Whether as many sequences wait for their prompt as one prefill takes in
        (``prefill_batch_size``): a sequence admitted now would prefill after them anyway."""
        return len(self._live) - self._decoding >= self._prefill_batch

    def take_changed(self) -> bool:
        """Whether the batch's members or their phases changed since the last call."""
        changed, self._changed = self._changed, False
        return changed

    def take_ended(self) -> tuple[int, ...]:
        """The sequences that ended since the last call (their finish follows with
        ``release_finishes``)."""
        ended, self._ended = tuple(self._ended), []
        return ended

    def release_finishes(self) -> None:
        """Give the ended sequences' slots their finish. The thread calls it after publishing
        the statistics those sequences left, so that a response that has ended (its consumer
        woken by the finish) is never still counted in its model's statistics."""
        finishing, self._finishing = self._finishing, []
        for slot, reason, error in finishing:
            slot.push(finish=reason, error=error)

    # -- messages ------------------------------------------------------------------------------

    def lookup(self, message: Admit) -> Admit:
        """``message`` met with the prompt cache before it is recorded or broadcast: without
        the pixels of the images its reused prefix holds (``vision_prefill.match_cache``);
        ``admit`` then inserts it with that reuse."""
        self._flush()  # the prompt cache may read the disk
        spec = message.spec
        reuse = self._prompt_cache.fetch(spec.owner, spec.prompt, message.disk_key)
        with self._mx.stream(self._stream):
            found = match_cache(message, reuse, self._loaded.model)
        if reuse.disk_key is not None and found.message.disk_key != reuse.disk_key:
            found = replace(found, message=replace(found.message, disk_key=reuse.disk_key))
        self._found = found
        return found.message

    def admit(self, message: Admit) -> None:
        if self._solo is not None:
            self._leave_solo()  # the generator batches them both from the next step
        spec = message.spec
        slot: SequenceSlot | _Discard = message.output or _Discard()
        fault = Fault(self._faults)
        try:
            sampler = self._sampler(spec, fault)
            processors = [guard(p, fault, _keep_logits) for p in self._processors(spec)]
            # Only the part of the prompt the prompt cache does not hold is prefilled.
            if self._found is None or self._found.message.seq_id != message.seq_id:
                self.lookup(message)
            found, self._found = self._found, None
            assert found is not None
            reuse = found.reuse
            with self._mx.stream(self._stream):
                start = admission_start(self._loaded, spec, found, self._step)
            slot.report_cache(start.reused)
            prompt = start.prompt
            cuts = boundaries(spec.prompt, self._marks, start.start) if self._marks else ()
            (uid,) = self._generator.insert_segments(
                [split(prompt, start.start, cuts)],
                max_tokens=[spec.max_tokens],
                caches=[start.cache],
                all_tokens=[list(prompt[: start.start])],
                samplers=[sampler],
                logits_processors=[processors],
                stop_sequences=[self._stop_tokens],
            )
        except Exception as exc:
            log.exception("sequence %d could not start", message.seq_id)
            self.totals.failed += 1
            slot.push(finish="error", error=repr(exc))
            self._ended.append(message.seq_id)
            return
        # A fresh streaming detokenizer per sequence (the property copies one): this thread's
        # when stop sequences need the text here, else the slot's consumer's.
        detokenizer = self._tokenizer.detokenizer
        if not spec.stop_texts:
            slot.detokenize_with(detokenizer)
        entry = _Live(
            message.seq_id,
            uid,
            slot,
            detokenizer if spec.stop_texts else None,
            fault,
            StopMatcher(spec.stop_texts) if spec.stop_texts else None,
            spec.top_logprobs,
            owner=spec.owner,
            cache_parent=reuse.parent,
            cache_key=spec.cache_key,
            prompt_length=len(spec.prompt),
            reused=start.start,
            checkpoints=frozenset(cuts),
            keyed=spec.prompt if prompt is not spec.prompt else None,
            sampler=sampler,
            max_tokens=spec.max_tokens,
            processors=tuple(processors),
            solo=(
                self._solo_allowed
                and spec.grammar is None
                and not cuts
                and prompt is spec.prompt
                and (spec.seed is None or spec.temperature == 0)
            ),
        )
        if entry.solo and not entry.processors and len(prompt) <= self._step:
            entry.alone = _AloneStart(prompt, start.start, start.cache)
        self._live[message.seq_id] = entry
        self._by_uid[uid] = entry
        self._changed = True

    def cancel(self, seq_id: int) -> None:
        removed = self._live.get(seq_id)
        if removed is not None:
            if self._solo is not None and self._solo.entry is removed:
                self._solo = None  # its cache and the token in flight are dropped
            self._generator.remove([removed.uid])
            self._end(removed, "cancelled")

    def stop(self, seq_id: int) -> None:
        """End a sequence with ``stop`` at its consumer's word, keeping what it computed."""
        entry = self._live.get(seq_id)
        if entry is None:
            return
        if entry.phase == "decoding":  # a whole prompt and some reply: worth a next turn
            self._stop_early(entry)
        else:
            self._generator.remove([entry.uid])
        self._end(entry, "stop")

    def clear_cache(self) -> None:
        self._prompt_cache.clear(disk=True)  # its MLX arrays are freed on this thread

    def _sampler(self, spec: SequenceSpec, fault: Fault) -> Any:
        if spec.seed is not None and spec.temperature != 0:
            seeded = make_seeded_sampler(spec.temperature, spec.top_p, spec.seed)
            return guard(seeded, fault, _greedy)
        # Shared per setting, unguarded: mlx-lm samples a batch in one call only when its rows
        # share one sampler object, and these are ours and cannot fail per row.
        key = (spec.temperature, spec.top_p)
        shared = self._samplers.get(key)
        if shared is None:
            shared = self._samplers[key] = make_shared_sampler(*key)
        return shared

    def _processors(self, spec: SequenceSpec) -> list[Any]:
        """The sequence's logits processors, built from its data: penalties and ``top_k`` first,
        then the grammar's mask, so the mask has the last word."""
        processors = spec.adjust.processors()
        if spec.grammar is not None:
            constraints = self._loaded.constraints
            if constraints is None:
                raise RuntimeError("this model's tokenizer does not support constraints")
            grammar = constraints.from_source(spec.grammar.kind, spec.grammar.source)
            processors.append(make_logits_processor(constraints, grammar))
        return processors

    # -- steps -----------------------------------------------------------------------------------

    def prefills(self) -> bool:
        """Whether the next step prefills: a sequence waits for its prompt or is in it."""
        return len(self._live) > self._decoding

    def step(self) -> None:
        if self._solo is not None:
            self._solo_step()
            return
        alone = self._alone()
        if alone is not None:
            self._prefill_alone(alone)
            return
        self._batch_step()
        if self._solo_allowed and len(self._live) == 1 and self._decoding == 1:
            (entry,) = self._live.values()
            if entry.solo and entry.generated > 0 and entry.fault.error is None:
                if entry.solo_after is None:  # its cache's size, once: the entry copies it
                    entry.solo_after = batch_kv_bytes(self._generator) // SOLO_BYTES_PER_TOKEN
                if entry.generated > entry.solo_after:
                    self._enter_solo(entry)

    def _to_prefill(self) -> int:
        """The prompt tokens the sequences not yet decoding have left to prefill, at most (the
        count at admission: a step of a long prompt's prefill still counts all of it)."""
        return sum(e.prompt_length - e.reused for e in self._live.values() if e.phase != "decoding")

    def _batch_step(self) -> None:
        generator = self._generator
        prefilling = self.prefills()
        if self._threads is not None:
            to_prefill = self._to_prefill() if prefilling else 0
            self._threads.before_step(prefilling, self._decoding, to_prefill)
        totals = self.totals
        if prefilling:  # mlx-lm's counters (~15 us a read) only where a prompt is in the step
            self._flush()
            with generator.stats() as stats:
                prompt_responses, generation_responses = generator.next()
            totals.prompt_tokens += stats.prompt_tokens
            totals.prompt_seconds += stats.prompt_time
        else:
            prompt_responses, generation_responses = generator.next()
        totals.generated += len(generation_responses)  # one token each
        totals.steps += 1
        for progress in prompt_responses:
            entry = self._by_uid.get(progress.uid)
            if entry is None:
                continue
            if entry.phase == "queued":
                entry.phase = "prefilling"
                entry.alone = None  # the generator prefills it
                self._changed = True
            if (
                progress.end_of_segment
                and not progress.end_of_prompt
                and entry.reused + progress.progress[0] in entry.checkpoints
            ):
                # A segment boundary: what the prefill holds now serves later prompts that
                # share this prefix (an exact prefix: the model's cache cannot be trimmed).
                self._prompt_cache.checkpoint(
                    entry.owner,
                    self._keyed(entry),
                    entry.uid,
                    partition=entry.cache_key,
                    at=entry.checkpoints,
                )
            if progress.end_of_prompt and entry.phase != "decoding":
                self._decodes(entry)
                entry.slot.push(prefill_done=True)
                self._prompt_cache.checkpoint(
                    entry.owner, self._keyed(entry), entry.uid, entry.cache_parent, entry.cache_key
                )
        for response in generation_responses:
            entry = self._by_uid.get(response.uid)
            if entry is None or entry.fault.error is not None:
                continue
            try:
                self._deliver(entry, response)
            except Exception as exc:
                entry.fault.record(exc)
        if not self._faults:  # no sequence's own code raised: nothing to look for
            return
        self._faults.clear()
        for entry in [e for e in self._live.values() if e.fault.error is not None]:
            log.error("sequence %d failed: %r", entry.seq_id, entry.fault.error)
            if entry.uid in self._by_uid:
                generator.remove([entry.uid])
            self._end(entry, "error", repr(entry.fault.error))

    # -- a sequence alone (the module header) ----------------------------------------------------

    def _solo_forward(
        self, entry: _Live, cache: list[Any], inputs: Any, context: Any, *, prompt: bool = False
    ) -> tuple[Any, Any]:
        """Feed ``inputs`` (one token, shape [1]; with ``prompt``, a prompt's tokens, shape [n])
        to the model on ``cache``; the next token and its log-probabilities, set computing (as
        ``BatchGenerator``'s step computes them: its processors see the token context with
        ``inputs`` added)."""
        mx = self._mx
        with mx.stream(self._stream):
            fed = inputs[None] if prompt else inputs[:, None]
            logits = self._loaded.model(fed, cache=cache)[:, -1, :]
            seen = () if context is None else context.update_and_fetch(inputs)
            for processor in entry.processors:
                logits = processor(seen, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            sampled = entry.sampler(logprobs)
            mx.async_eval(sampled, logprobs, seen)
        return sampled, logprobs

    def _alone(self) -> _Live | None:
        """The sequence the next step prefills alone, if one (the module header)."""
        if self._solo_allowed and len(self._live) == 1 and not self._decoding:
            (entry,) = self._live.values()
            if entry.alone is not None and entry.phase == "queued" and entry.fault.error is None:
                return entry
        return None

    def _prefill_alone(self, entry: _Live) -> None:
        """Prefill ``entry``'s prompt outside the generator, sampling its first token in the
        same call, and deliver that token with a solo step (the module header)."""
        from mlx_lm.models.cache import make_prompt_cache

        start, entry.alone = entry.alone, None
        assert start is not None
        self._generator.remove([entry.uid])  # queued there: it held nothing yet
        prompt = start.prompt
        tokens = len(prompt) - start.start
        if self._threads is not None:
            self._threads.before_step(True, 1, tokens)
        began = time.perf_counter()
        # The prompt cache's served layers share their arrays with its entry (the generator
        # only reads them, merging them into its batch), and a model call writes a layer's
        # spare room in place: the prefill alone runs on copies holding exactly their tokens.
        model = self._loaded.model
        cache = make_prompt_cache(model) if start.cache is None else _exact(start.cache)
        inputs = self._mx.array(prompt[start.start :])
        pending, logprobs = self._solo_forward(entry, cache, inputs, None, prompt=True)
        self._decodes(entry)
        entry.slot.push(prefill_done=True)
        self._solo = _Solo(
            entry, cache, list(prompt), pending, logprobs, self._stop_tokens.matcher()
        )
        totals = self.totals
        totals.solo_prefills += 1
        self._solo_step()  # its first token, out before anything else is done here
        totals.prompt_tokens += tokens
        totals.prompt_seconds += time.perf_counter() - began
        # The end-of-prompt checkpoint, as the generator's prompts get one: its first
        # ``len(prompt)`` tokens, whatever the sequence holds by now. A sequence that ended
        # with its first token has stored its whole cache, which serves its prompt too.
        if entry.seq_id in self._live and self._prompt_cache.enabled:
            held = _exact(cache, len(prompt))
            self._prompt_cache.store(entry.owner, prompt, held, entry.cache_parent, entry.cache_key)

    def _enter_solo(self, entry: _Live) -> None:
        """Take ``entry``'s cache out of the generator. Its last token is in the cache and the
        next one computing in the generator, out of reach: the cache gives the last token
        back (trimmed by one) and the model is fed it again."""
        cache, tokens = self._generator.remove([entry.uid], return_prompt_caches=True)[entry.uid]
        for layer in cache:
            layer.trim(1)
        context = None
        if entry.processors:  # the tokens in the cache now, as the generator's context held them
            from mlx_lm.models.cache import TokenBuffer

            context = TokenBuffer(list(tokens[:-1]))
        pending, logprobs = self._solo_forward(entry, cache, self._mx.array(tokens[-1:]), context)
        self._solo = _Solo(
            entry, cache, list(tokens), pending, logprobs, self._stop_tokens.matcher(), context
        )
        self.totals.solo_entries += 1

    def _leave_solo(self) -> None:
        """Put the sequence decoding alone back into the generator: its cache without its last
        token, which the generator feeds again (the token computing now is dropped)."""
        solo, self._solo = self._solo, None
        assert solo is not None
        entry = solo.entry
        for layer in solo.cache:
            layer.trim(1)
        last = solo.tokens.pop()
        (uid,) = self._generator.insert_segments(
            [[[last]]],
            max_tokens=[entry.max_tokens - entry.generated],
            caches=[solo.cache],
            all_tokens=[solo.tokens],
            samplers=[entry.sampler],
            logits_processors=[list(entry.processors)],
            stop_sequences=[self._stop_tokens],
        )
        self._by_uid.pop(entry.uid, None)
        entry.uid = uid
        self._by_uid[uid] = entry

    def _solo_step(self) -> None:
        """One step of the sequence alone: feed the token computed last step, deliver it."""
        solo = self._solo
        assert solo is not None
        entry = solo.entry
        if self._threads is not None:
            self._threads.before_step(False)
        current, logprobs = solo.pending, solo.logprobs
        # Fed even when it is the last (the generator feeds it too): the stored cache holds it.
        solo.pending, solo.logprobs = self._solo_forward(entry, solo.cache, current, solo.context)
        token = int(current.item())
        solo.tokens.append(token)
        totals = self.totals
        totals.generated += 1
        totals.steps += 1
        totals.solo_steps += 1
        if totals.solo_steps % SOLO_CLEAR_EVERY == 0:
            self._mx.clear_cache()  # freed buffers back to the system, as the generator does
        finish = "length" if entry.generated + 1 >= entry.max_tokens else None
        if solo.matcher.advance(token):
            finish = "stop"
        row = None if entry.top_logprobs is None else logprobs[0]  # read only when asked for
        if finish is None:
            response = _SoloResponse(token, row, None)
        else:
            self._solo = None
            response = _SoloResponse(token, row, finish, _exact(solo.cache), solo.tokens)
        try:
            self._deliver(entry, response)
        except Exception as exc:
            entry.fault.record(exc)
        if entry.fault.error is not None:
            self._faults.clear()
            self._solo = None
            if entry.seq_id in self._live:
                log.error("sequence %d failed: %r", entry.seq_id, entry.fault.error)
                self._generator.remove([entry.uid])  # in it again if a stop text put it back
                self._end(entry, "error", repr(entry.fault.error))

    def _flush(self) -> None:
        """Before work that may outlast a decode step: the decoding sequences' output waiting
        out a linger goes to their consumers now (``SequenceSlot.flush``)."""
        if self._decoding:
            for entry in self._live.values():
                if entry.phase == "decoding":
                    entry.slot.flush()

    def _decodes(self, entry: _Live) -> None:
        """``entry`` has its whole prompt in the cache: it decodes from now on."""
        entry.phase = "decoding"
        self._decoding += 1
        self._changed = True

    def _deliver(self, entry: _Live, response: Any) -> None:
        """One generated token of ``entry``: its id (or, with stop sequences, its text) to the
        slot, and its end if it ended."""
        finish = response.finish_reason
        entry.generated += 1
        if entry.phase != "decoding":
            self._decodes(entry)
        # The token that completes a stop is not part of the output.
        token = None if finish == "stop" else int(response.token)
        here = entry.detokenizer is not None  # stop sequences: matched in the text, here
        text, matched = self._text_here(entry, token, finish) if here else ("", None)
        logprobs = (
            ()
            if entry.top_logprobs is None or token is None
            else (self._logprob_entry(response, entry.top_logprobs),)
        )
        entry.slot.push(
            text,
            0 if token is None else 1,
            token=None if here else token,
            prefill_done=True,
            logprobs=logprobs,
            stop_sequence=matched,
        )
        if matched is not None:
            if finish is None:
                self._stop_early(entry)
            else:
                self._store_finished(entry, response)
            self._end(entry, "stop")
        elif finish is not None:
            self._store_finished(entry, response)
            self._end(entry, "length" if finish == "length" else "stop")

    def _text_here(
        self, entry: _Live, token: int | None, finish: str | None
    ) -> tuple[str, str | None]:
        """The text of ``token`` (None: the stop token, none) on this thread, with the stop
        sequence it completes, if one: for a sequence with stop sequences."""
        detokenizer, stops = entry.detokenizer, entry.stops
        assert stops is not None
        if token is not None:
            detokenizer.add_token(token)
        if token is None or finish == "length":
            detokenizer.finalize()
        text, matched = stops.feed(detokenizer.last_segment)
        if matched is None and finish is not None:
            text += stops.flush()
        return text, matched

    def _stop_early(self, entry: _Live) -> None:
        """Keep what a sequence mlx-lm has not finished computed for the next turn, then take
        it out of the batch."""
        if self._solo is not None and self._solo.entry is entry:
            self._leave_solo()  # the cache is read from the generator, as the rest's
        self._prompt_cache.checkpoint(
            entry.owner,
            self._keyed(entry),
            entry.uid,
            entry.cache_parent,
            entry.cache_key,
            entry.prompt_length,
        )
        self._generator.remove([entry.uid])

    def _keyed(self, entry: _Live) -> Any:
        """The generator, as the prompt cache reads a sequence from it: an image prompt's
        tokens under its image handles (``vision_prefill.keyed``)."""
        generator = self._generator
        return generator if entry.keyed is None else KeyedGenerator(generator, entry.keyed)

    def _store_finished(self, entry: _Live, response: Any) -> None:
        """Keep a finished sequence's cache (prompt and reply) for the next turn."""
        tokens = response.all_tokens
        self._prompt_cache.store(
            entry.owner,
            tokens if entry.keyed is None else keyed(tokens, entry.keyed),
            response.prompt_cache,
            partition=entry.cache_key,
            prompt_tokens=entry.prompt_length,
        )

    def _end(self, entry: _Live, reason: FinishReason, error: str | None = None) -> None:
        """Take ``entry`` out of the books; its slot gets its finish with ``release_finishes``."""
        if self._live.pop(entry.seq_id, None) is not None and entry.phase == "decoding":
            self._decoding -= 1
        self._by_uid.pop(entry.uid, None)
        self._changed = True
        match reason:
            case "cancelled":
                self.totals.cancelled += 1
            case "error":
                self.totals.failed += 1
            case "stop" | "length" | "shutdown":
                self.totals.finished += 1
            case _:
                assert_never(reason)
        self._finishing.append((entry.slot, reason, error))
        self._ended.append(entry.seq_id)

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

    # -- books -----------------------------------------------------------------------------------

    def statistics(self, previous: ModelStatistics) -> ModelStatistics:
        phases = {"queued": 0, "prefilling": 0, "decoding": 0}
        for entry in self._live.values():
            phases[entry.phase] += 1
        decoding = phases["decoding"]
        totals = self.totals
        return ModelStatistics(
            active=len(self._live),
            queued=phases["queued"],
            prefilling=phases["prefilling"],
            decoding=decoding,
            active_ids=frozenset(self._live),
            tokens_generated=totals.generated,
            prompt_tokens_processed=totals.prompt_tokens,
            sequences_finished=totals.finished,
            sequences_cancelled=totals.cancelled,
            sequences_failed=totals.failed,
            steps=totals.steps,
            peak_decoding=max(previous.peak_decoding, decoding),
            prompt_cache=self._prompt_cache.stats,
            batch_kv_bytes=batch_kv_bytes(
                self._generator, () if self._solo is None else self._solo.cache
            ),
        )

    def close(self, reason: FinishReason, error: str | None) -> None:
        """End every sequence with ``reason``; free the cache and the generator."""
        self._solo = None
        for entry in list(self._live.values()):
            self._end(entry, reason, error)
        if reason == "shutdown":  # a clean stop: what RAM holds survives the restart
            self._prompt_cache.flush()
        self._prompt_cache.clear()  # its MLX arrays are freed on this thread
        self._generator.close()
