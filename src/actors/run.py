"""One response's generation: model output -> the event machine -> the log -> the store.

``ResponseRun`` drives the table of ``protocol/lifecycle.py``: it tells the table what happened
(``step``), does what the move says (feeds the event machine, sets what ``/status`` shows,
writes the records, releases the sequence), and asks it what to do next (``drive``). It has no
method per route: a warm-up, a compaction trigger, a background job's later admission and a
server tool's continuation are rows and actions of the table.

Invariants:
- A ``ResponseRun`` belongs to exactly one response task (its owner); only that task feeds its
  machine and writes its log, so numbering, pairing and the single terminal event hold by
  construction (the pure ``ResponseMachine``).
- Every way a run ends goes through ``end``: the final record goes to the response store (with
  ``store``), the turn is appended to the conversation (when there is output), then the
  terminal event is published and the log closes. A subscriber that reads the terminal event
  and then GETs the response finds it.
- Storing can fail without breaking the stream: if writing the records fails (or the store
  does not answer within ``STORE_DEADLINE_SECONDS``), the response ends ``failed`` with
  ``server_error`` instead, and that terminal event is the one published. A busy store is not a
  failed one: the deadline is for a store that does not answer at all, and a write that timed
  out (it may still land, queued in the store) is followed by the failed record, so the store
  ends agreeing with what the followers saw (a job must never tell its live followers
  ``failed`` while its record lands ``completed``).
- ``end`` is shielded and bounded, so a cancelled owner still ends its run exactly once.
- A server-run tool does not end the response: once its output is out, the run renders its
  input and output so far with the tools it loaded and admits a second sequence, which goes on
  in the same machine. The usage adds both sequences up.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, assert_never

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
    WholeItem,
)
from ..protocol.ids import new_id
from ..protocol.items.hosted_read import with_model_texts
from ..protocol.lifecycle import (
    Action,
    Feed,
    Input,
    LifecycleError,
    Move,
    Phase,
    advance,
    announced,
    next_action,
    route_of,
)
from ..protocol.objects import JsonObject, ResponseErrorCode, Usage
from ..protocol.request import CreateRequest
from ..protocol.tools.offered import FunctionTool, ToolChoice
from .admission import Admission, admit_continuation
from .event_log import EventLog
from .hosted_tools import run_call
from .output import HostedCallMade
from .pacing import answered_whole, next_linger
from .prompt import PreparedPrompt
from .run_records import write_failed, write_records
from .runtime import Actors
from .server_tools import following
from .timings import RunTimings

log = logging.getLogger(__name__)

# How long a run waits for the store's answer to its records. Long: a durable store under
# load (a commit behind other requests, a slow disk) is slow, not failed.
STORE_DEADLINE_SECONDS = 60
# How long a run waits to hand its sequence's cancel to the model actor.
RELEASE_DEADLINE_SECONDS = 5


INTERNAL_ERROR = "The server had an internal error while generating this response."


@dataclass(frozen=True, slots=True)
class Ending:
    """The counts and words of an end the table's feeds need: the finish reason, the usage
    ("counted": the run's own), the error of a ``Fail``."""

    finish: Literal["stop", "length"] = "stop"
    usage: Usage | Literal["counted"] | None = "counted"
    error: tuple[ResponseErrorCode, str] = ("server_error", INTERNAL_ERROR)


def refusal(error: ApiError) -> Ending:
    """A later compaction or render refused: ``invalid_prompt`` for a 400, no usage."""
    code: ResponseErrorCode = "invalid_prompt" if error.status == 400 else "server_error"
    return Ending(usage=None, error=(code, error.message))


# An action the table asks of a run that only its task can do (a compaction's summary).
Handler = Callable[["ResponseRun"], Awaitable[None]]


class ResponseRun:
    """The state of one response, driven by its owner task through the lifecycle table.
    Built from finished values: the prepared request and, unless it is admitted later (a
    background job's compaction, a compaction trigger), its admission."""

    def __init__(
        self,
        request: CreateRequest,
        prepared: PreparedPrompt,
        actors: Actors,
        *,
        admission: Admission | None = None,
    ) -> None:
        self.request = request
        self.prepared = prepared
        self._actors = actors
        self.route = route_of(
            generate=request.generate,
            compact_now=request.compact_now,
            admitted=admission is not None,
        )
        self.phase = Phase.PREPARING
        self._machine = ResponseMachine(
            new_id("resp"), request.config, int(time.time()), seal=request.seal
        )
        self.log = EventLog(self._machine.response_id, self._machine.snapshot, request.owner)
        self.log.input_items = prepared.all_items
        self.log.rendered = prepared.rendered  # the transport keeps it
        self.log.prompt_tokens = len(prepared.prompt)
        self._admission: Admission | None = None
        self._sequence_done = False  # the current sequence reported its finish
        self._output_tokens = 0
        self._stop_sequence: str | None = None
        self._timings = RunTimings(actors.timings)  # TTFT and tokens/s
        # Earlier sequences of this response (a server tool's continuation).
        self._prior = Usage(0, 0)
        self._prior_reasoning = ""
        # What a server tool's continuation generates with: the tools and the tool choice.
        self._continuation: tuple[tuple[FunctionTool, ...], ToolChoice] | None = None
        # A hosted call the model made that the server is to run, and what the model read
        # of each hosted call's result (by item id) for the continuations' renders.
        self._hosted_call: HostedCallMade | None = None
        self._model_texts: dict[str, str] = {}
        self._stopping = False  # the sequence was asked to stop after a hosted call
        # Events fed but not yet published (the closing events of a finished sequence's items,
        # published with the terminal event).
        self._held: list[JsonObject] = []
        self.step(Input.PREPARED)
        if admission is not None:
            self.attach(admission)

    @property
    def response_id(self) -> str:
        return self._machine.response_id

    @property
    def terminal(self) -> bool:
        """Whether its terminal input was fed (it is finishing or ended)."""
        return self.phase in (Phase.FINISHING, Phase.FAILING, Phase.ENDED)

    @property
    def admission(self) -> Admission | None:
        return self._admission

    def snapshot(self) -> JsonObject:
        return self._machine.snapshot()

    def step(self, happened: Input) -> Move:
        """Move by the table (``LifecycleError`` if it has no row); what /status shows follows."""
        move = advance(self.phase, happened)
        self.phase = move.phase
        if move.status is not None:
            self.log.status = move.status
        return move

    async def drive(self, routes: Mapping[Action, Handler] | None = None) -> None:
        """Do what the table asks next until nothing is left (the run finished or ended);
        ``routes`` handles the actions only the task can (a compaction's summary)."""
        own: Mapping[Action, Handler] = {
            Action.GENERATE: ResponseRun._generate,
            Action.PREFILL: ResponseRun._prefill,
            Action.RUN_SERVER_TOOL: ResponseRun._run_server_tool,
            Action.ADMIT_CONTINUATION: ResponseRun._admit_continuation,
        }
        while (action := next_action(self.route, self.phase)) is not None:
            handler = (routes or {}).get(action) or own.get(action)
            if handler is None:
                raise LifecycleError(f"nobody drives {action.value} of {self.response_id}")
            before = self.phase
            await handler(self)
            if self.phase is before:
                raise LifecycleError(f"{action.value} left {self.response_id} {before.value}")

    def attach(self, admission: Admission) -> None:
        """The run's sequence is admitted: generation may start."""
        self.step(Input.ADMITTED)
        self._admission = admission
        sequence = admission.sequence
        self.log.admitted(sequence.prompt_tokens, lambda: sequence.cached_tokens)

    def start(self, compaction: Compacted | None = None) -> None:
        """``in_progress`` is told (with the compaction item, if the history was compacted)."""
        move = self.step(Input.STARTED)
        if compaction is None and self._admission is not None:
            compaction = self._admission.compaction
        events = self._feed(move, Ending(), compaction)
        for item in self.prepared.hosted_items:  # MCP listings, approved calls: whole already
            events += self._machine.feed(WholeItem(item))
        self._publish(events)

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

    # -- the actions the table asks for --

    async def _generate(self) -> None:
        """Receive the admitted sequence's output until the phase leaves prefilling and
        decoding (its terminal input, or a server tool's call). Cancellable at every await."""
        if not announced(self.phase) and not self.request.config.background:
            # A foreground response is in progress from the start (OpenAI sends created and
            # in_progress at once); a background one stays queued until the model reports work.
            self.start()
        model = self._actors.model
        whole = answered_whole(self.request)
        linger = 0.0  # the first token goes out at once (a prefill's end is not one)
        while self.phase in (Phase.PREFILLING, Phase.DECODING):
            current = self._admission  # a server tool's continuation replaces it
            assert current is not None
            # A response in progress wants the first token, not the prefill's end before it
            # (waking for that would take the loop's turn on the first token's step); a
            # background one still queued starts on it.
            output = await current.sequence.receive(linger, prefill=not announced(self.phase))
            await self._apply(output)
            linger = next_linger(linger, output.new_tokens, model.decoding, whole=whole)

    async def _prefill(self) -> None:
        """A warm-up (``generate: false``): the prompt is prefilled (its sequence generates
        one token, which is not output), and the answer is a chainable response with no
        output."""
        self.start()
        admission = self._admission
        if admission is not None:
            while (await admission.sequence.receive()).finish is None:
                pass
            self._sequence_done = True
        cached = 0 if admission is None else admission.sequence.cached_tokens
        usage = Usage(len(self.prepared.prompt), 0, cached_tokens=cached)
        await self.end(Input.FINISHED, Ending(usage=usage))

    async def _run_server_tool(self) -> None:
        """Run the server tool the model called and publish its result. A tool search ran
        inside the output parser (its ``tool_search_output`` went out with its call); a
        hosted call runs here, in this task: a cancel or a hang-up cancels it, and its
        outbound request with it."""
        call, self._hosted_call = self._hosted_call, None
        if call is not None:
            hosted = self._actors.hosted
            ran = await run_call(call.tool, call.arguments, self.request, hosted)
            self._publish(self._machine.feed(ran.result))
            self._model_texts[self._machine.output_items[-1]["id"]] = ran.text
        self.step(Input.TOOL_OUTPUT)

    async def _admit_continuation(self) -> None:
        """After a server tool's result: admit the continuation; without one (no budget
        left, or it cannot be admitted) the response finishes with the tool's output."""
        admission = self._admission
        assert admission is not None
        following = await self._following()
        if following is None:
            await self.end(Input.FINISHED)
            return
        self._prior = Usage(
            self._prior.input_tokens + admission.sequence.prompt_tokens,
            0,
            cached_tokens=self._prior.cached_tokens + admission.sequence.cached_tokens,
        )
        self._prior_reasoning += admission.shaper.reasoning_text
        self.step(Input.CONTINUATION_ADMITTED)
        self._admission, self._sequence_done = following, False
        self.log.prompt_tokens = self._prior.input_tokens + following.sequence.prompt_tokens

    async def _following(self) -> Admission | None:
        """The continuation's sequence, None when it has no budget or is refused."""
        assert self._continuation is not None
        tools, choice = self._continuation
        request = self.request
        config = request.config
        if config.max_output_tokens is not None:  # the budget is the response's, not per sequence
            left = config.max_output_tokens - self._output_tokens
            if left < 1:
                return None
            config = dataclasses.replace(config, max_output_tokens=left)
        follow = dataclasses.replace(request, config=config, tools=tools, tool_choice=choice)
        output = with_model_texts(self._machine.output_items, self._model_texts)
        try:
            return await admit_continuation(follow, self.prepared, output, self._actors)
        except ApiError:
            log.info("response %s: no continuation after its server tool", self.response_id)
            return None

    # -- the model's output --

    def _publish(self, events: list[JsonObject]) -> None:
        if self._held:
            events, self._held = self._held + events, []
        self.log.append(events)

    async def _apply(self, output: SequenceOutput) -> None:
        admission = self._admission
        assert admission is not None
        working = output.prefill_done or output.text or output.finish in ("stop", "length")
        if not announced(self.phase) and working:
            self.start()
        events: list[JsonObject] = []
        for step in admission.shaper.feed(output.text, output.logprobs):
            events += self._machine.feed(step)
        self._output_tokens += output.new_tokens
        self.log.output_tokens = self._output_tokens  # the status page
        self._timings.saw(output.new_tokens, output.finish is not None)
        self._publish(events)
        if output.finish is None:
            if admission.shaper.ended_on_call and not self._stopping:
                # Nothing after a hosted call or an approval request is shown: the sequence
                # ends at the next step (its work kept for the continuation's prefix).
                self._stopping = True
                await admission.sequence.stop()
            return
        # The thread reported the finish; a detokenizer that failed on this side reports an
        # error while the sequence is still in the batch, and the release cancels it.
        self._sequence_done, self._stopping = admission.sequence.ended, False
        match output.finish:
            case "stop" | "length":
                # The items' closing events go out with the terminal event, in one write.
                for step in admission.shaper.finish():
                    self._held += self._machine.feed(step)
                self._stop_sequence = output.stop_sequence
                hosted = admission.shaper.hosted_call is not None
                if (output.finish == "stop" or hosted) and self._server_tool_called():
                    return
                await self.end(Input.FINISHED, Ending(finish=output.finish))
            case "cancelled":
                await self.end(Input.CANCELLED)
            case "shutdown":
                await self.end(Input.FAILED, Ending(error=("server_error", SHUTTING_DOWN)))
            case "error":
                await self.end(Input.FAILED, Ending(error=("server_error", MODEL_FAILED)))
            case _:
                assert_never(output.finish)

    def _server_tool_called(self) -> bool:
        """Whether the sequence stopped on a call of a tool the server runs (its call's
        closing events go out now; the continuation follows)."""
        admission = self._admission
        assert admission is not None
        hosted = admission.shaper.hosted_call
        found = following(self.request, self._machine.output_items, hosted is not None)
        if found is None:
            return False
        self._continuation, self._hosted_call = found, hosted
        self.step(Input.TOOL_CALLED)
        self._publish([])
        return True

    # -- the end --

    def _feed(
        self, move: Move, ending: Ending, compaction: Compacted | None = None
    ) -> list[JsonObject]:
        """Feed the event machine what ``move`` says, in order; the events to publish."""
        events: list[JsonObject] = []
        for feed in move.feeds:
            events += self._machine.feed(self._input(feed, ending, compaction))
        return events

    def _input(self, feed: Feed, ending: Ending, compaction: Compacted | None) -> MachineInput:
        now = int(time.time())
        match feed:
            case Feed.START:
                return Start(compaction)
            case Feed.FINISH | Feed.STEER:
                usage = self.usage() if ending.usage == "counted" else ending.usage
                assert usage is not None
                reason = ending.finish if feed is Feed.FINISH else "steered"
                return Finish(reason, usage, now)
            case Feed.CANCEL:
                return Cancel(self.usage() if self._admission is not None else None)
            case Feed.FAIL:
                code, message = ending.error
                return Fail(code, message, self._counted(ending))
            case _:
                assert_never(feed)

    def _counted(self, ending: Ending) -> Usage | None:
        if ending.usage != "counted":
            return ending.usage
        try:
            return self.usage()
        except Exception:  # the same fault that failed the run may break the counts
            return None

    async def refused(self) -> None:
        """The response was refused before it was announced (registration cancelled at
        shutdown, a job's bytes over budget): nothing is published; an admitted sequence
        leaves."""
        if self.step(Input.REFUSED).release:
            await self._release()

    async def _release(self) -> None:
        admission = self._admission
        if admission is not None and not self._sequence_done:
            with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_DEADLINE_SECONDS):
                await admission.sequence.cancel()

    async def end(self, happened: Input, ending: Ending | None = None) -> None:
        """Feed the terminal input the table names for ``happened``, write the records when
        it says so, then publish the terminal event (once: a run already ending is left)."""
        if self.terminal:
            return
        if ending is None and happened is Input.SHUTDOWN:
            ending = Ending(error=("server_error", SHUTTING_DOWN))
        ending = ending or Ending()
        move = self.step(happened)
        if move.release:
            await self._release()
        # The machine as it was, in case the records cannot be written.
        before = self._machine.fork() if move.records else None
        held, self._held = self._held, []
        closing = held + self._feed(move, ending)
        if before is not None:
            closing = await self._recorded(closing, held, before)
        self._publish(closing)
        self.step(Input.STORED)
        self.log.close(self._machine.snapshot(), self._stop_sequence)

    async def _recorded(
        self, closing: list[JsonObject], held: list[JsonObject], before: ResponseMachine
    ) -> list[JsonObject]:
        """The records written (shielded: a hang-up at this instant must not leave the store
        or the conversation half-told); the closing events to publish, a failure's if the
        store failed."""
        final, events = self._machine.snapshot(), self.log.events + tuple(closing)
        with trio.CancelScope(shield=True), trio.move_on_after(STORE_DEADLINE_SECONDS) as wait:
            try:
                await write_records(self._actors, self.request, self.prepared, final, events)
                return closing
            except Exception:
                log.exception("could not store response %s", self.response_id)
        self._machine = before
        failed = Ending(error=("server_error", "The response could not be stored."))
        closing = held + self._feed(self.step(Input.STORE_FAILED), failed)
        if wait.cancelled_caught:  # the records may still land: this one goes after
            log.error("the store did not answer for response %s", self.response_id)
            final, events = self._machine.snapshot(), self.log.events + tuple(closing)
            with trio.CancelScope(shield=True), trio.move_on_after(STORE_DEADLINE_SECONDS):
                await write_failed(self._actors, self.request, self.prepared, final, events)
        return closing


SHUTTING_DOWN = "The server is shutting down."
MODEL_FAILED = "The model failed while generating."
