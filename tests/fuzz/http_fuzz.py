"""A property-based HTTP fuzz run against the real server, bounded in time.

Run::

    .venv/bin/python -m tests.fuzz.http_fuzz [--seconds 180] [--seed N]     # or: make fuzz

The server runs in-process (``serve``: real Hypercorn, the actors, the bundled model) on a
thread of its own; Hypothesis draws requests and sends them one at a time over HTTP:

- bodies drawn from the pinned SDKs' own request types (``st.from_type`` on
  ``ResponseCreateParams``, ``InputTokenCountParams``, ``ResponseCompactParams``,
  ``ConversationCreateParams``, ``ItemCreateParams``, anthropic's message-create fields),
  alone or merged over a valid request, streamed or not, so most reach the model;
- a valid request with one field replaced by an arbitrary JSON value (lone surrogates, huge
  numbers, wrong types, nesting);
- raw bytes to a JSON route, multipart uploads with arbitrary parts, and GETs / DELETEs of
  known and arbitrary ids with arbitrary query strings.

For every request it asserts:

1. no 5xx, and a body that decodes (JSON, or a whole SSE stream);
2. a stream has exactly one terminal event and it is the last (Responses:
   ``response.completed|failed|incomplete|cancelled``; Messages: ``message_stop`` or
   ``error``);
3. a refused request (4xx) changes no state: stored responses, conversations, files and
   background jobs are counted (after the server is idle) before and after.

It ends with a summary line (``cases``, ``5xx``, ``cut streams``, ``state changes``, by route)
and exits 1 if any property failed (Hypothesis prints the shrunk failing request).
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
import trio
from anthropic.types import (
    MetadataParam,
    TextBlockParam,
    ThinkingConfigParam,
    ToolChoiceParam,
    ToolParam,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning
from openai.types.conversations.conversation_create_params import ConversationCreateParams
from openai.types.conversations.item_create_params import ItemCreateParams
from openai.types.responses.input_token_count_params import InputTokenCountParams
from openai.types.responses.response_compact_params import ResponseCompactParams
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

from mlx_responses.actors.model import ModelSettings
from mlx_responses.engine.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from mlx_responses.protocol.events.machine import TERMINAL_EVENT_TYPES
from mlx_responses.protocol.events.sse import SseDecoder
from mlx_responses.server import ServerHandle, ServerSettings, serve

MODEL = BUNDLED_ALIAS
MAX_TOKENS = 8  # output tokens of the requests the fuzzer builds; SDK-drawn ones are capped
IDLE_DEADLINE = 60.0
REPLY_DEADLINE = 30.0
ROUND = 25  # examples per Hypothesis run; runs repeat, each with a new seed, until time is up
ANTHROPIC_TERMINAL = frozenset({"message_stop", "error"})


# ---------------------------------------------------------------- the server, on its thread


@dataclass
class Running:
    server: ServerHandle
    token: trio.lowlevel.TrioToken
    thread: threading.Thread

    def stop(self) -> None:
        trio.from_thread.run_sync(self.server.shutdown, trio_token=self.token)
        self.thread.join(timeout=60)


def start_server() -> Running:
    ready: queue.Queue[tuple[ServerHandle, trio.lowlevel.TrioToken] | BaseException] = queue.Queue()

    async def main() -> None:
        model = ModelSettings(model_path=str(BUNDLED_MODEL_PATH), alias=BUNDLED_ALIAS)
        settings_ = ServerSettings(host="127.0.0.1", port=0, model=model, graceful_timeout=5)
        async with trio.open_nursery() as nursery:
            handle: ServerHandle = await nursery.start(serve, settings_)
            ready.put((handle, trio.lowlevel.current_trio_token()))

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the waiting main thread
            ready.put(exc)

    thread = threading.Thread(target=run, name="fuzz-server", daemon=True)
    thread.start()
    got = ready.get(timeout=120)
    if isinstance(got, BaseException):
        raise got
    return Running(got[0], got[1], thread)


# ---------------------------------------------------------------- state and its invariants


def snapshot(server: ServerHandle) -> tuple[int, ...]:
    """Counts a refused request must not change (entries and everything ever put)."""
    store = server.store.statistics()
    conversations = server.conversations.statistics()
    files = server.files.statistics()
    jobs = server.responses.statistics()
    return (
        store.entries + store.evictions + store.expirations + store.rejections,
        conversations.entries + conversations.evictions + conversations.expirations,
        files.entries + files.evictions + files.expirations,
        jobs.jobs_started,
    )


# Lookups of nothing, one per store actor: each answers only after every message sent to it
# before (its mailbox is in order), so the replies mean the last puts have landed.
STORE_BARRIERS = (
    "/v1/responses/resp_fuzz_barrier",
    "/v1/conversations/conv_fuzz_barrier",
    "/v1/files/file_fuzz_barrier",
)


def wait_idle(server: ServerHandle, http: httpx.Client | None = None) -> None:
    """Background jobs and running sequences finish (they store when they end); with ``http``,
    the stores have also taken in what they sent."""
    deadline = time.monotonic() + IDLE_DEADLINE
    model = server.model
    while (
        server.responses.statistics().tasks
        or model.statistics().active
        or model.statistics().admitted
    ):
        if time.monotonic() > deadline:
            raise AssertionError("the server did not become idle")
        time.sleep(0.01)
    for path in STORE_BARRIERS if http is not None else ():
        reply = http.get(path)
        assert reply.status_code == 404, f"store barrier {path}: {reply.status_code}"


@dataclass
class Summary:
    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: int = 0
    cut_streams: int = 0
    state_changes: int = 0
    streams: int = 0
    previous: str | None = None

    def line(self) -> str:
        total = sum(self.cases.values())
        routes = ", ".join(f"{route} {n}" for route, n in sorted(self.cases.items()))
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        return (
            f"fuzz: {total} cases ({routes}); statuses {statuses}; {self.streams} streams; "
            f"{self.server_errors} 5xx, {self.cut_streams} cut streams, "
            f"{self.state_changes} state changes"
        )


SUMMARY = Summary()


def sse_events(raw: bytes) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    decoder = SseDecoder()
    events = decoder.feed(raw)
    return events, decoder.at_boundary


def check_stream(route: str, raw: bytes) -> None:
    SUMMARY.streams += 1
    events, whole = sse_events(raw)
    terminal = ANTHROPIC_TERMINAL if route.startswith("POST /v1/messages") else TERMINAL_EVENT_TYPES
    names = [name for name, _ in events]
    ends = [i for i, name in enumerate(names) if name in terminal]
    if not whole or len(ends) != 1 or ends[0] != len(names) - 1:
        SUMMARY.cut_streams += 1
        raise AssertionError(f"{route}: stream without exactly one final terminal: {names[-5:]}")


def exchange(
    http: httpx.Client, server: ServerHandle, route: str, send: Callable[[], httpx.Response]
) -> httpx.Response:
    """Send one request and check every property; returns the reply."""
    SUMMARY.cases[route] += 1
    previous, SUMMARY.previous = SUMMARY.previous, route
    wait_idle(server, http)
    before = snapshot(server)
    try:
        reply = send()
    except httpx.TimeoutException:
        raise AssertionError(
            f"{route}: no reply within {REPLY_DEADLINE} s (a connection wedged by the request "
            f"before it on the connection, {previous}?)"
        ) from None
    SUMMARY.statuses[reply.status_code] += 1
    if reply.status_code >= 500:
        SUMMARY.server_errors += 1
        raise AssertionError(f"{route}: {reply.status_code} {reply.text[:500]}")
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        check_stream(route, reply.content)
    elif reply.content and route != "GET /v1/files/{id}/content" and reply.status_code < 300:
        try:
            json.loads(reply.content)  # every other body is JSON
        except ValueError:
            raise AssertionError(
                f"{route}: {reply.status_code} body is not JSON: {reply.text[:300]}"
            ) from None
    elif reply.status_code >= 400:
        try:
            error = json.loads(reply.content)["error"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(
                f"{route}: {reply.status_code} without an error envelope: {reply.text[:300]}"
            ) from None
        assert isinstance(error, dict), f"{route}: error is {error!r}"
    if reply.status_code >= 400:
        wait_idle(server, http)
        after = snapshot(server)
        if after != before:
            SUMMARY.state_changes += 1
            raise AssertionError(
                f"{route}: refused with {reply.status_code} but {before} -> {after}"
            )
    return reply


# ---------------------------------------------------------------- strategies


def jsonable(value: Any) -> Any:
    """What ``st.from_type`` draws for a TypedDict, as JSON values (iterables to lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes | bytearray):
        return value.decode("latin-1")
    if isinstance(value, list | tuple | set | frozenset) or isinstance(value, Iterator):
        return [jsonable(v) for v in value]
    return str(value)


def _cap_tokens(body: dict[str, Any], key: str = "max_output_tokens") -> dict[str, Any]:
    value = body.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
        body[key] = value % MAX_TOKENS + 1
    if key == "max_output_tokens" and key not in body:
        body[key] = MAX_TOKENS
    return body


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["\ud800", "a\udfffb", "", " ", "\x00", "é", MODEL, "user", "auto"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
short_inputs = st.sampled_from(["hi", "Reply with: hello", "2+2?"]) | st.text(
    min_size=1, max_size=30
)


def sdk(kind: Any) -> st.SearchStrategy[Any]:
    return st.from_type(kind).map(jsonable)


ANTHROPIC_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "system": st.text(max_size=20) | st.lists(sdk(TextBlockParam), max_size=2),
    "tools": st.lists(sdk(ToolParam), max_size=2),
    "tool_choice": sdk(ToolChoiceParam),
    "metadata": sdk(MetadataParam),
    "thinking": sdk(ThinkingConfigParam),
    "stop_sequences": st.lists(st.text(max_size=5), max_size=3),
    "temperature": st.floats(-1, 3),
    "top_p": st.floats(-1, 2),
    "top_k": st.integers(-2, 100),
}


@st.composite
def response_body(draw: st.DrawFn, kind: Any = ResponseCreateParamsNonStreaming) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "input": draw(short_inputs), "max_output_tokens": 4}
    mode = draw(st.sampled_from(["plain", "sdk", "merged", "merged", "mutated"]))
    if mode == "plain":  # valid: most of these run, so streams reach their terminal event
        extras = {
            "instructions": st.text(max_size=20),
            "temperature": st.floats(0, 2),
            "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
            "store": st.booleans(),
            "background": st.booleans(),
        }
        chosen = draw(st.sets(st.sampled_from(sorted(extras)), max_size=2))
        body = {**base, **{key: draw(extras[key]) for key in sorted(chosen)}}
    elif mode == "sdk":
        body = draw(sdk(kind))
    elif mode == "merged":
        drawn = draw(sdk(kind))
        keep = draw(st.sets(st.sampled_from(sorted(drawn)), max_size=3)) if drawn else set()
        body = {**base, **{k: drawn[k] for k in keep}}
    else:
        key = draw(
            st.sampled_from(
                [
                    "model",
                    "input",
                    "instructions",
                    "user",
                    "metadata",
                    "temperature",
                    "top_p",
                    "max_output_tokens",
                    "tools",
                    "tool_choice",
                    "text",
                    "store",
                    "background",
                    "previous_response_id",
                    "conversation",
                    "include",
                    "reasoning",
                    "truncation",
                    "safety_identifier",
                    "prompt_cache_key",
                    "parallel_tool_calls",
                    "seed",
                    "stream_options",
                ]
            )
        )
        body = {**base, key: draw(json_values)}
    return _cap_tokens(body)


@st.composite
def messages_body(draw: st.DrawFn) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": draw(short_inputs)}],
    }
    if draw(st.booleans()):
        # Field by field: the whole MessageCreateParams admits response models (pydantic
        # classes Hypothesis cannot build) among its content blocks.
        fields = draw(st.sets(st.sampled_from(sorted(ANTHROPIC_FIELDS)), min_size=1, max_size=3))
        body = {**base, **{k: draw(ANTHROPIC_FIELDS[k]) for k in sorted(fields)}}
    else:
        body = {
            **base,
            draw(st.sampled_from([*sorted(base), "system", "tools"])): draw(json_values),
        }
    return _cap_tokens(body, "max_tokens")


# ---------------------------------------------------------------- the run

SHOWN = ("path", "body", "items", "data", "name", "filename", "payload", "raw", "kind", "query")


def shown(scope: dict[str, Any]) -> dict[str, Any]:
    """What a case drew, for the falsifying example Hypothesis prints."""
    return {key: scope[key] for key in SHOWN if key in scope and not callable(scope[key])}


@dataclass(frozen=True)
class Case:
    route: str
    send: Callable[[], httpx.Response] = field(repr=False)
    kind: str | None  # the pool ("resp", "conv", "file") a 200's id joins
    drawn: dict[str, Any]


def run(
    seconds: float, seed: int | None, fresh_connections: bool = False, min_cases: int = 0
) -> int:
    """Fuzz for ``seconds`` and at least ``min_cases`` cases (however slow the machine);
    prints the summary (also left in ``SUMMARY``); 1 on a failure."""
    global SUMMARY
    SUMMARY = Summary()
    running = start_server()
    server = running.server
    known: dict[str, list[str]] = {"resp": [], "conv": [], "file": []}
    stop_at = time.monotonic() + seconds

    def time_is_up() -> bool:
        return time.monotonic() > stop_at and sum(SUMMARY.cases.values()) >= min_cases

    failures: list[str] = []

    def pick(draw: st.DrawFn, kind: str) -> Callable[[], str]:
        """An id, chosen when the request is sent: one the server made (the pool grows as the
        run goes, so the strategy itself must not read it) or an arbitrary one."""
        use_known = draw(st.booleans())
        index = draw(st.integers(0, 49))
        arbitrary = draw(st.text(min_size=1, max_size=12).map(lambda s: quote(s, safe="")))

        def resolve() -> str:
            pool = known[kind]
            return pool[index % len(pool)] if use_known and pool else arbitrary

        return resolve

    # One keep-alive connection, as SDK clients use; fresh_connections closes it after each
    # request (``Connection: close``), which hides wedged keep-alive connections.
    headers = {"connection": "close"} if fresh_connections else {}
    with httpx.Client(base_url=server.base_url, timeout=REPLY_DEADLINE, headers=headers) as http:

        def post_json(path: str, body: Any, stream: bool = False) -> Callable[[], httpx.Response]:
            if stream and isinstance(body, dict):
                body = {**body, "stream": True}
            content = json.dumps(body, ensure_ascii=True).encode()
            return lambda: http.post(
                path, content=content, headers={"content-type": "application/json"}
            )

        def remember(kind: str, reply: httpx.Response) -> None:
            if reply.status_code == 200 and reply.headers.get("content-type", "").startswith(
                "application/json"
            ):
                found = reply.json().get("id")
                if isinstance(found, str) and len(known[kind]) < 50:
                    known[kind].append(found)

        @st.composite
        def case(draw: st.DrawFn) -> Case:
            route = draw(
                st.sampled_from(
                    [
                        "POST /v1/responses",
                        "POST /v1/responses",
                        "POST /v1/responses",
                        "POST /v1/responses/input_tokens",
                        "POST /v1/responses/compact",
                        "POST /v1/conversations",
                        "POST /v1/conversations/{id}/items",
                        "POST /v1/messages",
                        "POST /v1/files",
                        "POST raw",
                        "GET /v1/responses/{id}",
                        "GET /v1/responses/{id}/input_items",
                        "GET /v1/conversations/{id}/items",
                        "GET /v1/files",
                        "GET /openapi.json",
                        "GET /v1/files/{id}/content",
                        "DELETE /v1/responses/{id}",
                        "DELETE /v1/files/{id}",
                        "POST /v1/responses/{id}/cancel",
                    ]
                )
            )
            stream = draw(st.booleans())
            query = draw(
                st.dictionaries(
                    st.sampled_from(["limit", "order", "after", "purpose", "include[]", "x"]),
                    st.text(max_size=6) | st.integers(-5, 200).map(str),
                    max_size=3,
                )
            )
            match route:
                case "POST /v1/responses":
                    body = draw(response_body())
                    chain = pick(draw, "resp") if draw(st.integers(0, 3)) == 0 else None
                    thread = pick(draw, "conv") if draw(st.integers(0, 4)) == 0 else None

                    def send() -> httpx.Response:
                        linked = dict(body)
                        if chain is not None:
                            linked["previous_response_id"] = chain()
                        if thread is not None:
                            linked["conversation"] = thread()
                        return post_json("/v1/responses", linked, stream)()

                    return Case(route, send, "resp", shown(locals()))
                case "POST /v1/responses/input_tokens":
                    body = draw(response_body(InputTokenCountParams))
                    body.pop("max_output_tokens", None)
                    return Case(
                        route, post_json("/v1/responses/input_tokens", body), None, shown(locals())
                    )
                case "POST /v1/responses/compact":
                    body = draw(response_body(ResponseCompactParams))
                    body.pop("max_output_tokens", None)
                    return Case(
                        route, post_json("/v1/responses/compact", body), None, shown(locals())
                    )
                case "POST /v1/conversations":
                    body = draw(sdk(ConversationCreateParams) | json_values)
                    return Case(
                        route, post_json("/v1/conversations", body), "conv", shown(locals())
                    )
                case "POST /v1/conversations/{id}/items":
                    conv = pick(draw, "conv")
                    items = draw(sdk(ItemCreateParams) | json_values)
                    return Case(
                        route,
                        lambda: post_json(f"/v1/conversations/{conv()}/items", items)(),
                        None,
                        shown(locals()),
                    )
                case "POST /v1/messages":
                    return Case(
                        route,
                        post_json("/v1/messages", draw(messages_body()), stream),
                        None,
                        shown(locals()),
                    )
                case "POST /v1/files":
                    data = draw(
                        st.dictionaries(
                            st.sampled_from(
                                [
                                    "purpose",
                                    "expires_after[anchor]",
                                    "expires_after[seconds]",
                                    "other",
                                ]
                            ),
                            st.sampled_from(["user_data", "evals", "batch", "created_at", "3600"])
                            | st.text(max_size=8),
                            max_size=3,
                        )
                    )
                    name = draw(st.sampled_from(["file", "file", "upload"]))
                    filename = draw(st.text(max_size=12) | st.just("a.txt"))
                    payload = draw(st.binary(max_size=64))
                    files = {name: (filename, payload)} if draw(st.integers(0, 5)) else {}
                    return Case(
                        route,
                        lambda: http.post("/v1/files", data=data, files=files),
                        "file",
                        shown(locals()),
                    )
                case "POST raw":
                    path = draw(
                        st.sampled_from(
                            [
                                "/v1/responses",
                                "/v1/conversations",
                                "/v1/messages",
                                "/v1/responses/input_tokens",
                            ]
                        )
                    )
                    raw = draw(
                        st.binary(max_size=64)
                        | st.sampled_from(
                            [
                                b"{",
                                b'{"model": 1e999}',
                                b"[]",
                                b'{"a":1,"a":2}',
                                b'"\\ud800"',
                                b'{"input": "\\udc00"}',
                                b"\xff",
                            ]
                        )
                    )
                    kind = draw(st.sampled_from(["application/json", "text/plain", ""]))
                    return Case(
                        route,
                        lambda: http.post(path, content=raw, headers={"content-type": kind}),
                        None,
                        shown(locals()),
                    )
                case "GET /v1/files" | "GET /openapi.json":
                    where = route.split(" ", 1)[1]
                    return Case(route, lambda: http.get(where, params=query), None, shown(locals()))
                case _:
                    method, template = route.split(" ", 1)
                    kind = (
                        "file"
                        if "/files/" in template
                        else ("conv" if "/conversations/" in template else "resp")
                    )
                    ident = pick(draw, kind)
                    if method == "GET":
                        return Case(
                            route,
                            lambda: http.get(template.replace("{id}", ident()), params=query),
                            None,
                            shown(locals()),
                        )
                    if method == "DELETE":
                        return Case(
                            route,
                            lambda: http.delete(template.replace("{id}", ident())),
                            None,
                            shown(locals()),
                        )
                    return Case(
                        route,
                        lambda: http.post(template.replace("{id}", ident())),
                        None,
                        shown(locals()),
                    )

        @settings(
            max_examples=ROUND,
            deadline=None,
            database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        @given(case())
        def property_holds(drawn: Case) -> None:
            if time_is_up():
                return
            reply = exchange(http, server, drawn.route, drawn.send)
            if drawn.kind is not None:
                remember(drawn.kind, reply)

        # Rounds of ROUND examples, each with its own seed, until the time is up.
        base = random.Random(seed).randrange(2**32) if seed is not None else random.randrange(2**32)
        rounds = 0
        try:
            while not time_is_up():
                hypothesis_seed(base + rounds)(property_holds)()
                rounds += 1
        except Exception as exc:  # report, then the summary
            failures.append(describe(exc))
        finally:
            wait_idle(server)
        print(f"fuzz: seed {base}, {rounds} rounds of up to {ROUND} examples")
    running.stop()
    print(SUMMARY.line())
    for failure in failures:
        print(f"FAILED: {failure}"[:4000])
    return 1 if failures else 0


def describe(exc: BaseException) -> str:
    """The failure and, for a group (Hypothesis's flaky or multiple failures), each member."""
    text = f"{type(exc).__name__}: {exc}"
    for inner in getattr(exc, "exceptions", ()):
        text += "\n  - " + describe(inner).replace("\n", "\n    ")
    return text


def main() -> None:
    warnings.filterwarnings("ignore", category=HypothesisWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--fresh-connections",
        action="store_true",
        help="a new connection per request (hides keep-alive connections wedged by a body "
        "the server did not read)",
    )
    args = parser.parse_args()
    sys.exit(run(args.seconds, args.seed, args.fresh_connections))


if __name__ == "__main__":
    main()
