"""The Open Responses WebSocket compliance tests, as equivalent checks against a real server.

Open Responses (spec release 2026-04-24) has seven WebSocket compliance tests in its suite,
``src/lib/compliance-tests.ts`` of https://github.com/openresponses/openresponses (read here in
the forks that store it: ``sustainabilities/openresponses`` at 0c8e0a1,
``Stars1233/openresponses``): ``websocket-response``, ``websocket-sequential-responses``,
``websocket-continuation``, ``websocket-reconnect-store-false-recovery``,
``websocket-previous-response-not-found``, ``websocket-failed-continuation-evicts-cache`` and
``websocket-compact-new-chain``. That suite runs on Bun (its WebSocket client sends the
``Authorization`` header); llm-comply 0.5.0, in our test extras, has only the HTTP tests. So
each upstream test is mirrored here by a check of the same name, against the same rules:

- the same client events in the same order on the same sockets (``type: "response.create"``,
  ``store: false``, ``previous_response_id`` plus only the new input, a fresh socket for the
  reconnect, a ``function_call_output`` for a call that does not exist, the compacted window
  passed back as input without ``previous_response_id``);
- a turn ends at its terminal response event (``response.completed`` / ``.incomplete`` /
  ``.failed``) or at an ``error`` event (upstream ``makeWebSocketSession``), 30 s per turn;
- the same verdicts: every event valid and the final response valid and ``completed`` (upstream
  ``streamingEvents``, ``streamingSchema``, ``completedStatus``, with the SDK's own models in
  strict mode standing in for the spec's zod schemas: ``tests/conformance.py``), the error code
  ``previous_response_not_found`` where upstream expects it, a failed turn (an ``error`` event,
  an error code or status ``failed``) where upstream expects one.

Two differences, on purpose (the rules under test are the transport's, not the model's):

- the prompts are the bundled model's documented prompts (docs/bundled-model.md: ``Reply
  with: hello`` / ``goodbye`` and their two-turn chain) instead of upstream's ("Count from 1 to
  3.", "Remember the code word: cobalt."), which a 0.5M-parameter model answers with no stop
  token, ending ``incomplete`` at the context window;
- ``websocket-compact-new-chain`` compacts a longer history with a capped summary: this server
  refuses to compact a history its summary would not shorten (docs/compaction.md; the same
  reason llm-comply's ``compact-response`` is a documented failure in ``make conformance``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tests.conformance import assert_stream_invariants

__all__ = ["CHECKS", "run_checks"]

TURN_SECONDS = 30  # upstream's per-turn timer
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
HELLO = "Reply with: hello"
GOODBYE = "Reply with: goodbye"

Event = dict[str, Any]


@dataclass(slots=True)
class Turn:
    """One ``response.create``'s events up to its terminal or ``error`` event."""

    events: list[Event] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def final(self) -> Event | None:
        last = self.events[-1] if self.events else None
        if last is not None and last.get("type") in TERMINAL:
            response = last.get("response")
            return response if isinstance(response, dict) else None
        return None

    @property
    def error_code(self) -> str | None:
        """The ``error`` event's code, or the failed response's (upstream ``getTurnErrorCode``)."""
        last = self.events[-1] if self.events else {}
        for holder in (last, self.final or {}):
            error = holder.get("error")
            if isinstance(error, dict) and isinstance(error.get("code"), str):
                return str(error["code"])
        return None

    @property
    def failed(self) -> bool:
        """Upstream ``isFailedTurn``: an error event, an error code, or status ``failed``."""
        last = self.events[-1] if self.events else {}
        final = self.final or {}
        return (
            last.get("type") == "error"
            or self.error_code is not None
            or (final.get("status") == "failed")
        )


@dataclass(frozen=True, slots=True)
class Server:
    base_url: str  # http://host:port (no /v1)
    api_key: str
    model: str
    # The server runs with --background-key always (make conformance): every Response says
    # `background`, as Open Responses requires.
    background_key: bool = False

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + (
            "/v1/responses"
        )

    def socket(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return connect(self.ws_url, additional_headers=headers, open_timeout=TURN_SECONDS)

    def create(self, **body: Any) -> Event:
        return {"type": "response.create", "model": self.model, **body}


def turn(socket: ClientConnection, body: Event) -> Turn:
    """Send one ``response.create``; read until its terminal event or an ``error`` event."""
    result = Turn()
    socket.send(json.dumps(body))
    deadline = time.monotonic() + TURN_SECONDS
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            result.errors.append("Timed out waiting for terminal WebSocket response event")
            return result
        try:
            raw = socket.recv(timeout=left)
        except TimeoutError:
            continue
        except Exception as exc:  # the socket closed
            result.errors.append(f"WebSocket closed before a terminal response event: {exc!r}")
            return result
        try:
            event = json.loads(raw)
        except ValueError:
            result.errors.append(f"Failed to parse WebSocket event data: {raw!r:.200}")
            continue
        result.events.append(event)
        if event.get("type") in TERMINAL or event.get("type") == "error":
            return result


def valid_completed(result: Turn, what: str, server: Server) -> list[str]:
    """Upstream ``streamingEvents`` + ``streamingSchema`` + the response schema +
    ``completedStatus``."""
    errors = [f"{what}: {e}" for e in result.errors]
    if not result.events:
        return [*errors, f"{what}: No streaming events received"]
    if result.final is None:
        return [*errors, f"{what}: no terminal response event (got {result.events[-1]!r:.300})"]
    try:
        final = assert_stream_invariants(
            [(e["type"], e) for e in result.events], background_key=server.background_key
        )
    except AssertionError as exc:
        return [*errors, f"{what}: {exc}"]
    if final.get("status") != "completed":
        errors.append(f'{what}: Expected status "completed" but got "{final.get("status")}"')
    return errors


def has_id(result: Turn, what: str) -> list[str]:
    final = result.final
    return [] if final and final.get("id") else [f"{what} did not return a response id"]


# -- the seven checks ---------------------------------------------------------------------------


def websocket_response(server: Server) -> list[str]:
    """``websocket-response``: one response over a socket; valid events, completed."""
    with server.socket() as socket:
        result = turn(
            socket, server.create(input=[{"type": "message", "role": "user", "content": HELLO}])
        )
    return valid_completed(result, "Turn 1", server)


def websocket_sequential_responses(server: Server) -> list[str]:
    """``websocket-sequential-responses``: two ``store: false`` creates on one socket, each
    ending in its own valid, completed response."""
    with server.socket() as socket:
        first = turn(socket, server.create(store=False, input=HELLO))
        second = turn(socket, server.create(store=False, input=GOODBYE))
    return valid_completed(first, "Turn 1", server) + valid_completed(second, "Turn 2", server)


def websocket_continuation(server: Server) -> list[str]:
    """``websocket-continuation``: a ``store: false`` response continued on the same socket with
    ``previous_response_id`` and only the new input."""
    with server.socket() as socket:
        first = turn(socket, server.create(store=False, input=HELLO))
        errors = first.errors + has_id(first, "First WebSocket turn")
        if errors:
            return errors
        assert first.final is not None
        second = turn(
            socket,
            server.create(store=False, previous_response_id=first.final["id"], input=GOODBYE),
        )
    errors = valid_completed(second, "Turn 2", server)
    final = second.final or {}
    if not errors and final.get("previous_response_id") != first.final["id"]:
        errors.append("Turn 2 does not name the first response as previous_response_id")
    return errors


def websocket_reconnect_store_false_recovery(server: Server) -> list[str]:
    """``websocket-reconnect-store-false-recovery``: a ``store: false`` response cannot be
    continued from a new socket (``previous_response_not_found``); a new response without
    ``previous_response_id`` on that socket then completes."""
    with server.socket() as socket:
        first = turn(socket, server.create(store=False, input=HELLO))
    errors = first.errors + has_id(first, "First WebSocket turn")
    if errors:
        return errors
    assert first.final is not None
    with server.socket() as socket:
        reconnect = turn(
            socket,
            server.create(store=False, previous_response_id=first.final["id"], input=GOODBYE),
        )
        recovery = turn(
            socket,
            server.create(
                store=False, input=[{"type": "message", "role": "user", "content": GOODBYE}]
            ),
        )
    errors = list(reconnect.errors)
    if reconnect.error_code != "previous_response_not_found":
        errors.append(
            "Expected previous_response_not_found after reconnecting a store:false chain but "
            f"got {reconnect.error_code or 'no error code'}"
        )
    return errors + valid_completed(recovery, "Recovery turn", server)


def websocket_previous_response_not_found(server: Server) -> list[str]:
    """``websocket-previous-response-not-found``: an uncached ``previous_response_id`` with
    ``store: false`` is ``previous_response_not_found``."""
    missing = f"resp_openresponses_missing_{int(time.time() * 1000)}"
    with server.socket() as socket:
        result = turn(socket, server.create(store=False, previous_response_id=missing, input=HELLO))
    errors = list(result.errors)
    if result.error_code != "previous_response_not_found":
        errors.insert(
            0,
            f"Expected previous_response_not_found but got {result.error_code or 'no error code'}",
        )
    return errors


def websocket_failed_continuation_evicts_cache(server: Server) -> list[str]:
    """``websocket-failed-continuation-evicts-cache``: a continuation that fails (a tool
    output for a call the previous response never made) evicts the previous response from the
    connection, so continuing it again is ``previous_response_not_found``."""
    with server.socket() as socket:
        first = turn(socket, server.create(store=False, input=HELLO))
        errors = first.errors + has_id(first, "First WebSocket turn")
        if errors:
            return errors
        assert first.final is not None
        previous = first.final["id"]
        output = {
            "type": "function_call_output",
            "call_id": "call_openresponses_missing",
            "output": "No matching tool call exists in the previous response.",
        }
        failed = turn(
            socket, server.create(store=False, previous_response_id=previous, input=[output])
        )
        retry = turn(
            socket, server.create(store=False, previous_response_id=previous, input=GOODBYE)
        )
    if not failed.failed:
        final = failed.final or {}
        errors += failed.errors
        errors.append(
            "Expected second WebSocket continuation turn to fail but got status "
            f"{final.get('status', 'no terminal response')}"
        )
    errors += retry.errors
    if retry.error_code != "previous_response_not_found":
        errors.append(
            "Expected previous_response_not_found after failed continuation eviction but got "
            f"{retry.error_code or 'no error code'}"
        )
    return errors


def websocket_compact_new_chain(server: Server) -> list[str]:
    """``websocket-compact-new-chain``: ``POST /responses/compact``'s output, passed back as a
    socket response's input (plus a new user message, no ``previous_response_id``), completes."""
    # Upstream compacts [user, assistant "OK.", user]; this server refuses to compact a history
    # its summary would not shorten (docs/compaction.md), so the older turn here is long and
    # the summary capped (``max_output_tokens``, an extension of this server).
    older = " ".join(f"Note {i}: the launch moves to Tuesday." for i in range(40))
    compact_body = {
        "model": server.model,
        "max_output_tokens": 16,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": older}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "hello"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": GOODBYE}],
            },
        ],
    }
    request = urllib.request.Request(
        f"{server.base_url}/v1/responses/compact",
        data=json.dumps(compact_body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TURN_SECONDS * 4) as reply:
            compacted = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return [f"HTTP {exc.code} from /responses/compact: {exc.read()[:300]!r}"]
    output = compacted.get("output")
    if not isinstance(output, list):
        return ["Compaction response did not include an output array"]
    body = server.create(
        store=False,
        input=[*output, {"type": "message", "role": "user", "content": HELLO}],
        tools=[],
    )
    with server.socket() as socket:
        result = turn(socket, body)
    return valid_completed(result, "WebSocket turn", server)


CHECKS: dict[str, Callable[[Server], list[str]]] = {
    "websocket-response": websocket_response,
    "websocket-sequential-responses": websocket_sequential_responses,
    "websocket-continuation": websocket_continuation,
    "websocket-reconnect-store-false-recovery": websocket_reconnect_store_false_recovery,
    "websocket-previous-response-not-found": websocket_previous_response_not_found,
    "websocket-failed-continuation-evicts-cache": websocket_failed_continuation_evicts_cache,
    "websocket-compact-new-chain": websocket_compact_new_chain,
}


def run_checks(
    base_url: str, api_key: str, model: str, *, background_key: bool = False
) -> dict[str, Any]:
    """Every check, one after another (one model: no parallel turns); a summary like
    ``conformance.llm_comply``'s."""
    server = Server(base_url, api_key, model, background_key)
    results: dict[str, list[str]] = {}
    for name, check in CHECKS.items():
        try:
            results[name] = check(server)
        except Exception as exc:  # a check that could not run is that check's failure
            results[name] = [f"{type(exc).__name__}: {exc}"]
    failed = {name: errors for name, errors in results.items() if errors}
    return {
        "ok": not failed,
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "total": len(results),
        "failures": failed,
    }
