"""The model actor: the single owner of the model, running continuous batching on its own thread.

Invariants:
- All MLX work happens on the ``GenerationThread`` this actor starts and joins. This task owns
  the thread, admission and the closing flag; others reach them only by message (``submit``,
  ``cancel``, ``shutdown``), and the thread reports back by message (a sequence ended, it
  exited), so every change of admission happens here, in one task.
- Admission: at most ``max_sequences`` sequences are admitted; one is released when the thread
  reports that it ended, however it ended, never by its consumer. ``submit`` refuses with
  ``ModelOverloaded`` beyond that and with ``ModelUnavailable`` once shutdown began.
- A cancel puts a ``RemoveSequence`` on the thread's inbox: the sequence leaves the batch at
  the thread's next step (one decode step or one prefill chunk).
- If the thread dies while the server lives, the sequences it held end with ``error``; those
  it had not taken in yet go to a new thread, which loads the model again: the server keeps
  serving.
- ``statistics()`` returns the thread's latest immutable snapshot, with ``admitted`` from here.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, assert_never

import trio

from .. import formats
from ..formats import reasoning_opens_in_prompt
from ..model.constrain import Constraints, Grammar
from ..model.incremental_render import IncrementalTokenizer
from ..model.loader import LoadedModel, render_prompt
from ..model.prompt_bounds import measure_tokenizer, render_within
from ..model.prompt_cache import DEFAULT_MAX_ENTRIES
from ..model.slot import FinishReason, SequenceOutput, SequenceSlot
from ..model.thread import (
    GenerationThread,
    InsertSequence,
    ModelStatistics,
    RemoveSequence,
    StopGeneration,
    ThreadSettings,
)
from ..protocol.prompt_memo import RenderedPrompt
from .kit import Reply, ask, open_mailbox

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0

ThreadFactory = Callable[..., GenerationThread]


class ModelUnavailable(RuntimeError):
    """The model is shutting down or has stopped; no new sequence is admitted."""


class ModelOverloaded(RuntimeError):
    """Too many sequences are admitted already."""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    model_path: str
    alias: str
    prefill_step_size: int = 512
    completion_batch_size: int = 32
    prefill_batch_size: int = 8
    max_sequences: int = 256
    # --ctx-size: the context window the server enforces and compaction plans with; None: the
    # model's own (its config's max_position_embeddings or the like).
    context_size: int | None = None
    # --prompt-cache-bytes (None: a fraction of the machine's memory; 0 disables) and
    # --prompt-cache-entries.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES
    # --blas-threads (None: measured at load, model.blas_threads).
    blas_threads: int | None = None
    # --tool-format: a ``formats`` name that overrides the detected format (None: detected).
    tool_format: str | None = None
    # The seam for fault injection: tests install a GenerationThread subclass here.
    thread_factory: ThreadFactory = GenerationThread


@dataclass(frozen=True, slots=True)
class ModelInfo:
    alias: str
    path: str
    context_window: int
    tool_format: str = "none"  # a ``formats`` registry name
    has_thinking: bool = False  # ``<think>`` tags or a format that carries reasoning


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A rendered prompt and its sampling settings."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int | None = None
    seed: int | None = None
    # Called on the generation thread to build this sequence's logits processors.
    make_processors: Callable[[], list[Any]] | None = None
    # Text that ends the sequence with ``stop`` when generated (the matched text is not output).
    stop_texts: tuple[str, ...] = ()
    # The tenant (decision 12): scopes the prompt cache.
    owner: str = ""
    # The request's prompt_cache_key: the prompt-cache partition its entries are kept in.
    cache_key: str | None = None


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """Sender: a response task. Admit a sequence, or refuse."""

    request: GenerationRequest
    reply: Reply[GenerationSequence]


@dataclass(frozen=True, slots=True)
class Cancel:
    """Sender: a response task (its cancel or its cleanup). Remove a sequence from the batch."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Sender: the root at shutdown. Refuse new sequences; finish running ones; stop."""


@dataclass(frozen=True, slots=True)
class SequenceEnded:
    """Sender: the generation thread. A sequence received its finish: release its admission."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class ThreadExited:
    """Sender: the generation thread, last."""

    thread: GenerationThread
    error: BaseException | None


ModelMessage = Submit | Cancel | Shutdown | SequenceEnded | ThreadExited


class GenerationSequence:
    """A response task's view of its sequence in the batch (its output slot)."""

    def __init__(self, handle: ModelHandle, seq_id: int, prompt_tokens: int, slot: SequenceSlot):
        self.seq_id = seq_id
        self.prompt_tokens = prompt_tokens
        self._handle = handle
        self._slot = slot

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prompt cache served (known once the first output arrived)."""
        return self._slot.cached_tokens

    @property
    def ended(self) -> bool:
        """The thread reported the sequence's finish (it holds nothing of it any more)."""
        return self._slot.finished

    async def receive(self, linger: float = 0.0) -> SequenceOutput:
        """The next coalesced output; ``trio.EndOfChannel`` after the finish was received.
        ``linger``: let output pile up for that long first (a finish ends it at once)."""
        return await self._slot.receive(linger)

    async def cancel(self) -> None:
        """Remove the sequence from the batch at the next step (no-op once it ended)."""
        if not self._slot.finished:
            await self._handle.cancel(self.seq_id)


class _Board:
    """The latest statistics snapshot: written by the generation thread and the actor (whole
    immutable values, so a reader on any thread sees a consistent one without a lock)."""

    def __init__(self) -> None:
        self.batch = ModelStatistics()
        self.admitted = 0
        # Requests on their way to the model (``ModelHandle.arriving``): written on the Trio
        # thread, read by the generation thread (an int, read whole).
        self.arriving = 0


class Arrival:
    """One request counted on the board as on its way to the model (``ModelHandle.arriving``)
    until ``done``, which may be called more than once."""

    __slots__ = ("_board", "_counted")

    def __init__(self, board: _Board) -> None:
        self._board = board
        self._counted = True
        board.arriving += 1

    def done(self) -> None:
        if self._counted:
            self._counted = False
            self._board.arriving -= 1


class ModelHandle:
    """The typed handle other actors use to reach the model actor."""

    def __init__(
        self,
        settings: ModelSettings,
        loaded: LoadedModel,
        mailbox: trio.MemorySendChannel[ModelMessage],
        board: _Board,
    ):
        fmt = formats.get(settings.tool_format or loaded.tool_format)
        self.info = ModelInfo(
            settings.alias,
            loaded.path,
            settings.context_size or loaded.context_window,
            fmt.name,
            loaded.has_thinking or fmt.reasons,
        )
        self.constraints = loaded.constraints
        self.blas = loaded.blas  # the OpenBLAS thread count set at load (None: not used)
        self.device = loaded.device  # MLX's device in words, asked at load on the MLX thread
        self._tokenizer = loaded.tokenizer
        self._bound = measure_tokenizer(loaded.tokenizer)
        self._incremental = IncrementalTokenizer.for_tokenizer(loaded.tokenizer, self._bound)
        self._mailbox = mailbox
        self._board = board
        self.restarts = 0

    def statistics(self) -> ModelStatistics:
        return replace(self._board.batch, admitted=self._board.admitted)

    @contextlib.contextmanager
    def arriving(self) -> Iterator[Arrival]:
        """Count a request as on its way to the model while the block runs (preparing its
        prompt, up to its ``submit``), or until the block calls ``done`` on it: an idle batch
        that gets a sequence waits briefly for the requests counted here, so that a burst is
        prefilled together (``thread.gather_bound``)."""
        arrival = Arrival(self._board)
        try:
            yield arrival
        finally:
            arrival.done()

    @property
    def decoding(self) -> int:
        """Sequences decoding at the latest step (cheap: read per output by every run)."""
        return self._board.batch.decoding

    async def render(
        self,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Apply the chat template and tokenize on a worker thread (tokenizer only, no MLX).
        With ``max_tokens``, a prompt provably longer raises ``PromptTooLong`` untokenized."""
        if max_tokens is not None:  # cheap refusals (model/prompt_bounds.py)
            return await trio.to_thread.run_sync(
                render_within,
                self._tokenizer,
                self._bound,
                max_tokens,
                chat,
                tools,
                template_kwargs,
            )
        return await trio.to_thread.run_sync(
            render_prompt, self._tokenizer, chat, tools, template_kwargs
        )

    async def render_continuing(
        self,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        max_tokens: int | None,
        known: RenderedPrompt | None,
    ) -> RenderedPrompt | None:
        """``render``, tokenizing only what ``known`` (an earlier render) does not cover
        (``model/incremental_render.py``): the same ids. ``None`` when this tokenizer or this
        prompt cannot be tokenized so; then ``render`` it."""
        return await trio.to_thread.run_sync(
            self._incremental.render,
            self._tokenizer,
            self._bound,
            max_tokens,
            chat,
            tools,
            template_kwargs,
            known,
        )

    def opens_reasoning(self, prompt: Sequence[int]) -> bool:
        """Whether the rendered prompt already opened a ``<think>`` block."""
        tail = self._tokenizer.decode(list(prompt[-8:]))
        return self.info.has_thinking and reasoning_opens_in_prompt(str(tail))

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False)) if text else 0

    async def compile(self, build: Callable[[Constraints], Grammar]) -> Grammar:
        """Compile a grammar on a worker thread (llguidance, no MLX); raises ``InvalidSchema``,
        or ``RuntimeError`` when this model's tokenizer cannot be constrained."""
        constraints = self.constraints
        if constraints is None:
            raise RuntimeError("this model's tokenizer does not support constrained decoding")
        return await trio.to_thread.run_sync(build, constraints)

    async def submit(self, request: GenerationRequest) -> GenerationSequence:
        """Admit ``request``; raises ``ModelOverloaded`` or ``ModelUnavailable``."""
        try:
            return await ask(self._mailbox, lambda reply: Submit(request, reply))
        except RuntimeError as exc:
            if isinstance(exc, ModelOverloaded | ModelUnavailable):
                raise
            raise ModelUnavailable("the model has stopped") from exc

    async def cancel(self, seq_id: int) -> None:
        try:
            await self._mailbox.send(Cancel(seq_id))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the actor is gone and so is its batch

    async def shutdown(self) -> None:
        """Refuse new sequences; finish running ones with ``shutdown``; stop the thread."""
        try:
            await self._mailbox.send(Shutdown())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def wait_idle(self) -> None:
        """Wait until the batch holds no sequence and nothing is admitted (tests, benchmarks)."""
        # Polled: the snapshot is published by the generation thread, not by a Trio task.
        while self.statistics().active or self._board.admitted:  # noqa: ASYNC110
            await trio.sleep(0.001)


class _Worker:
    """One generation thread; its reports come back to the actor as messages."""

    def __init__(
        self,
        settings: ModelSettings,
        report: Callable[[ModelMessage], None],
        board: _Board,
    ) -> None:
        self.loaded = trio.Event()
        self.result: LoadedModel | BaseException | None = None
        self._token = trio.lowlevel.current_trio_token()

        def on_loaded(loaded: LoadedModel | None, error: BaseException | None) -> None:
            self.result = loaded if loaded is not None else error or RuntimeError("load failed")
            self._token.run_sync_soon(self.loaded.set)

        def on_statistics(stats: ModelStatistics) -> None:
            board.batch = stats

        self.thread: GenerationThread = settings.thread_factory(
            ThreadSettings(
                settings.model_path,
                prefill_step_size=settings.prefill_step_size,
                completion_batch_size=settings.completion_batch_size,
                prefill_batch_size=settings.prefill_batch_size,
                prompt_cache_bytes=settings.prompt_cache_bytes,
                prompt_cache_entries=settings.prompt_cache_entries,
                blas_threads=settings.blas_threads,
            ),
            on_loaded=on_loaded,
            on_ended=lambda seq_id: report(SequenceEnded(seq_id)),
            on_statistics=on_statistics,
            on_exit=lambda error: report(ThreadExited(self.thread, error)),
            arriving=lambda: board.arriving,
        )
        self.thread.start()

    async def wait_loaded(self, path: str) -> LoadedModel:
        await self.loaded.wait()
        if not isinstance(self.result, LoadedModel):
            raise RuntimeError(f"could not load model {path!r}: {self.result}") from self.result
        return self.result


async def run_model_actor(
    settings: ModelSettings,
    *,
    task_status: trio.TaskStatus[ModelHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model on its own thread, report ready with a handle, serve until shutdown."""
    send: trio.MemorySendChannel[ModelMessage]
    receive: trio.MemoryReceiveChannel[ModelMessage]
    send, receive = open_mailbox()
    # The thread's reports: at most one per admitted sequence plus one exit, so this buffer is
    # bounded by admission; the thread never waits on it.
    report_send, report_receive = trio.open_memory_channel[ModelMessage](math.inf)
    token = trio.lowlevel.current_trio_token()

    def report(message: ModelMessage) -> None:  # on the generation thread
        try:
            token.run_sync_soon(_deliver, report_send, message)
        except trio.RunFinishedError:
            pass

    board = _Board()
    worker = _Worker(settings, report, board)
    loaded = await worker.wait_loaded(settings.model_path)
    handle = ModelHandle(settings, loaded, send, board)
    log.info("model %s loaded from %s", settings.alias, loaded.path)
    state = _ModelState(settings, worker, board)
    try:
        async with trio.open_nursery() as nursery, receive, report_receive:
            nursery.start_soon(_forward, report_receive, send.clone())
            task_status.started(handle)
            async for message in receive:
                if await state.apply(message, handle, report):
                    break
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not state.stopped:
                state.worker.thread.send(StopGeneration())
                with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                    await trio.to_thread.run_sync(state.worker.thread.join, abandon_on_cancel=True)


def _deliver(
    channel: trio.MemorySendChannel[ModelMessage], message: ModelMessage
) -> None:  # on the Trio thread
    try:
        channel.send_nowait(message)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the actor is gone


async def _forward(
    reports: trio.MemoryReceiveChannel[ModelMessage],
    mailbox: trio.MemorySendChannel[ModelMessage],
) -> None:
    """The thread's reports into the actor's own mailbox, in order."""
    async with mailbox:
        async for message in reports:
            await mailbox.send(message)


class _ModelState:
    """What the actor task owns (touched only by ``run_model_actor``'s loop)."""

    def __init__(self, settings: ModelSettings, worker: _Worker, board: _Board) -> None:
        self.settings = settings
        self.worker = worker
        self.board = board
        # Admitted and not yet reported ended: the command that inserted each.
        self.admitted: dict[int, InsertSequence] = {}
        self.cancelled: set[int] = set()  # of those, the ones a cancel was sent for
        self.closing = False
        self.stopped = False
        self.ids = itertools.count(1)

    def _publish(self) -> None:
        self.board.admitted = len(self.admitted)

    async def apply(
        self, message: ModelMessage, handle: ModelHandle, report: Callable[[ModelMessage], None]
    ) -> bool:
        """Apply one message; True when the actor is done."""
        match message:
            case Submit(request, reply):
                if self.closing:
                    reply.fail(ModelUnavailable("the server is shutting down"))
                elif len(self.admitted) >= self.settings.max_sequences:
                    reply.fail(
                        ModelOverloaded(
                            "the generation queue is full "
                            f"({self.settings.max_sequences} sequences)"
                        )
                    )
                else:
                    reply.send(self._admit(request, handle))
            case Cancel(seq_id):
                if seq_id in self.admitted:
                    self.cancelled.add(seq_id)
                    self.worker.thread.send(RemoveSequence(seq_id))
            case Shutdown():
                if not self.closing:
                    self.closing = True
                    self.worker.thread.send(StopGeneration())
            case SequenceEnded(seq_id):
                self.admitted.pop(seq_id, None)
                self.cancelled.discard(seq_id)
            case ThreadExited(thread, error):
                if thread is not self.worker.thread:
                    return False
                if self.closing and error is None:
                    self.stopped = True
                    self._end_all("shutdown")
                    return True
                if not isinstance(self.worker.result, LoadedModel):
                    raise RuntimeError(f"could not load the model again: {self.worker.result}")
                log.error("the generation thread died (%r); restarting it", error)
                self.worker = _Worker(self.settings, report, self.board)
                handle.restarts += 1
                self._resend()
                # Commands sent from now on queue in the new thread's inbox until it has
                # loaded; the actor keeps answering meanwhile.
            case _:
                assert_never(message)
        self._publish()
        return False

    def _admit(self, request: GenerationRequest, handle: ModelHandle) -> GenerationSequence:
        seq_id = next(self.ids)
        slot = SequenceSlot(trio.lowlevel.current_trio_token())
        command = InsertSequence(
            seq_id,
            request.prompt,
            request.max_tokens,
            request.temperature,
            request.top_p,
            slot,
            request.top_logprobs,
            request.make_processors,
            request.seed,
            request.stop_texts,
            request.owner,
            request.cache_key,
        )
        self.admitted[seq_id] = command
        self.worker.thread.send(command)
        return GenerationSequence(handle, seq_id, len(request.prompt), slot)

    def _resend(self) -> None:
        """Sequences a dead thread never took in (it reported every one it held as ended
        before it exited) go to the new thread, unless a cancel was sent for them meanwhile."""
        for seq_id, command in list(self.admitted.items()):
            if seq_id in self.cancelled:
                del self.admitted[seq_id]
                self.cancelled.discard(seq_id)
                command.slot.push(finish="cancelled")
            else:
                self.worker.thread.send(command)

    def _end_all(self, reason: FinishReason) -> None:
        """Sequences the stopped thread never reported ended end with ``reason``."""
        for command in self.admitted.values():
            command.slot.push(finish=reason)
        self.admitted.clear()
        self.cancelled.clear()
        self._publish()
