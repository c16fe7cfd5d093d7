"""The Quart-Trio app: HTTP in, messages to actors, events out.

Invariants:
- Thin: parse and validate at the edge, then talk to actors only through their handles.
- Every error, streaming set-up included, is OpenAI's envelope (decision 2); anything
  unexpected is a 500 ``server_error`` and the server keeps serving.
- A streaming body only iterates the response actor; when the client hangs up, Quart cancels
  or closes the body and its ``finally`` abandons the response, which removes the sequence from
  the model's batch at the next step.
- Every route is mounted with and without the ``/v1`` prefix (decision 19).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..actors.conversation_store import ConversationStoreHandle
from ..actors.model import ModelHandle
from ..actors.response import open_response
from ..actors.response_store import ResponseStoreHandle
from ..protocol.errors import ApiError, invalid_request, not_found
from ..protocol.sse import encode_sse
from .schemas import parse_create_request

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppContext:
    """The handles the HTTP layer may use."""

    model: ModelHandle
    store: ResponseStoreHandle
    conversations: ConversationStoreHandle
    created_at: int


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, mimetype="application/json")


def error_response(error: ApiError) -> Response:
    return _json(error.envelope(), error.status)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def decode_json_body(raw: bytes) -> object:
    """Strict JSON (decision 3): no duplicate keys, no NaN/Infinity, UTF-8."""
    if not raw.strip():
        raise invalid_request("The request body is empty; expected a JSON object.", None)
    try:
        return json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
        )
    except UnicodeDecodeError:
        raise invalid_request("The request body is not valid UTF-8.", None) from None
    except ValueError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", None) from None


def create_app(ctx: AppContext) -> QuartTrio:
    app = QuartTrio("mlx_responses")
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024 * 1024

    def route(
        rule: str, methods: list[str]
    ) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
        def register(
            view: Callable[..., Awaitable[Response]],
        ) -> Callable[..., Awaitable[Response]]:
            name = view.__name__
            app.add_url_rule(f"/v1{rule}", view_func=view, methods=methods, endpoint=f"v1.{name}")
            app.add_url_rule(rule, view_func=view, methods=methods, endpoint=name)
            return view

        return register

    @app.errorhandler(ApiError)
    async def on_api_error(error: ApiError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def on_http_error(error: HTTPException) -> Response:
        status = error.code or 500
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        message = (
            f"Unknown route: {request.method} {request.path}."
            if status in (404, 405)
            else (error.description or error.name)
        )
        return error_response(ApiError(status, kind, message))

    @app.errorhandler(Exception)
    async def on_unexpected(error: Exception) -> Response:
        log.exception("unexpected error", exc_info=error)
        return error_response(ApiError(500, "server_error", "The server had an internal error."))

    @app.get("/health")
    async def health() -> Response:
        stats = ctx.model.statistics()
        return _json(
            {
                "status": "ok",
                "model": ctx.model.info.alias,
                "batch": {
                    "active": stats.active,
                    "queued": stats.queued,
                    "prefilling": stats.prefilling,
                    "decoding": stats.decoding,
                    "tokens_generated": stats.tokens_generated,
                    "sequences_finished": stats.sequences_finished,
                    "sequences_cancelled": stats.sequences_cancelled,
                },
            }
        )

    def model_object() -> dict[str, Any]:
        return {
            "id": ctx.model.info.alias,
            "object": "model",
            "created": ctx.created_at,
            "owned_by": "mlx-responses",
        }

    @route("/models", ["GET"])
    async def list_models() -> Response:
        return _json({"object": "list", "data": [model_object()]})

    @route("/models/<path:model_id>", ["GET"])
    async def get_model(model_id: str) -> Response:
        if model_id not in (ctx.model.info.alias, ctx.model.info.path):
            raise not_found(
                f"The model '{model_id}' does not exist.", param="model", code="model_not_found"
            )
        return _json(model_object())

    @route("/responses", ["POST"])
    async def create_response() -> Response:
        raw = await request.get_data(cache=False, as_text=False)
        create = parse_create_request(
            decode_json_body(raw if isinstance(raw, bytes) else raw.encode())
        )
        run = await open_response(create, ctx.model, ctx.store)
        if not create.stream:
            try:
                return _json(await run.run_to_end())
            finally:
                run.abandon()

        async def body() -> AsyncIterator[bytes]:
            try:
                while (events := await run.next_events()) is not None:
                    yield b"".join(encode_sse(event) for event in events)
            finally:
                run.abandon()

        response = Response(body(), mimetype="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Accel-Buffering"] = "no"
        response.timeout = None  # an event stream lasts as long as generation does
        return response

    @route("/responses/<response_id>", ["GET"])
    async def get_response(response_id: str) -> Response:
        found = await ctx.store.get(response_id)
        if found is None:
            raise not_found(f"No response found with id '{response_id}'.", param="response_id")
        return _json(found)

    @route("/responses/<response_id>", ["DELETE"])
    async def delete_response(response_id: str) -> Response:
        if not await ctx.store.delete(response_id):
            raise not_found(f"No response found with id '{response_id}'.", param="response_id")
        return _json({"id": response_id, "object": "response", "deleted": True})

    return app
