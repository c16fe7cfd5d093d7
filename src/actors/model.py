"""The model actor: the single owner of the model, running continuous batching on its own thread.

Invariants:
- All MLX work happens on the ``GenerationThread`` this actor starts and joins. This task owns
  the thread, admission and the closing flag; others reach them only by message (``submit``,
  ``cancel``, ``shutdown``), and the thread reports back by message (a sequence ended, it
  exited), so every change of admission happens here, in one task.
- Admission: at most ``max_sequences`` sequences are admitted; one is released when the thread
  reports that it ended, however it ended, never by its consumer. ``submit`` refuses with
  ``ModelOverloaded`` beyond that and with ``ModelUnavailable`` once shutdown began.
- The thread's port (``model/thread.py``): this actor is the only sender of its inbound stream
  (``Admit``, carrying how many requests are still on their way, ``Cancel``, ``StopMatched``,
  ``Shutdown``; ``Arrivals`` from ``ModelHandle.arriving``, on the Trio thread too) and the only reader of its ``FactStream``, whose facts a forwarding task
  puts in this actor's mailbox. A cancel leaves the batch at the thread's next step.
- If the thread dies while the server lives, the sequences it held end with ``error``; those
  it had not taken in yet go to a new thread, which loads the model again: the server keeps
  serving. Except when the model is split over several ranks: a rank that is gone
  cannot be rejoined, so the sequences end with ``error`` and ``failed`` says why: the server
  stops (``server.py``) and exits non-zero.
- ``statistics()`` returns the thread's latest immutable snapshot, with ``admitted`` from here.
- What Trio tasks count for the thread (``_Engine``: admitted, arriving, the current worker) is
  touched only on the Trio thread; the generation thread learns of it by message.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import assert_never

import trio

from .. import formats
from ..engine.port import (
    Admit,
    BatchFact,
    DeviceFacts,
    Ended,
    Exited,
    FinishReason,
    ImageError,
    Loaded,
    LoadedModel,
    ModelStatistics,
    SequenceSlot,
    StopMatched,
    choose_sizes,
)
from ..engine.port import Cancel as CancelSequence
from ..engine.port import Shutdown as StopGeneration
from ..protocol.errors import invalid_request
from ..text.prompt_maker import ModelInfo, ModelPrompt, PromptMaker
from .kit import Reply, ask, open_mailbox
from .model_port import Arrival, _Engine, _Worker, size_flags
from .model_types import (
    GenerationRequest,
    GenerationSequence,
    ModelOverloaded,
    ModelSettings,
    ModelUnavailable,
    ThreadFactory,
)

__all__ = [
    "Arrival",
    "GenerationRequest",
    "GenerationSequence",
    "ModelHandle",
    "ModelInfo",
    "ModelOverloaded",
    "ModelPrompt",
    "ModelSettings",
    "ModelUnavailable",
    "ThreadFactory",
    "run_model_actor",
]

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0

# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """Sender: a response task. Admit a sequence, or refuse. ``arrival``: the request's count
    as on its way (``ModelHandle.arriving``), done as its ``Admit`` goes to the thread, so an
    idle batch does not wait on it."""

    request: GenerationRequest
    reply: Reply[GenerationSequence]
    arrival: Arrival | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Sender: a response task (its cancel or its cleanup). Remove a sequence from the batch."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Sender: a response task that found its sequence's end in the output. End it with
    ``stop`` at the next step, keeping what it computed in the prompt cache."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Sender: the root at shutdown. Refuse new sequences; finish running ones; stop."""


@dataclass(frozen=True, slots=True)
class FromThread:
    """Sender: a worker's forwarding task. A fact of that worker's generation thread."""

    worker: _Worker
    fact: BatchFact


ModelMessage = Submit | Cancel | Stop | Shutdown | FromThread


class ModelHandle:
    """The typed handle other actors use to reach the model actor."""

    prompts: PromptMaker  # the text side: template, tokenizer, grammar (the caller's task)

    def __init__(
        self,
        settings: ModelSettings,
        loaded: LoadedModel,
        mailbox: trio.MemorySendChannel[ModelMessage],
        engine: _Engine,
    ):
        fmt = formats.get(settings.tool_format or loaded.tool_format)
        self.info = ModelInfo(
            settings.alias,
            loaded.path,
            settings.context_size or loaded.context_window,
            fmt.name,
            loaded.has_thinking or fmt.reasons,
            loaded.input_modalities,
        )
        self.prompts = PromptMaker(self.info, loaded)
        self.vision = loaded.vision  # a vision model's image side (None: text-only)
        self.blas = loaded.blas  # the OpenBLAS thread count set at load (None: not used)
        self.device = loaded.device  # MLX's device in words, asked at load on the MLX thread
        # The batch's sizes and their sources (flags, else the device's), chosen at load (a
        # stand-in thread that reports none: the CPU's, which is where tests run one).
        self.sizes = loaded.sizes or choose_sizes(size_flags(settings), DeviceFacts("cpu"))
        self._mailbox = mailbox
        self._engine = engine
        self.restarts = 0
        self.topology = loaded.topology  # the ranks (None: one process)
        # Set with ``fatal`` when a sharded model stopped for good.
        self.failed = trio.Event()
        self.fatal: str | None = None

    def statistics(self) -> ModelStatistics:
        return replace(self._engine.latest(), admitted=self._engine.admitted)

    @contextlib.contextmanager
    def arriving(self, counted: Arrival | None = None) -> Iterator[Arrival]:
        """Count a request as on its way to the model while the block runs (preparing its
        prompt, up to its ``submit``), or until the block calls ``done`` on it: an idle batch
        that gets a sequence waits briefly for the requests counted here, so that a burst is
        prefilled together (``thread.gather_bound``). A request its transport already
        counted (``counted``, as it opened the response: ``http.pipeline.open_response``) is
        not counted again: the block ends that count."""
        arrival = Arrival(self._engine) if counted is None else counted
        try:
            yield arrival
        finally:
            arrival.done()

    @property
    def decoding(self) -> int:
        """Sequences decoding at the latest step (cheap: read per output by every run)."""
        return self._engine.latest().decoding

    async def submit(
        self, request: GenerationRequest, arrival: Arrival | None = None
    ) -> GenerationSequence:
        """Admit ``request``; raises ``ModelOverloaded`` or ``ModelUnavailable`` (or a 400
        when an image of its prompt is no longer held). ``arrival``: the request's count as
        on its way, done as its sequence goes to the thread."""
        vision = self.vision
        if vision is not None and not request.images and min(request.prompt, default=0) < 0:
            # Its images travel in its Admit (the generation thread reads no shared registry).
            try:
                request = replace(request, images=vision.images_for(request.prompt))
            except ImageError as exc:
                raise invalid_request(f"Invalid image: {exc}", "input") from None
        try:
            # A task cancelled while the actor admits (its client left) cancels the sequence
            # it was answered late: unread, it would generate to its end holding an admission.
            return await ask(
                self._mailbox,
                lambda reply: Submit(request, reply, arrival),
                undo=_cancel_sequence,
            )
        except RuntimeError as exc:
            if isinstance(exc, ModelOverloaded | ModelUnavailable):
                raise
            raise ModelUnavailable("the model has stopped") from exc

    async def cancel(self, seq_id: int) -> None:
        try:
            await self._mailbox.send(Cancel(seq_id))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the actor is gone and so is its batch

    async def stop(self, seq_id: int) -> None:
        """End a sequence with ``stop`` at the next step (``GenerationSequence.stop``)."""
        try:
            await self._mailbox.send(Stop(seq_id))
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
        while self.statistics().active or self._engine.admitted:  # noqa: ASYNC110
            await trio.sleep(0.001)


async def _cancel_sequence(sequence: GenerationSequence) -> None:
    await sequence.cancel()


async def run_model_actor(
    settings: ModelSettings,
    *,
    task_status: trio.TaskStatus[ModelHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model on its own thread, report ready with a handle, serve until shutdown."""
    send: trio.MemorySendChannel[ModelMessage]
    receive: trio.MemoryReceiveChannel[ModelMessage]
    send, receive = open_mailbox()
    worker = _Worker(settings)
    try:
        loaded = await worker.wait_loaded(settings.model_path)
    except BaseException:  # not loaded, or cancelled while loading: it must not serve on
        worker.thread.send(StopGeneration())
        with trio.CancelScope(shield=True):
            with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                await trio.to_thread.run_sync(worker.thread.join, abandon_on_cancel=True)
        raise
    engine = _Engine(worker)
    handle = ModelHandle(settings, loaded, send, engine)
    log.info("model %s loaded from %s", settings.alias, loaded.path)
    state = _ModelState(settings, engine)
    try:
        async with trio.open_nursery() as nursery, receive:
            state.nursery = nursery
            nursery.start_soon(worker.forward, send.clone(), FromThread)
            task_status.started(handle)
            async for message in receive:
                if await state.apply(message, handle, send):
                    break
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not state.stopped:
                engine.send(StopGeneration())
                with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                    await trio.to_thread.run_sync(engine.worker.thread.join, abandon_on_cancel=True)


class _ModelState:
    """What the actor task owns (touched only by ``run_model_actor``'s loop)."""

    def __init__(self, settings: ModelSettings, engine: _Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.nursery: trio.Nursery | None = None
        # Admitted and not yet reported ended: the message that admitted each.
        self.admitted: dict[int, Admit] = {}
        self.cancelled: set[int] = set()  # of those, the ones a cancel was sent for
        self.closing = False
        self.stopped = False
        self.ids = itertools.count(1)

    def _publish(self) -> None:
        self.engine.admitted = len(self.admitted)

    async def apply(
        self,
        message: ModelMessage,
        handle: ModelHandle,
        mailbox: trio.MemorySendChannel[ModelMessage],
    ) -> bool:
        """Apply one message; True when the actor is done."""
        match message:
            case Submit(request, reply, arrival):
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
                    if arrival is not None:  # no longer on its way: its Admit follows
                        arrival.admitted()
                    reply.send(self._admit(request, handle))
            case Cancel(seq_id):
                if seq_id in self.admitted:
                    self.cancelled.add(seq_id)
                    self.engine.send(CancelSequence(seq_id))
            case Stop(seq_id):
                if seq_id in self.admitted:
                    self.engine.send(StopMatched(seq_id))
            case Shutdown():
                if not self.closing:
                    self.closing = True
                    self.engine.send(StopGeneration())
            case FromThread(worker, fact):
                if worker is not self.engine.worker:
                    return False
                return self._from_thread(fact, handle, mailbox)
            case _:
                assert_never(message)
        self._publish()
        return False

    def _from_thread(
        self,
        fact: BatchFact,
        handle: ModelHandle,
        mailbox: trio.MemorySendChannel[ModelMessage],
    ) -> bool:
        worker = self.engine.worker
        match fact:
            case Loaded(loaded, error):
                worker.loaded = loaded is not None
                if loaded is None:
                    log.error("the restarted generation thread could not load: %r", error)
            case Ended(seq_ids):
                for seq_id in seq_ids:
                    self.admitted.pop(seq_id, None)
                    self.cancelled.discard(seq_id)
            case Exited(error):
                if self.closing and error is None:
                    self.stopped = True
                    self._end_all("shutdown")
                    return True
                if self.settings.sharding is not None:
                    log.critical("the sharded model stopped: %s", error)
                    self._end_all("error")
                    self.stopped = True
                    handle.fatal = str(error) or repr(error)
                    handle.failed.set()
                    return True
                if not worker.loaded:
                    raise RuntimeError(f"could not load the model again: {error}")
                log.error("the generation thread died (%r); restarting it", error)
                self.engine.worker = worker = _Worker(self.settings)
                assert self.nursery is not None
                self.nursery.start_soon(worker.forward, mailbox.clone(), FromThread)
                handle.restarts += 1
                self.engine.tell_arriving()
                self._resend()
                # Messages sent from now on queue in the new thread's inbox until it has
                # loaded; the actor keeps answering meanwhile.
            case _:
                assert_never(fact)
        self._publish()
        return False

    def _admit(self, request: GenerationRequest, handle: ModelHandle) -> GenerationSequence:
        seq_id = next(self.ids)
        slot = SequenceSlot(trio.lowlevel.current_trio_token())
        message = Admit(seq_id, request, slot, arriving=self.engine.admitting())
        self.admitted[seq_id] = message
        self.engine.send(message)
        return GenerationSequence(handle, seq_id, len(request.prompt), slot)

    def _resend(self) -> None:
        """Sequences a dead thread never took in (it reported every one it held as ended
        before it exited) go to the new thread, unless a cancel was sent for them meanwhile."""
        for seq_id, message in list(self.admitted.items()):
            if seq_id in self.cancelled:
                del self.admitted[seq_id]
                self.cancelled.discard(seq_id)
                if message.output is not None:
                    message.output.push(finish="cancelled")
            else:
                self.engine.send(message)

    def _end_all(self, reason: FinishReason) -> None:
        """Sequences the stopped thread never reported ended end with ``reason``."""
        for message in self.admitted.values():
            if message.output is not None:
                message.output.push(finish=reason)
        self.admitted.clear()
        self.cancelled.clear()
        self._publish()
