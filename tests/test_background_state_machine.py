"""A Hypothesis state machine over the HTTP API: background jobs, polls, cancels, deletes, streams
and chains against one real server per run, checked against the API's promises.

The server runs in its own thread under its own ``trio.run`` (pytest-trio fixtures do not mix
with ``RuleBasedStateMachine``); the rules drive it with the synchronous ``httpx2.Client``.
Every request has a timeout and every wait loop a time limit. Rules pick jobs by a plain
integer (see ``BackgroundMachine.pick``) and accept both outcomes of a real race (a job that
finishes while a cancel, delete or chain is on its way), but then require the rest of the API to
agree with the outcome.

Invariants, checked after every step by polling every known id, and at teardown:
- every job reaches exactly one terminal status: once a poll, stream, cancel or delete has seen
  it terminal, every later answer reports the same status; statuses never go back
  (``queued`` -> ``in_progress`` -> terminal); nothing ends ``failed`` here;
- only the cancel endpoint stops a job: ``cancelled`` only after a cancel request (dropping a
  stream of the job changes nothing);
- polls never expose partial output: until terminal, ``output == []`` and usage is all zeros;
- a background object carries ``"background": true``, a foreground one has no such key;
- cancel of a finished response is 400 ``response_not_cancellable``; DELETE of an unfinished
  job is 400; deleted ids are 404 everywhere; a finished ``store: false`` job stays readable
  until its ephemeral TTL or a DELETE; chaining to an unfinished job is
  400 ``has not finished (status: ...)``, to a ``store: false`` or deleted one 400
  ``previous_response_not_found``, and to a finished stored one (cancelled included) 200;
- every stream (``GET ?stream=true``, optionally ``starting_after``) is well framed, starts
  ``response.created`` (``queued``) then ``response.queued`` for a job, ends with exactly one
  terminal event that agrees with the polls, and a resumed stream is the tail of the whole one;
  a watcher that cancels a long job it saw start sees it end ``cancelled``;
- at teardown, once every job is terminal, the batch is empty (``model.statistics().active``
  and ``admitted``),
  no job is active (``jobs.statistics().jobs_active``), and every admitted sequence ended exactly once
  (``sequences_finished + sequences_cancelled`` equals the creates that answered 200).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import trio
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mlx_responses.protocol.events.sse import SseDecoder
from mlx_responses.server import ServerHandle, ServerSettings, serve
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings

LONG = "Count from 1 to 110."  # ~330 tokens with the bundled model
SHORT = "Reply with: hello"  # one token
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
TERMINAL_EVENTS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
    "response.cancelled": "cancelled",
}
RANK = {"queued": 0, "in_progress": 1, **dict.fromkeys(TERMINAL, 2)}
FRESH_DELTAS = 10  # text deltas seen live, of a job that makes ~330 tokens
JOB_INDEX = st.integers(min_value=0, max_value=255)
HTTP_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
STOP_DEADLINE = 30.0  # server shutdown and thread join
TERMINAL_DEADLINE = 30.0  # a job reaching its terminal status
IDLE_DEADLINE = 5.0  # the batch and the supervisor emptying once every job is terminal
UNFINISHED = re.compile(
    r"previous response '(?P<id>[^']+)' has not finished \(status: (?P<status>queued|in_progress)\)"
)


class ThreadedServer:
    """``serve`` under its own ``trio.run`` in a thread; ``stop`` shuts it down and joins it."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._ready: queue.Queue[tuple[ServerHandle, trio.lowlevel.TrioToken] | BaseException]
        self._ready = queue.Queue()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = threading.Thread(target=self._run, name="state-machine-server", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                handle: ServerHandle = await nursery.start(serve, self._settings)
                self._ready.put((handle, trio.lowlevel.current_trio_token()))

        try:
            trio.run(main)
        except BaseException as exc:  # reported by ``start`` / ``stop`` on the test's thread
            self._error = exc
            self._ready.put(exc)

    def start(self) -> ServerHandle:
        self._thread.start()
        item = self._ready.get(timeout=START_DEADLINE)
        if isinstance(item, BaseException):
            self._thread.join(STOP_DEADLINE)
            raise RuntimeError("the server failed to start") from item
        handle, self._token = item
        return handle

    def stop(self, handle: ServerHandle) -> None:
        if self._thread.is_alive() and self._token is not None:
            try:
                trio.from_thread.run_sync(handle.shutdown, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(STOP_DEADLINE)
        assert not self._thread.is_alive(), "the server thread did not stop"
        if self._error is not None:
            raise RuntimeError("the server crashed") from self._error


@dataclass
class Job:
    """What the API has told us about one response id."""

    id: str
    background: bool
    store: bool
    status: str
    cancel_requested: bool = False
    deleted: bool = False
    # An answer (a chain accepted, a 400 not-cancellable) proved it had finished.
    must_be_terminal: bool = False
    # input + output tokens of the terminal object: the history a chain to it replays.
    total_tokens: int | None = None
    # The long prompt without max_output_tokens: ~330 tokens, far from done when it starts.
    long: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def readable(self) -> bool:
        """GET answers for it: stored, or a background job (store: false ones are retained)."""
        return not self.deleted and (self.store or self.background)


def error_of(reply: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = reply.json()["error"]
    return error


class BackgroundMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, Job] = {}
        self.admitted = 0  # creates answered 200: each admitted exactly one sequence
        self.server = ThreadedServer(server_settings())
        self.handle = self.server.start()
        self.context_window = self.handle.model.info.context_window
        self.http = httpx.Client(base_url=self.handle.base_url, timeout=HTTP_TIMEOUT)

    # -- helpers ---------------------------------------------------------------------------------

    def pick(self, index: int, prefer: Callable[[Job], bool] | None = None) -> Job:
        """The ``index``-th job (modulo), among those ``prefer`` keeps if there are any.

        Which jobs are running depends on timing, so draws must not: Hypothesis replays a
        choice sequence and requires the same draws (no preconditions or sampled lists that
        depend on statuses), so the choice is a plain integer mapped onto today's list.
        """
        jobs = list(self.jobs.values())
        preferred = [job for job in jobs if prefer(job)] if prefer is not None else []
        candidates = preferred or jobs
        return candidates[index % len(candidates)]

    def observe(self, job: Job, obj: dict[str, Any], where: str) -> None:
        """Check one Response object against what we know of the job, then learn from it."""
        assert obj["id"] == job.id, where
        status = obj["status"]
        if job.background:
            assert obj.get("background") is True, f"{where}: background object without the flag"
        else:
            assert "background" not in obj, f"{where}: foreground object with a background key"
        if job.terminal:
            assert status == job.status, (
                f"{where}: {job.id} was {job.status!r}, now {status!r} (a terminal status changed)"
            )
        else:
            assert RANK[status] >= RANK[job.status], (
                f"{where}: {job.id} went back from {job.status!r} to {status!r}"
            )
        if job.must_be_terminal:
            assert status in TERMINAL, f"{where}: {job.id} had finished, now {status!r}"
        if status not in TERMINAL:
            # Polling never exposes partial output.
            assert obj["output"] == [], f"{where}: {status} job exposes output {obj['output']}"
            usage = obj["usage"]
            assert usage is None or (
                usage["input_tokens"] == 0
                and usage["output_tokens"] == 0
                and usage["total_tokens"] == 0
            ), f"{where}: {status} job exposes usage {usage}"
        assert status != "failed", f"{where}: {job.id} failed: {obj.get('error')}"
        if status == "cancelled":
            assert job.cancel_requested, f"{where}: {job.id} cancelled without a cancel request"
        if status in TERMINAL and obj.get("usage"):
            job.total_tokens = int(obj["usage"]["total_tokens"])
        job.status = status

    def create(self, body: dict[str, Any], *, background: bool, store: bool) -> Job:
        reply = self.http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        obj = reply.json()
        self.admitted += 1
        assert_strict_response(obj)
        if background:
            assert obj["status"] == "queued"
            assert obj["output"] == []
        else:
            assert obj["status"] in ("completed", "incomplete"), obj["status"]
        job = Job(obj["id"], background, store, "queued" if background else "in_progress")
        job.long = body["input"] == LONG and "max_output_tokens" not in body
        self.observe(job, obj, "create")
        self.jobs[job.id] = job
        return job

    def poll(self, job: Job, where: str) -> None:
        reply = self.http.get(f"/v1/responses/{job.id}")
        if not job.readable:
            assert reply.status_code == 404, f"{where}: GET of {job} answered {reply.status_code}"
            return
        assert reply.status_code == 200, f"{where}: GET of {job}: {reply.text}"
        self.observe(job, reply.json(), where)

    def wait_terminal(self, job: Job, where: str) -> None:
        # Polling is what this rule tests: every status a poller sees on the way is checked
        # against the job's legal transitions (``observe``); the sleep only paces the GETs.
        deadline = time.monotonic() + TERMINAL_DEADLINE
        while job.readable and not job.terminal:
            assert time.monotonic() < deadline, f"{where}: {job.id} still {job.status!r}"
            self.poll(job, where)
            if not job.terminal:
                time.sleep(0.005)

    def read_stream(self, job: Job, starting_after: int | None) -> list[tuple[str, Any]]:
        query = "?stream=true" + (
            "" if starting_after is None else f"&starting_after={starting_after}"
        )
        reply = self.http.get(f"/v1/responses/{job.id}{query}")
        if not job.readable:
            assert reply.status_code == 404, f"stream of {job}: {reply.status_code}"
            return []
        assert reply.status_code == 200, reply.text
        return parse_sse(reply.content)

    def check_stream(
        self, job: Job, events: list[tuple[str, Any]], start: int, where: str
    ) -> dict[str, Any]:
        """Framing of a (possibly resumed) stream; returns its final Response object."""
        assert events, f"{where}: empty stream"
        numbers = [data["sequence_number"] for _, data in events]
        assert numbers == list(range(start, start + len(events))), f"{where}: {numbers}"
        names = [name for name, _ in events]
        terminals = [i for i, name in enumerate(names) if name in TERMINAL_EVENTS]
        assert terminals == [len(events) - 1], f"{where}: terminal events at {terminals}: {names}"
        for name, data in events:
            assert name == data["type"]
            if "response" in data:
                assert data["response"]["id"] == job.id
                assert (data["response"].get("background") is True) == job.background, name
        if start == 0:
            final = assert_stream_invariants(events)
            if job.background:
                assert names[:2] == ["response.created", "response.queued"], names[:3]
                assert events[0][1]["response"]["status"] == "queued"
        else:
            final = dict(events[-1][1]["response"])
        assert final["status"] == TERMINAL_EVENTS[names[-1]], where
        self.observe(job, final, where)
        return final

    # -- rules -----------------------------------------------------------------------------------

    @initialize(long=st.booleans(), store=st.booleans())
    def first_job(self, long: bool, store: bool) -> None:
        self.create_background(long, store, None)

    @rule(
        long=st.booleans(),
        store=st.booleans(),
        max_tokens=st.sampled_from([None, None, 40]),
    )
    def create_background(self, long: bool, store: bool, max_tokens: int | None) -> None:
        body: dict[str, Any] = {
            "model": MODEL,
            "input": LONG if long else SHORT,
            "temperature": 0,
            "background": True,
            "store": store,
        }
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        self.create(body, background=True, store=store)

    @rule(long=st.booleans(), store=st.booleans())
    def create_foreground(self, long: bool, store: bool) -> None:
        body: dict[str, Any] = {
            "model": MODEL,
            "input": LONG if long else SHORT,
            "temperature": 0,
            "store": store,
            "max_output_tokens": 24,
        }
        self.create(body, background=False, store=store)

    @rule(index=JOB_INDEX)
    def poll_one(self, index: int) -> None:
        self.poll(self.pick(index), "poll")

    @rule(index=JOB_INDEX)
    def poll_until_terminal(self, index: int) -> None:
        self.wait_terminal(self.pick(index, lambda job: not job.terminal), "poll until terminal")

    @rule(seconds=st.sampled_from([0.01, 0.05, 0.2]))
    def let_time_pass(self, seconds: float) -> None:
        time.sleep(seconds)

    @rule(index=JOB_INDEX)
    def cancel(self, index: int) -> None:
        job = self.pick(index)
        was_terminal = job.terminal
        if not was_terminal:
            job.cancel_requested = True
        reply = self.http.post(f"/v1/responses/{job.id}/cancel")
        if not job.readable:
            assert reply.status_code == 404, f"cancel of {job}: {reply.status_code}"
            return
        if was_terminal:
            assert reply.status_code == 400, f"cancel of finished {job}: {reply.text}"
            assert error_of(reply)["code"] == "response_not_cancellable"
            event("cancel: finished response refused")
            return
        if reply.status_code == 400:
            # It finished between our last look and the cancel.
            event("cancel: refused, it had just finished")
            assert error_of(reply)["code"] == "response_not_cancellable", reply.text
            job.must_be_terminal = True
            self.poll(job, "poll after a refused cancel")
            return
        assert reply.status_code == 200, reply.text
        obj = reply.json()
        assert_strict_response(obj)
        # The endpoint answers once the job is terminal (normally ``cancelled``; a job that
        # finished on its own at that instant keeps its own status).
        assert obj["status"] in TERMINAL, f"cancel answered {obj['status']!r}"
        event(f"cancel: {job.status} job answered {obj['status']}")
        self.observe(job, obj, "cancel")

    @rule(index=JOB_INDEX)
    def delete(self, index: int) -> None:
        job = self.pick(index)
        was_terminal = job.terminal
        reply = self.http.delete(f"/v1/responses/{job.id}")
        if job.deleted or not (job.store or job.background):
            assert reply.status_code == 404, f"delete of {job}: {reply.status_code}"
            return
        if reply.status_code == 400:
            assert not was_terminal, f"delete of finished {job}: {reply.text}"
            assert "has not finished" in error_of(reply)["message"], reply.text
            event("delete: unfinished job refused")
            return
        # A finished job is deleted, a store: false one too (it stops being readable before
        # its ephemeral TTL).
        assert reply.status_code == 200, f"delete of {job}: {reply.text}"
        assert reply.json() == {"id": job.id, "object": "response", "deleted": True}
        job.deleted = True
        event("delete: deleted")

    @rule(index=JOB_INDEX, starting_after=st.sampled_from([None, None, 0, 1]))
    def stream(self, index: int, starting_after: int | None) -> None:
        job = self.pick(index)
        events = self.read_stream(job, starting_after)
        if not job.readable:
            return
        start = 0 if starting_after is None else starting_after + 1
        event(f"stream: {'running' if not job.terminal else 'finished'} response")
        self.check_stream(job, events, start, "stream")
        if start:
            # A resumed stream is the tail of the whole one.
            whole = self.read_stream(job, None)
            self.check_stream(job, whole, 0, "whole stream")
            assert whole[start:] == events, "a resumed stream differs from the tail of the whole"

    @rule(index=JOB_INDEX, cancel=st.booleans())
    def watch(self, index: int, cancel: bool) -> None:
        """Follow a running job live (when there is one); then cancel it, or hang up (which
        must change nothing)."""
        job = self.pick(index, lambda j: j.background and not j.terminal)
        decoder = SseDecoder()
        events: list[tuple[str, Any]] = []
        answer: httpx.Response | None = None
        fresh = False
        with self.http.stream("GET", f"/v1/responses/{job.id}?stream=true") as reply:
            if not job.readable:
                assert reply.status_code == 404, f"stream of {job}: {reply.status_code}"
                return
            assert reply.status_code == 200
            chunks = reply.iter_bytes()
            for chunk in chunks:
                events += decoder.feed(chunk)
                if len(events) >= 2:
                    break
            if not cancel:
                event("watch: hung up")
                return  # leaving the block drops the connection
            names = [name for name, _ in events]
            # Seen live near its start, a long job is hundreds of decode steps from its end:
            # a cancel now must end it ``cancelled`` (not let it run on and complete).
            fresh = (
                job.long
                and names.count("response.output_text.delta") < FRESH_DELTAS
                and "response.output_text.done" not in names
            )
            if not job.terminal and not any(name in TERMINAL_EVENTS for name in names):
                job.cancel_requested = True
                answer = self.http.post(f"/v1/responses/{job.id}/cancel")
                assert answer.status_code in (200, 400), answer.text
                if answer.status_code == 400:
                    assert error_of(answer)["code"] == "response_not_cancellable"
                    job.must_be_terminal = True
                else:
                    assert answer.json()["status"] in TERMINAL
            for chunk in chunks:
                events += decoder.feed(chunk)
        assert decoder.at_boundary
        final = self.check_stream(job, events, 0, "watch")
        event(f"watch: ended {final['status']}")
        if answer is not None and answer.status_code == 200:
            assert final["status"] == answer.json()["status"], "the watcher saw another ending"
        if answer is not None and fresh:
            event("watch: cancelled a fresh long job")
            assert answer.status_code == 200, answer.text
            assert final["status"] == "cancelled", f"a cancel at its start let {job.id} finish"

    @rule(index=JOB_INDEX, background=st.booleans())
    def chain(self, index: int, background: bool) -> None:
        parent = self.pick(index)
        was_terminal = parent.terminal
        body: dict[str, Any] = {
            "model": MODEL,
            "input": SHORT,
            "temperature": 0,
            "max_output_tokens": 8,
            "previous_response_id": parent.id,
            "background": background,
        }
        reply = self.http.post("/v1/responses", json=body)
        if reply.status_code == 200:
            assert parent.store, f"chained to a store: false response: {parent}"
            assert not parent.deleted, f"chained to a deleted response: {parent}"
            self.admitted += 1
            obj = reply.json()
            assert_strict_response(obj)
            assert obj["previous_response_id"] == parent.id
            # The parent was terminal when the chain was accepted.
            parent.must_be_terminal = True
            event("chain: accepted")
            self.poll(parent, "poll after a chain")
            child = Job(obj["id"], background, True, "queued" if background else "in_progress")
            self.observe(child, obj, "chain")
            self.jobs[child.id] = child
            return
        assert reply.status_code == 400, reply.text
        error = error_of(reply)
        assert error["param"] == "previous_response_id" or error["code"] == (
            "context_length_exceeded"
        ), error
        if error["code"] == "context_length_exceeded":
            # Only a long history may overflow the window.
            assert parent.total_tokens is None or parent.total_tokens + 40 > self.context_window
            event("chain: context window exceeded")
            return
        unfinished = UNFINISHED.fullmatch(error["message"])
        if unfinished is not None:
            assert not was_terminal, f"{parent} is terminal, yet: {error['message']}"
            assert not parent.deleted
            assert RANK[unfinished["status"]] >= RANK[parent.status], error["message"]
            self.observe(parent, {**parent_stub(parent), "status": unfinished["status"]}, "chain")
            event("chain: unfinished parent refused")
            return
        assert error["code"] == "previous_response_not_found", error
        # Deleted or store: false (unfinished store: false jobs may say "has not finished").
        assert parent.deleted or not parent.store, f"{parent} not found for a chain"
        event("chain: parent not found")

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_id_answers_consistently(self) -> None:
        for job in list(self.jobs.values()):
            self.poll(job, "invariant")

    def teardown(self) -> None:
        try:
            if hasattr(self, "http"):
                self.finish_and_check()
        finally:
            if hasattr(self, "http"):
                self.http.close()
            self.server.stop(self.handle)

    def finish_and_check(self) -> None:
        # Cancel what is still running (cancel must end it), then every job must be terminal.
        for job in self.jobs.values():
            if job.readable and not job.terminal:
                job.cancel_requested = True
                reply = self.http.post(f"/v1/responses/{job.id}/cancel")
                assert reply.status_code in (200, 400), reply.text
                if reply.status_code == 400:
                    assert error_of(reply)["code"] == "response_not_cancellable"
                    job.must_be_terminal = True
                else:
                    self.observe(job, reply.json(), "teardown cancel")
        for job in self.jobs.values():
            if job.readable:
                self.wait_terminal(job, "teardown")
        # No sequence outlives its job, no job outlives its terminal status.
        model, jobs = self.handle.model, self.handle.responses
        deadline = time.monotonic() + IDLE_DEADLINE
        # The actors' statistics are snapshots with no event to wait on (the model's is
        # replaced by the generation thread after each step): polled, as ``wait_until`` does.
        # A job cancelled just after it submitted is terminal before the generation thread has
        # taken in its sequence: the sequence is still admitted (not yet in the batch), and
        # leaves at the thread's next step, so ``admitted`` is waited on as well as ``active``.
        while (
            model.statistics().active
            or model.statistics().admitted
            or jobs.statistics().jobs_active
        ) and (time.monotonic() < deadline):
            time.sleep(0.005)
        stats = model.statistics()
        assert stats.active == 0, f"sequences left in the batch: {stats}"
        assert stats.admitted == 0, f"sequences left admitted: {stats}"
        assert jobs.statistics().jobs_active == 0, f"jobs left active: {jobs.statistics()}"
        ended = stats.sequences_finished + stats.sequences_cancelled
        assert ended == self.admitted, f"{self.admitted} sequences admitted, {ended} ended: {stats}"
        started = sum(1 for job in self.jobs.values() if job.background)
        assert jobs.statistics().jobs_started == started
        assert jobs.statistics().jobs_finished == started


def parent_stub(job: Job) -> dict[str, Any]:
    """A minimal object for ``observe`` from a status another answer reported."""
    stub: dict[str, Any] = {"id": job.id, "output": [], "usage": None}
    if job.background:
        stub["background"] = True
    return stub


BackgroundMachine.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBackgroundMachine = BackgroundMachine.TestCase
