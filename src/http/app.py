"""The Quart-Trio app: HTTP in, messages to actors, events out.

Invariants:
- Thin: parse and validate at the edge, then talk to actors only through their handles (the
  ``Runtime`` in ``app.extensions``, read with ``common.runtime()``).
- Every error, streaming set-up included, is OpenAI's envelope; anything
  unexpected is a 500 ``server_error`` and the server keeps serving.
- Every request's lifetime is a channel (``lifetime.RequestLifetimes`` wraps the ASGI app), so a
  response opened by a request learns when the request ends, wherever the client left.
- Every route reads (or discards) its request body before answering, so a keep-alive
  connection never wedges on an unread body; a body over the limit closes the connection.
- ``/v1/responses`` has a WebSocket mode (``websocket.py``); an upgrade on any other route gets
  a 404 in the envelope, never a 500.
- Every route is mounted with and without the ``/v1`` prefix.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from quart import Response, g, has_request_context, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ..protocol.errors import ApiError, not_found
from ..protocol.model_list import model_entry
from .auth import presented_key
from .common import decode_json_body, error_response, json_response, mount, runtime
from .conversations import register_conversation_routes
from .files import register_file_routes
from .lifetime import RequestLifetimes
from .limits import CountedRequest
from .messages import register_messages_routes
from .metrics import install_metrics
from .openapi import register_openapi_route
from .reasoning_secret import reasoning_sealer
from .request_log import install_request_log
from .responses import register_response_routes
from .status_page import PAGE_PATH, install_status_page
from .websocket import responses_socket

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = ["create_app", "decode_json_body"]

log = logging.getLogger(__name__)


def _where() -> str:
    if has_request_context():
        return f"{request.method} {request.path}"
    if has_websocket_context():
        return f"WebSocket {websocket.path}"
    return "this route"


async def authenticate() -> Response | None:
    """HTTP requests and WebSocket upgrades alike (an upgrade refused here is an HTTP 401)."""
    g.tenant = ""
    keys = runtime().settings.api_keys
    incoming = request if has_request_context() else websocket
    if not keys.enabled or incoming.path in ("/health", PAGE_PATH):  # the page holds no data
        return None
    headers = incoming.headers
    presented = presented_key(headers.get("Authorization"), headers.get("x-api-key"))
    tenant = keys.tenant_of(presented)
    if tenant is None:
        return error_response(
            ApiError(
                401,
                "authentication_error",
                "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )
        )
    g.tenant = tenant
    return None


async def drain_body(response: Response) -> Response:
    """Read whatever of the body the route left unread (bounded by the size limit)."""
    try:
        await request.body
    except RequestEntityTooLarge:
        response.headers["Connection"] = "close"
    return response


async def on_api_error(error: ApiError) -> Response:
    return error_response(error)


async def on_http_error(error: HTTPException) -> Response:
    status = error.code or 500
    if has_websocket_context() and status in (400, 404, 405):
        # An upgrade on a route that has only HTTP (werkzeug says "websocket mismatch").
        return error_response(
            ApiError(404, "not_found_error", f"There is no WebSocket mode at {websocket.path}.")
        )
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    message = (
        f"Unknown route: {_where()}." if status in (404, 405) else (error.description or error.name)
    )
    return error_response(ApiError(status, kind, message))


async def on_unexpected(error: Exception) -> Response:
    log.exception("unexpected error", exc_info=error)
    return error_response(ApiError(500, "server_error", "The server had an internal error."))


async def health() -> Response:
    rt = runtime()
    stats = rt.model.statistics()
    books = rt.responses.statistics()
    return json_response(
        {
            "status": "ok",
            "model": rt.model.info.alias,
            "batch": {
                "active": stats.active,
                "admitted": stats.admitted,
                "queued": stats.queued,
                "prefilling": stats.prefilling,
                "decoding": stats.decoding,
                "tokens_generated": stats.tokens_generated,
                "sequences_finished": stats.sequences_finished,
                "sequences_cancelled": stats.sequences_cancelled,
                "sequences_failed": stats.sequences_failed,
                "steps": stats.steps,
                "kv_bytes": stats.batch_kv_bytes,
            },
            "prompt_cache": stats.prompt_cache.to_json(),
            "blas": None if rt.model.blas is None else rt.model.blas.to_json(),
            # The ranks a sharded model runs on (None: one process).
            "distributed": (
                None if rt.model.topology is None else rt.model.topology.as_json(rt.model.fatal)
            ),
            "responses": {
                "tasks": books.tasks,
                "running": books.running,
                "jobs_active": books.jobs_active,
            },
        }
    )


def _model_object() -> dict[str, Any]:
    rt = runtime()
    info = rt.model.info  # with the context window and capabilities (what Codex reads)
    return model_entry(
        alias=info.alias,
        created=rt.created_at,
        context_window=info.context_window,
        has_thinking=info.has_thinking,
        tool_format=info.tool_format,
        input_modalities=info.input_modalities,
    )


async def list_models() -> Response:
    return json_response({"object": "list", "data": [_model_object()]})


async def get_model(model_id: str) -> Response:
    info = runtime().model.info
    if model_id not in (info.alias, info.path):
        raise not_found(
            f"The model '{model_id}' does not exist.", param="model", code="model_not_found"
        )
    return json_response(_model_object())


async def chat_completions() -> Response:
    # This server speaks the Responses API only (docs/api.md): a clear 404, not a silent miss.
    raise ApiError(
        404,
        "invalid_request_error",
        "The Chat Completions API is retired on this server; use POST /v1/responses.",
        code="chat_completions_retired",
    )


def create_app(rt: Runtime) -> QuartTrio:
    app = QuartTrio("mlx_responses")
    app.extensions["mlx_responses"] = rt
    # Seals reasoning (include reasoning.encrypted_content); its secret is read on first use.
    app.extensions["mlx_responses.sealer"] = reasoning_sealer(
        rt.model.info.alias, rt.settings.reasoning_secret_path()
    )
    # An id with an encoded slash is an unknown id (404 in the envelope), not a 308 redirect.
    app.url_map.merge_slashes = False
    app.asgi_app = RequestLifetimes(app.asgi_app)  # type: ignore[method-assign]
    # A larger body is 413 (Quart's RequestEntityTooLarge).
    app.config["MAX_CONTENT_LENGTH"] = rt.settings.max_request_bytes
    app.request_class = CountedRequest  # ... and so is a chunked one, counted as it arrives
    install_request_log(app)  # one structured line per request (before auth: 401s too)
    install_metrics(app, rt)  # /metrics and the request hooks (before auth)
    install_status_page(app)  # the status page at / and its data routes
    app.before_request(authenticate)
    app.before_websocket(authenticate)
    app.after_request(drain_body)
    app.register_error_handler(ApiError, on_api_error)
    app.register_error_handler(HTTPException, on_http_error)
    app.register_error_handler(Exception, on_unexpected)
    app.add_url_rule("/health", view_func=health, methods=["GET"])
    for rule in ("/v1/responses", "/responses"):
        app.add_websocket(rule, view_func=responses_socket, endpoint=f"ws{rule}")
    mount(app, "/models", ["GET"])(list_models)
    mount(app, "/models/<path:model_id>", ["GET"])(get_model)
    mount(app, "/chat/completions", ["POST"])(chat_completions)
    register_response_routes(app)
    register_conversation_routes(app)
    register_messages_routes(app)
    register_file_routes(app, rt.files)
    register_openapi_route(app)  # last: it lists the routes above
    return app
