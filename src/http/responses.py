"""The ``/v1/responses`` routes: create, input_tokens, compact, retrieve (and replay),
input_items, delete.

Invariants:
- Every refusal happens before the response actor exists (``open_response`` raises), so a
  refused create changes nothing.
- A streaming body only iterates the response actor (or, for a replay, an event log or a
  stored record); when the client hangs up, Quart cancels or closes the body and its
  ``finally`` abandons the response, which removes the sequence from the batch at the next step.
- Event positions are sequence numbers (decision 8 numbers from 0 without gaps), so
  ``starting_after=N`` resumes at index ``N + 1`` of the stored or live events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from ..actors.compaction import compact_history
from ..actors.file_store import FileStoreHandle
from ..actors.jobs import TooManyJobs
from ..actors.live import EventLog
from ..actors.response import Services, open_response, persistence_disabled, prepare_prompt
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.listing import list_envelope, page, parse_list_query
from ..protocol.objects import TERMINAL_STATUSES, JsonObject
from ..protocol.request import CreateRequest
from ..protocol.sse import encode_sse
from .common import decode_json_body, json_response, mount, sse_response, tenant
from .file_inputs import inline_file_inputs
from .reasoning_secret import reasoning_sealer
from .schemas import parse_compact_request, parse_create_request
from .server_defaults import default_temperature

# How long the cancel endpoint waits for the response to reach its terminal event.
CANCEL_WAIT_SECONDS = 10


def too_many_jobs(why: str) -> ApiError:
    return ApiError(
        429,
        "rate_limit_exceeded",
        f"Too many active background responses: {why}; retry after one finishes.",
        code="rate_limit_exceeded",
    )


def _missing(response_id: str) -> Exception:
    return not_found(f"No response found with id '{response_id}'.", param="response_id")


def _query_bool(name: str) -> bool:
    value = request.args.get(name)
    if value is None:
        return False
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise invalid_request(f"Invalid value for '{name}': {value!r}; expected true or false.", name)


def _query_int(name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = request.args.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low or (high is not None and number > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid_request(
            f"Invalid value for '{name}': {value!r}; expected an integer {bounds}.", name
        )
    return number


async def _read_body() -> object:
    return decode_json_body(await request.get_data(cache=False, as_text=False))


def register_response_routes(
    app: QuartTrio,
    services: Services,
    *,
    drop_unsupported_tools: bool = False,
    files: FileStoreHandle | None = None,
) -> None:
    store, live, jobs = services.store, services.live, services.jobs
    sealer = reasoning_sealer(services.model.info.alias)  # issue 13: sealed reasoning
    temperature = default_temperature()  # issue 13: --default-temperature

    async def read_create_body() -> object:
        """The body, with ``input_file`` parts already turned into text."""
        body = await _read_body()
        return body if files is None else await inline_file_inputs(body, files, tenant())

    @mount(app, "/responses", ["POST"])
    async def create_response() -> Response:
        create = parse_create_request(
            await read_create_body(),
            drop_unsupported_tools=drop_unsupported_tools,
            owner=tenant(),
            sealer=sealer,
            default_temperature=temperature,
        )
        if create.config.background:
            return await _create_background(create)
        run = await open_response(create, services)
        g.response_id = run.response_id  # for the request log line (issue 13)
        if not create.stream:
            try:
                return json_response(await run.run_to_end())
            finally:
                run.abandon()

        async def body() -> AsyncIterator[bytes]:
            try:
                while (events := await run.next_events()) is not None:
                    yield b"".join(encode_sse(event) for event in events)
            finally:
                run.abandon()

        return sse_response(body())

    async def _create_background(create: CreateRequest) -> Response:
        if not store.enabled or store.limits.max_bytes == 0 or not jobs.enabled:
            raise invalid_request(
                "Background mode is disabled on this server (the response store, its byte "
                "budget or --responses-background-max-jobs is 0).",
                "background",
            )
        if jobs.statistics().active >= jobs.max_jobs:
            raise too_many_jobs(f"{jobs.max_jobs} background jobs are already active")
        run = await open_response(create, services)
        try:
            await jobs.start(run)
        except TooManyJobs as exc:
            run.abandon()
            raise too_many_jobs(str(exc)) from None
        return json_response(run.snapshot())

    @mount(app, "/responses/<response_id>/cancel", ["POST"])
    async def cancel_response(response_id: str) -> Response:
        if not store.enabled:
            raise persistence_disabled("Cancelling a response")
        running = await live.find(response_id, tenant())
        if running is not None and not running.closed:
            running.request_cancel()
            with trio.move_on_after(CANCEL_WAIT_SECONDS):
                await running.wait_closed()
            record = await store.get(response_id, tenant())
            return json_response(record.response if record is not None else running.snapshot())
        if running is not None or await store.get(response_id, tenant()) is not None:
            raise invalid_request(
                f"Response '{response_id}' cannot be cancelled: it has already finished.",
                "response_id",
                code="response_not_cancellable",
            )
        raise _missing(response_id)

    @mount(app, "/responses/input_tokens", ["POST"])
    async def count_input_tokens() -> Response:
        data = await read_create_body()
        if isinstance(data, dict) and "model" not in data:
            data = {**data, "model": services.model.info.alias}
        request_ = parse_create_request(
            data, drop_unsupported_tools=drop_unsupported_tools, owner=tenant(), sealer=sealer
        )
        prepared = await prepare_prompt(request_, services)
        return json_response(
            {"object": "response.input_tokens", "input_tokens": len(prepared.prompt)}
        )

    # Mounted before the /responses/<response_id> rules; its static path wins over them anyway.
    @mount(app, "/responses/compact", ["POST"])
    async def compact_response() -> Response:
        compact = parse_compact_request(await read_create_body(), owner=tenant())
        return json_response(await compact_history(compact, services))

    @mount(app, "/responses/<response_id>", ["GET"])
    async def get_response(response_id: str) -> Response:
        if not store.enabled:
            raise persistence_disabled("Retrieving a response")
        stream = _query_bool("stream")
        starting_after = _query_int("starting_after", None, 0)
        record = await store.get(response_id, tenant())
        log = None if record is not None else await live.find(response_id, tenant())
        if log is not None and not log.closed and log.snapshot()["status"] in TERMINAL_STATUSES:
            # Between its terminal event and the store's answer a response is finishing: wait
            # for the stored record, which is the one answer (it may differ, e.g. too large).
            with trio.move_on_after(CANCEL_WAIT_SECONDS):
                await log.wait_closed()
            record = await store.get(response_id, tenant())
        # A closed log answers for a store: false background job kept for its ephemeral TTL.
        if record is None and log is None:
            raise _missing(response_id)
        if not stream:
            return json_response(record.response if record is not None else _snapshot(log))
        start = 0 if starting_after is None else starting_after + 1
        if record is not None:
            return sse_response(_replay(record.events, start))
        assert log is not None
        return sse_response(_follow(log, start))

    @mount(app, "/responses/<response_id>/input_items", ["GET"])
    async def list_input_items(response_id: str) -> Response:
        if not store.enabled:
            raise persistence_disabled("Listing input items")
        wanted = parse_list_query(request.args.to_dict(flat=False))
        record = await store.get(response_id, tenant())
        if record is None:
            raise _missing(response_id)
        found = page(record.input_items, wanted, lambda item: item.get("id"))
        if found is None:
            raise invalid_request(
                f"Invalid value for 'after': no item with id '{wanted.after}'.", "after"
            )
        return json_response(list_envelope(*found))

    @mount(app, "/responses/<response_id>", ["DELETE"])
    async def delete_response(response_id: str) -> Response:
        if not store.enabled:
            raise persistence_disabled("Deleting a response")
        running = await live.find(response_id, tenant())
        if running is not None and not running.closed:
            raise invalid_request(
                f"Response '{response_id}' has not finished; cancel it first "
                f"(POST /v1/responses/{response_id}/cancel).",
                "response_id",
            )
        deleted = await store.delete(response_id, tenant())
        if running is not None and running.closed and running.retain_until is not None:
            # A finished store: false job kept readable for its ephemeral TTL: forget it now.
            running.retain_until = None
            deleted = True
        if not deleted:
            raise _missing(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})


def _snapshot(log: EventLog | None) -> JsonObject:
    assert log is not None
    return log.snapshot()


async def _replay(events: Sequence[JsonObject], start: int) -> AsyncIterator[bytes]:
    if events[start:]:
        yield b"".join(encode_sse(event) for event in events[start:])


async def _follow(log: EventLog, start: int) -> AsyncIterator[bytes]:
    position = start
    while events := await log.wait_after(position):
        position += len(events)
        yield b"".join(encode_sse(event) for event in events)
