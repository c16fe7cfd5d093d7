"""One response's generation: model output -> the event machine -> the log -> the store.

Invariants:
- A ``ResponseRun`` belongs to exactly one response task (its owner); only that task feeds its
  machine and writes its log, so numbering, pairing and the single terminal event hold by
  construction (the pure ``ResponseMachine``).
- Every way a run ends goes through ``_end``: the final record goes to the response store (with
  ``store``), the turn is appended to the conversation (when there is output), then the
  terminal event is published and the log closes. A subscriber that reads the terminal event
  and then GETs the response finds it.
- Storing can fail without breaking the stream: if writing the records fails (or the store
  does not answer within ``STORE_DEADLINE_SECONDS``), the response ends ``failed`` with
  ``server_error`` instead, and that terminal event is the one published. A busy store is not a
  failed one: the deadline is for a store that does not answer at all, and a write that timed
  out (it may still land, queued in the store) is followed by the failed record, so the store
  ends agreeing with what the followers saw (issue 25: a job once told its live followers
  ``failed`` while its record landed ``completed``).
- ``_end`` is shielded and bounded, so a cancelled owner still ends its run exactly once.
- The run's ``phase`` (``protocol/phase.py``) is the one record of where the response is:
  waiting for admission, prefilling, decoding (``in_progress`` told), finishing (the terminal
  input is in the machine, the records are being written), ended. It moves only by the table.
- A server-executed tool search (issue 13) does not end the response: once its
  ``tool_search_output`` is out, the run renders its input and output so far with the loaded
  tools and admits a second sequence, which goes on in the same machine (``_continue``). The
  usage adds both sequences up.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import assert_never

import trio

from ..engine.port import SequenceOutput
from ..protocol.errors import ApiError
from ..protocol.events.machine import (
    Cancel,
    Compacted,
    Fail,
    Finish,
    MachineInput,
    ResponseMachine,
    Start,
)
from ..protocol.events.phase import Phase, Step, advance, announced
from ..protocol.events.replay import FAILED_UNSTARTED
from ..protocol.ids import new_id
from ..protocol.objects import JsonObject, Usage
from ..protocol.request import CreateRequest
from ..protocol.tools.search import after_server_search
from ..storage.interface import StoredResponse
from .admission import Admission, admit_continuation
from .event_log import EventLog
from .prompt import PreparedPrompt
from .runtime import Actors
from .timings import RunTimings

log = logging.getLogger(__name__)

# How long a run waits for the store's answer to its records. Long: a durable store under
# load (a commit behind other requests, a slow disk) is slow, not failed.
STORE_DEADLINE_SECONDS = 60
# How long a run waits to hand its sequence's cancel to the model actor.
RELEASE_DEADLINE_SECONDS = 5


# Issue 12: the server's own work per event (the machine, the log, encoding, one transport
# write and one client read per delta) competes with the generation thread for the GIL and
# the cores, most when the engine is fast. A run that lets its sequence's tokens pile up
# between receives turns many one-token deltas into fewer, fuller ones: the same text and
# logprobs, in order. A delta waits at most ``delta_interval`` (the first one and the finish
# not at all), which grows with the sequences decoding; on a model slower than that per step
# nothing changes (each receive has one step's token anyway). The generation thread never
# waits on it. Runs linger to the same ticks of one clock (``SequenceSlot.receive``), so all
# the streams' deltas of a tick go out in one pass of the event loop. Session 5 measured the
# slope (A/B, 16 streams, 10M model): 15 ms per stream gave the engine ~4 % more of the cores
# than 5 ms did; a stream of 16 still gets four deltas a second.
BASE_INTERVAL_SECONDS = 0.01
INTERVAL_PER_STREAM_SECONDS = 0.015
MAX_INTERVAL_SECONDS = 0.25


def delta_interval(decoding: int) -> float:
    """How long a run lets output pile up while ``decoding`` sequences run."""
    return min(MAX_INTERVAL_SECONDS, BASE_INTERVAL_SECONDS + INTERVAL_PER_STREAM_SECONDS * decoding)


class ResponseRun:
    """The state of one response; driven by its owner task with ``generate`` and the ends.
    Built from finished values: the prepared request and, unless it is admitted later (a
    background job's compaction), its admission."""

    def __init__(
        self,
        request: CreateRequest,
        prepared: PreparedPrompt,
        actors: Actors,
        *,
        admission: Admission | None = None,
    ) -> None:
        self.phase = advance(Phase.PREPARING, Step.PREPARED)
        if admission is not None:
            self.phase = advance(self.phase, Step.ADMITTED)
        self.request = request
        self.prepared = prepared
        self._actors = actors
        self._machine = ResponseMachine(
            new_id("resp"), request.config, int(time.time()), seal=request.seal
        )
        self.log = EventLog(self._machine.response_id, self._machine.snapshot, request.owner)
        self.log.input_items = prepared.all_items
        self.log.rendered = prepared.rendered  # issue 14: the transport keeps it
        self.log.prompt_tokens = len(prepared.prompt)
        if admission is not None:  # issue 12: message_start reads its cache hit
            sequence = admission.sequence
            self.log.admitted(sequence.prompt_tokens, lambda: sequence.cached_tokens)
        self._admission = admission
        self._output_tokens = 0
        self._stop_sequence: str | None = None
        self._timings = RunTimings(actors.timings)  # issue 16: TTFT and tokens/s
        # Earlier sequences of this response (a server tool search's continuation, issue 13).
        self._prior = Usage(0, 0)
        self._prior_reasoning = ""
        # Events fed but not yet published (the closing events of a finished sequence's items,
        # published with the terminal event).
        self._held: list[JsonObject] = []

    @property
    def response_id(self) -> str:
        return self._machine.response_id

    @property
    def terminal(self) -> bool:
        return self._machine.terminal

    async def persist_job(self) -> None:
        """Issue 15: a stored background job is written to the store as it starts (its queued
        object and input), and stays there until its record is put; a restart in between ends
        it ``failed`` instead of leaving it queued forever. Never raises: a job whose row could
        not be written still runs (a restart then forgets it)."""
        store = self._actors.store
        if not (self.request.config.store and store.enabled):
            return
        queued = StoredResponse(self.snapshot(), self.prepared.all_items, (), self.request.owner)
        try:
            await store.job_started(queued)
        except Exception:
            log.exception("could not record background job %s", self.response_id)

    def snapshot(self) -> JsonObject:
        return self._machine.snapshot()

    def attach(self, admission: Admission) -> None:
        """The run's sequence is admitted: generation may start."""
        self.phase = advance(self.phase, Step.ADMITTED)
        self._admission = admission
        sequence = admission.sequence
        self.log.admitted(sequence.prompt_tokens, lambda: sequence.cached_tokens)  # issue 12

    @property
    def admission(self) -> Admission | None:
        return self._admission

    def usage(self) -> Usage:
        """Token counts so far (final once the terminal event was sent)."""
        admission = self._admission
        if admission is None:
            return Usage(0, 0)
        reasoning = self._actors.model.prompts.count_tokens(
            self._prior_reasoning + admission.shaper.reasoning_text
        )
        return Usage(
            input_tokens=self._prior.input_tokens + admission.sequence.prompt_tokens,
            cached_tokens=self._prior.cached_tokens + admission.sequence.cached_tokens,
            output_tokens=self._output_tokens,
            reasoning_tokens=min(reasoning, self._output_tokens),
        )

    async def generate(self) -> None:
        """Run the admitted sequence to the terminal event (cancellable at every await)."""
        admission = self._admission
        assert admission is not None
        if not announced(self.phase) and not self.request.config.background:
            # A foreground response is in progress from the start (OpenAI sends created and
            # in_progress at once); a background one stays queued until the model reports work.
            self._start()
        model = self._actors.model
        linger = 0.0  # the first output goes out at once
        while not self._machine.terminal:
            current = self._admission  # a tool search's continuation replaces it
            assert current is not None
            await self._apply(await current.sequence.receive(linger))
            linger = delta_interval(model.decoding)

    def _start(self) -> None:
        self.phase = advance(self.phase, Step.STARTED)
        self.log.status = "in_progress"  # issue 16: the status page
        compaction = self._admission.compaction if self._admission is not None else None
        self._publish(self._machine.feed(Start(compaction)))

    def _publish(self, events: list[JsonObject]) -> None:
        if self._held:
            events, self._held = self._held + events, []
        self.log.append(events)

    async def _apply(self, output: SequenceOutput) -> None:
        admission = self._admission
        assert admission is not None
        working = output.prefill_done or output.text or output.finish in ("stop", "length")
        if not announced(self.phase) and working:
            self._start()
        events: list[JsonObject] = []
        for step in admission.shaper.feed(output.text, output.logprobs):
            events += self._machine.feed(step)
        self._output_tokens += output.new_tokens
        self.log.output_tokens = self._output_tokens  # issue 16: the status page
        self._timings.saw(output.new_tokens, output.finish is not None)
        self._publish(events)
        if output.finish is None:
            return
        terminal: MachineInput
        match output.finish:
            case "stop" | "length":
                # The items' closing events go out with the terminal event, in one write.
                for step in admission.shaper.finish():
                    self._held += self._machine.feed(step)
                if output.finish == "stop" and await self._continue():
                    self._publish([])
                    return
                self._stop_sequence = output.stop_sequence
                terminal = Finish(output.finish, self.usage(), int(time.time()))
            case "cancelled":
                terminal = Cancel(self.usage())
            case "shutdown":
                terminal = Fail("server_error", "The server is shutting down.", self.usage())
            case "error":
                terminal = Fail("server_error", "The model failed while generating.", self.usage())
            case _:
                assert_never(output.finish)
        await self.end(terminal)

    async def _continue(self) -> bool:
        """After a server tool search: admit the continuation; False when there is none (or
        it cannot be admitted: the response then ends with the search)."""
        admission = self._admission
        assert admission is not None
        request = self.request
        output = self._machine.output_items
        nxt = after_server_search(request.tools, request.tool_choice, output)
        if nxt is None:
            return False
        tools, choice = nxt
        config = request.config
        if config.max_output_tokens is not None:  # the budget is the response's, not per sequence
            left = config.max_output_tokens - self._output_tokens
            if left < 1:
                return False
            config = dataclasses.replace(config, max_output_tokens=left)
        follow = dataclasses.replace(request, config=config, tools=tools, tool_choice=choice)
        try:
            following = await admit_continuation(follow, self.prepared, tuple(output), self._actors)
        except ApiError:
            log.info("response %s: no continuation after its tool search", self.response_id)
            return False
        self._prior = Usage(
            self._prior.input_tokens + admission.sequence.prompt_tokens,
            0,
            cached_tokens=self._prior.cached_tokens + admission.sequence.cached_tokens,
        )
        self._prior_reasoning += admission.shaper.reasoning_text
        self.phase = advance(self.phase, Step.ADMITTED)
        self._admission = following
        self.log.prompt_tokens = self._prior.input_tokens + following.sequence.prompt_tokens
        return True

    async def warm_up(self) -> None:
        """A warm-up (``generate: false``): the prompt is prefilled (its sequence generates
        one token, which is not output), and the answer is a chainable response with no
        output."""
        self._start()
        admission = self._admission
        if admission is not None:
            while (await admission.sequence.receive()).finish is None:
                pass
        cached = 0 if admission is None else admission.sequence.cached_tokens
        usage = Usage(len(self.prepared.prompt), 0, cached_tokens=cached)
        await self.end(Finish("stop", usage, int(time.time())))

    async def finish_compacted(self, step: Compacted, usage: Usage) -> None:
        """A ``compaction_trigger`` (issue 28): the compaction item is the whole output; the
        usage is the summary's."""
        self.phase = advance(self.phase, Step.STARTED)
        self.log.status = "in_progress"
        self._publish(self._machine.feed(Start(step)))
        await self.end(Finish("stop", usage, int(time.time())))

    async def end_steered(self) -> None:
        """Steering input arrived for a continuation: stop here, ``incomplete`` / ``steered``."""
        await self._release()
        if not announced(self.phase):
            self._start()
        await self.end(Finish("steered", self.usage(), int(time.time())))

    async def end_cancelled(self, *, record: bool) -> None:
        """End a run whose owner was cancelled: the sequence leaves the batch at the next step,
        the terminal is ``response.cancelled``; stored only when ``record`` (the cancel
        endpoint, a background job), not when the client hung up."""
        await self._release()
        await self.end(Cancel(self.usage() if self._admission else None), record=record)

    async def end_failed(self, message: str) -> None:
        """End a run whose owner hit an unexpected error: ``failed`` / ``server_error``."""
        await self._release()
        try:
            usage: Usage | None = self.usage()
        except Exception:  # the same fault may break the counts
            usage = None
        await self.end(Fail("server_error", message, usage))

    async def refused(self) -> None:
        """The response was refused before it existed (registration cancelled at shutdown,
        a job's bytes over budget): nothing is published; an admitted sequence leaves."""
        self.phase = advance(self.phase, Step.REFUSED)
        await self._release()

    async def _release(self) -> None:
        admission = self._admission
        if admission is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_DEADLINE_SECONDS):
                await admission.sequence.cancel()

    async def end(self, terminal: MachineInput, *, record: bool = True) -> None:
        """Publish the terminal event after the records are written (once)."""
        if self._machine.terminal:
            return
        self.phase = advance(self.phase, Step.TERMINAL)
        # The machine as it was, in case the records cannot be written.
        before = self._machine.fork() if record else None
        held, self._held = self._held, []
        closing = held + self._machine.feed(terminal)
        if record:
            # Shielded: a hang-up at this instant must not leave the store or the
            # conversation half-told.
            written = False
            with trio.CancelScope(shield=True), trio.move_on_after(STORE_DEADLINE_SECONDS) as wait:
                try:
                    await self._finish_records(closing)
                    written = True
                except Exception:
                    log.exception("could not store response %s", self.response_id)
            if not written and before is not None:
                self._machine = before
                usage = self.usage()
                closing = held + self._machine.feed(
                    Fail("server_error", "The response could not be stored.", usage)
                )
                if wait.cancelled_caught:  # the records may still land: this one goes after
                    log.error("the store did not answer for response %s", self.response_id)
                    await self._store_failed(closing)
        self._publish(closing)
        self.phase = advance(self.phase, Step.CLOSED)
        self.log.close(self._machine.snapshot(), self._stop_sequence)

    async def _finish_records(self, closing: list[JsonObject]) -> None:
        final = self._machine.snapshot()
        config = self.request.config
        actors = self._actors
        if config.store and actors.store.enabled:
            record = StoredResponse(
                final, self.prepared.all_items, self.log.events + tuple(closing), self.request.owner
            )
            await actors.store.put(record)
            if config.background and await actors.store.get(record.id, record.owner) is None:
                # Spec 000: a job whose final object alone exceeds the byte budget still
                # leaves an answer for its pollers.
                await actors.store.put(self._too_large(final, record.owner))
        output = final.get("output") or []
        finished = final["status"] in ("completed", "incomplete")
        if finished and actors.echo is not None:
            await actors.echo.remember(self.request.owner, output)
        if config.conversation_id is not None and output and finished:
            await actors.conversations.append(
                config.conversation_id, self.prepared.new_items + tuple(output), self.request.owner
            )

    async def _store_failed(self, closing: list[JsonObject]) -> None:
        """After a write that timed out: the failed record, queued behind it in the store."""
        config, store = self.request.config, self._actors.store
        if not (config.store and store.enabled):
            return
        record = StoredResponse(
            self._machine.snapshot(),
            self.prepared.all_items,
            self.log.events + tuple(closing),
            self.request.owner,
        )
        with trio.CancelScope(shield=True), trio.move_on_after(STORE_DEADLINE_SECONDS):
            try:
                await store.put(record)
            except Exception:
                log.exception("could not store failed response %s", self.response_id)

    def _too_large(self, final: JsonObject, owner: str) -> StoredResponse:
        failed = {
            **final,
            "status": "failed",
            "output": [],
            "completed_at": None,
            "incomplete_details": None,
            "error": {
                "code": "server_error",
                "message": "The response finished but its final object is larger than the "
                "response store's byte budget (--responses-store-max-bytes).",
            },
        }
        # Issue 15: replayed by the event machine as created, queued, failed (one Fail).
        return StoredResponse(failed, self.prepared.all_items, (), owner, FAILED_UNSTARTED)
