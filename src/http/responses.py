"""The ``/v1/responses`` routes: create, input_tokens, compact, cancel, retrieve (and replay),
input_items, delete.

Invariants:
- Create goes through the one pipeline (``pipeline.open_response``): every refusal happens
  before the response exists, so a refused create changes nothing; the answer (JSON, SSE)
  only subscribes to the response's event log.
- Event positions are sequence numbers (numbered from 0 without gaps), so
  ``starting_after=N`` resumes at index ``N + 1`` of the stored or live events.
- Cancel and delete are messages to the response supervisor; no route touches a response's
  state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from ..actors.prompt import persistence_disabled, prepare_prompt
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.events.sse import encode_sse
from ..protocol.listing import list_envelope, page, parse_list_query
from ..protocol.objects import TERMINAL_STATUSES, JsonObject
from ..protocol.request import CreateRequest
from .common import json_response, mount, runtime, sealer, sse_response, tenant
from .compact_schema import parse_compact_request
from .lifetime import presence
from .pipeline import final_object, follow, open_response, read_create_body
from .schemas import parse_create_request
from .server_defaults import default_temperature

# How long the cancel endpoint (and a GET racing a finishing response) waits for the end.
CANCEL_WAIT_SECONDS = 10


def _missing(response_id: str) -> ApiError:
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


def _parse_create(data: object, *, counting: bool = False) -> CreateRequest:
    return parse_create_request(
        data,
        drop_unsupported_tools=runtime().settings.drop_unsupported_tools,
        hosted=runtime().settings.hosted_switches,
        owner=tenant(),
        sealer=sealer(),
        default_temperature=None if counting else default_temperature(),
        background_key=runtime().settings.background_key,
    )


async def create_response() -> Response:
    create = _parse_create(await read_create_body())
    if create.config.background:
        return await _create_background(create)
    log = await open_response(create)
    g.response_id = log.response_id  # for the request log line
    if not create.stream:
        return json_response(await final_object(log))
    return sse_response(follow(log))


async def _create_background(create: CreateRequest) -> Response:
    rt = runtime()
    store = rt.store
    if not store.enabled or store.limits.max_bytes == 0 or not rt.responses.jobs_enabled:
        raise invalid_request(
            "Background mode is disabled on this server (the response store, its byte "
            "budget or --responses-background-max-jobs is 0).",
            "background",
        )
    # The supervisor's answer is the only job-limit check (a second one here could race it).
    log = await open_response(create)
    return json_response(log.created)


async def cancel_response(response_id: str) -> Response:
    rt = runtime()
    if not rt.store.enabled:
        raise persistence_disabled("Cancelling a response")
    running = await rt.responses.cancel(response_id, tenant())
    if running is not None:
        with trio.move_on_after(CANCEL_WAIT_SECONDS):
            await running.wait_closed()
        record = await rt.store.get(response_id, tenant())
        return json_response(record.response if record is not None else running.snapshot())
    known = await rt.responses.find(response_id, tenant())
    replica = rt.actors.replica  # a job running on another replica
    if known is None and replica is not None and await replica.cancel(response_id, tenant()):
        with trio.move_on_after(CANCEL_WAIT_SECONDS):
            stored = await replica.wait_record(response_id, tenant())
            return json_response(stored.response)
        snapshot = await replica.job(response_id, tenant())
        if snapshot is not None:
            return json_response(snapshot)
    if known is not None or await rt.store.get(response_id, tenant()) is not None:
        raise invalid_request(
            f"Response '{response_id}' cannot be cancelled: it has already finished.",
            "response_id",
            code="response_not_cancellable",
        )
    raise _missing(response_id)


async def count_input_tokens() -> Response:
    data = await read_create_body()
    if isinstance(data, dict) and "model" not in data:
        data = {**data, "model": runtime().model.info.alias}
    prepared = await prepare_prompt(
        _parse_create(data, counting=True),
        runtime().actors,
        runtime().responses,
        run_approved=False,  # counting runs no MCP call
    )
    return json_response({"object": "response.input_tokens", "input_tokens": len(prepared.prompt)})


async def compact_response() -> Response:
    compact = parse_compact_request(await read_create_body(), owner=tenant())
    # A task under the supervisor like every generation: its summary is a running response
    # (listed, cancellable by id, awaited at shutdown) that ends if this request does.
    return json_response(await runtime().responses.compact(compact, presence()))


async def get_response(response_id: str) -> Response:
    rt = runtime()
    if not rt.store.enabled:
        raise persistence_disabled("Retrieving a response")
    stream = _query_bool("stream")
    starting_after = _query_int("starting_after", None, 0)
    start = 0 if starting_after is None else starting_after + 1
    # The live registry first: a running response is answered from its log without a store
    # read (a store read per follower and poller would queue in the store ahead of
    # the job's own final write). A response leaves the registry only after its record is
    # stored, so one that is not there is in the store, or nowhere.
    log = await rt.responses.find(response_id, tenant())
    if log is not None and not log.closed and log.snapshot()["status"] not in TERMINAL_STATUSES:
        return sse_response(follow(log, start)) if stream else json_response(log.snapshot())
    if log is not None and not log.closed:
        # Between its terminal event and the store's answer a response is finishing: wait
        # for the stored record, which is the one answer (it may differ, e.g. too large).
        with trio.move_on_after(CANCEL_WAIT_SECONDS):
            await log.wait_closed()
    record = await rt.store.get(response_id, tenant())
    # A closed log without a record answers for a store: false background job kept for its
    # ephemeral TTL.
    replica = rt.actors.replica  # a job running on another replica
    if record is None and log is None and replica is not None:
        snapshot = await replica.job(response_id, tenant())
        if snapshot is not None and not stream:
            return json_response(snapshot)
        if snapshot is not None:
            return sse_response(replica.follow(response_id, tenant(), start))
        record = await rt.store.get(response_id, tenant())  # it may have just finished
    if record is not None:
        if not stream:
            return json_response(record.response)
        return sse_response(_replay(record.events, start))
    if log is None:
        raise _missing(response_id)
    if not stream:
        return json_response(log.snapshot())
    return sse_response(follow(log, start))


async def list_input_items(response_id: str) -> Response:
    rt = runtime()
    if not rt.store.enabled:
        raise persistence_disabled("Listing input items")
    wanted = parse_list_query(request.args.to_dict(flat=False))
    record = await rt.store.get(response_id, tenant())
    if record is None:
        raise _missing(response_id)
    found = page(record.input_items, wanted, lambda item: item.get("id"))
    if found is None:
        raise invalid_request(
            f"Invalid value for 'after': no item with id '{wanted.after}'.", "after"
        )
    return json_response(list_envelope(*found))


async def delete_response(response_id: str) -> Response:
    rt = runtime()
    if not rt.store.enabled:
        raise persistence_disabled("Deleting a response")
    running = await rt.responses.find(response_id, tenant())
    replica = rt.actors.replica  # a job still running on another replica
    remote = running is None and replica is not None and await replica.job(response_id, tenant())
    if (running is not None and not running.closed) or remote:
        raise invalid_request(
            f"Response '{response_id}' has not finished; cancel it first "
            f"(POST /v1/responses/{response_id}/cancel).",
            "response_id",
        )
    deleted = await rt.store.delete(response_id, tenant())
    # A finished store: false job kept readable for its ephemeral TTL: forget it now.
    deleted = await rt.responses.forget(response_id, tenant()) or deleted
    if not deleted:
        raise _missing(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def _replay(events: Sequence[JsonObject], start: int) -> AsyncIterator[bytes]:
    if events[start:]:
        yield b"".join(encode_sse(event) for event in events[start:])


def register_response_routes(app: QuartTrio) -> None:
    mount(app, "/responses", ["POST"])(create_response)
    # Mounted before the /responses/<response_id> rules; their static paths win anyway.
    mount(app, "/responses/input_tokens", ["POST"])(count_input_tokens)
    mount(app, "/responses/compact", ["POST"])(compact_response)
    mount(app, "/responses/<response_id>/cancel", ["POST"])(cancel_response)
    mount(app, "/responses/<response_id>", ["GET"])(get_response)
    mount(app, "/responses/<response_id>/input_items", ["GET"])(list_input_items)
    mount(app, "/responses/<response_id>", ["DELETE"])(delete_response)
