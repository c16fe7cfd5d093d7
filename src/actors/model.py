"""The model actor: the single owner of the model, running continuous batching on its own thread.

Invariants:
- All MLX work happens on the ``GenerationThread`` this actor starts and joins; the Trio task
  ``run_model_actor`` only supervises it: readiness once the model is loaded, a crash of the
  thread is a crash of this task (and so of the server), and shutdown finishes every running
  sequence with ``shutdown`` before the thread stops.
- ``submit`` and ``cancel`` never block: they put a command on the thread's inbox. A cancelled
  sequence leaves the batch at the thread's next step (one decode step or one prefill chunk).
- After shutdown begins, ``submit`` raises ``ModelUnavailable``.
- ``statistics()`` returns the thread's latest immutable snapshot.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..model.constrain import Constraints, Grammar
from ..model.loader import LoadedModel, render_prompt
from ..model.prompt_bounds import measure_tokenizer, render_within
from ..model.slot import SequenceOutput, SequenceSlot
from ..model.stream_parse import ToolFormat, reasoning_opens_in_prompt
from ..model.thread import (
    CrashForTest,
    GenerationThread,
    InsertSequence,
    ModelStatistics,
    RemoveSequence,
    StopGeneration,
    ThreadSettings,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0


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


@dataclass(frozen=True, slots=True)
class ModelInfo:
    alias: str
    path: str
    context_window: int
    tool_format: ToolFormat = "none"
    has_thinking: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Sender: the response actor. A rendered prompt and its sampling settings."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int | None = None
    seed: int | None = None
    # Called on the generation thread to build this sequence's logits processors.
    make_processors: Callable[[], list[Any]] | None = None


class GenerationSequence:
    """A response actor's view of its sequence in the batch."""

    def __init__(self, handle: ModelHandle, seq_id: int, prompt_tokens: int, slot: SequenceSlot):
        self.seq_id = seq_id
        self.prompt_tokens = prompt_tokens
        self._handle = handle
        self._slot = slot
        self._done = False

    async def receive(self) -> SequenceOutput:
        """The next coalesced output; ``trio.EndOfChannel`` after the finish was received."""
        out = await self._slot.receive()
        if out.finish is not None:
            self._done = True
            self._handle._release(self.seq_id)
        return out

    def cancel(self) -> None:
        """Remove the sequence from the batch (no-op once finished). Never blocks."""
        if not self._done:
            self._done = True
            self._handle.cancel(self.seq_id)


class ModelHandle:
    """The typed handle other actors use to reach the model actor."""

    def __init__(self, settings: ModelSettings, loaded: LoadedModel, thread: GenerationThread):
        self.info = ModelInfo(
            settings.alias,
            loaded.path,
            settings.context_size or loaded.context_window,
            loaded.tool_format,
            loaded.has_thinking,
        )
        self.constraints = loaded.constraints
        self._settings = settings
        self._tokenizer = loaded.tokenizer
        self._bound = measure_tokenizer(loaded.tokenizer)
        self._thread = thread
        self._ids = itertools.count(1)
        self._admitted: set[int] = set()
        self._closing = False
        self._trio_token = trio.lowlevel.current_trio_token()
        self.restarts = 0

    def statistics(self) -> ModelStatistics:
        return self._thread.statistics

    async def render(
        self,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Apply the chat template and tokenize on a worker thread (tokenizer only, no MLX).
        With ``max_tokens``, a prompt provably longer raises ``PromptTooLong`` untokenized."""
        if max_tokens is not None:  # issue 17: cheap refusals (model/prompt_bounds.py)
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

    def submit(self, request: GenerationRequest) -> GenerationSequence:
        if self._closing:
            raise ModelUnavailable("the server is shutting down")
        if len(self._admitted) >= self._settings.max_sequences:
            raise ModelOverloaded(
                f"the generation queue is full ({self._settings.max_sequences} sequences)"
            )
        seq_id = next(self._ids)
        slot = SequenceSlot(self._trio_token)
        self._admitted.add(seq_id)
        self._thread.send(
            InsertSequence(
                seq_id,
                request.prompt,
                request.max_tokens,
                request.temperature,
                request.top_p,
                slot,
                request.top_logprobs,
                request.make_processors,
                request.seed,
            )
        )
        return GenerationSequence(self, seq_id, len(request.prompt), slot)

    def cancel(self, seq_id: int) -> None:
        if seq_id in self._admitted:
            self._release(seq_id)
            self._thread.send(RemoveSequence(seq_id))

    def _release(self, seq_id: int) -> None:
        self._admitted.discard(seq_id)

    def shutdown(self) -> None:
        """Refuse new sequences; finish running ones with ``shutdown``; stop the thread."""
        if not self._closing:
            self._closing = True
            self._thread.send(StopGeneration())

    def crash_for_test(self) -> None:
        """Test hook: make the generation thread die at its next step."""
        self._thread.send(CrashForTest())

    async def wait_idle(self) -> None:
        """Wait until the batch holds no sequence (used by tests and the benchmark)."""
        # Polled: the snapshot is published by the generation thread, not by a Trio task.
        while self.statistics().active:  # noqa: ASYNC110
            await trio.sleep(0.001)


class _Worker:
    """One generation thread and the Trio events that report its load and its exit."""

    def __init__(self, settings: ModelSettings, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self.loaded = trio.Event()
        self.exited = trio.Event()
        self.result: LoadedModel | BaseException | None = None
        self.error: BaseException | None = None
        self.thread = GenerationThread(
            ThreadSettings(
                settings.model_path,
                prefill_step_size=settings.prefill_step_size,
                completion_batch_size=settings.completion_batch_size,
                prefill_batch_size=settings.prefill_batch_size,
            ),
            on_loaded=self._on_loaded,
            on_exit=self._on_exit,
        )
        self.thread.start()

    def _on_loaded(self, loaded: LoadedModel | None, error: BaseException | None) -> None:
        self.result = loaded if loaded is not None else error or RuntimeError("load failed")
        self._token.run_sync_soon(self.loaded.set)

    def _on_exit(self, error: BaseException | None) -> None:
        self.error = error
        try:
            self._token.run_sync_soon(self.exited.set)
        except trio.RunFinishedError:
            pass

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
    """Load the model on its own thread, report ready with a handle, supervise until cancelled.

    If the generation thread dies while the server lives, its sequences have already ended
    with ``error`` (their responses fail with ``server_error``); a new thread is started and
    loads the model again, and the handle sends to it from then on: the server keeps serving.
    """
    token = trio.lowlevel.current_trio_token()
    worker = _Worker(settings, token)
    handle: ModelHandle | None = None
    try:
        loaded = await worker.wait_loaded(settings.model_path)
        handle = ModelHandle(settings, loaded, worker.thread)
        log.info("model %s loaded from %s", settings.alias, loaded.path)
        task_status.started(handle)
        while True:
            await worker.exited.wait()
            if handle._closing and worker.error is None:
                return
            log.error("the generation thread died (%r); restarting it", worker.error)
            worker = _Worker(settings, token)
            # Commands sent from now on queue in the new thread's inbox until it has loaded.
            handle._thread = worker.thread
            handle.restarts += 1
            await worker.wait_loaded(settings.model_path)
    finally:
        with trio.CancelScope(shield=True):
            if handle is not None:
                handle.shutdown()
            else:
                worker.thread.send(StopGeneration())
            with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                await worker.exited.wait()
