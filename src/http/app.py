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

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..actors.conversation_store import ConversationStoreHandle
from ..actors.file_store import FileStoreHandle
from ..actors.jobs import JobSupervisorHandle
from ..actors.live import LiveRegistryHandle
from ..actors.model import ModelHandle
from ..actors.reasoning_echo import ReasoningEchoHandle
from ..actors.response import Services
from ..actors.response_store import ResponseStoreHandle
from ..protocol.errors import ApiError, not_found
from ..protocol.model_list import model_entry
from .auth import OPEN, ApiKeys, presented_key
from .common import View, decode_json_body, error_response, json_response, mount
from .conversations import register_conversation_routes
from .files import register_file_routes
from .messages import register_messages_routes
from .request_log import install_request_log
from .responses import register_response_routes

__all__ = ["AppContext", "create_app", "decode_json_body"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppContext:
    """The handles the HTTP layer may use."""

    model: ModelHandle
    store: ResponseStoreHandle
    conversations: ConversationStoreHandle
    live: LiveRegistryHandle
    jobs: JobSupervisorHandle
    files: FileStoreHandle
    created_at: int
    ephemeral_ttl_seconds: float = 600.0
    drop_unsupported_tools: bool = False
    api_keys: ApiKeys = OPEN
    max_request_bytes: int = 32 * 1024 * 1024
    echo: ReasoningEchoHandle | None = None


def create_app(ctx: AppContext) -> QuartTrio:
    app = QuartTrio("mlx_responses")
    # A larger body is 413 before it is read (Quart's RequestEntityTooLarge).
    app.config["MAX_CONTENT_LENGTH"] = ctx.max_request_bytes
    install_request_log(app)  # issue 13: one structured line per request

    @app.before_request
    async def authenticate() -> Response | None:
        g.tenant = ""
        if not ctx.api_keys.enabled or request.path == "/health":
            return None
        presented = presented_key(
            request.headers.get("Authorization"), request.headers.get("x-api-key")
        )
        tenant = ctx.api_keys.tenant_of(presented)
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

    services = Services(
        ctx.model,
        ctx.store,
        ctx.conversations,
        ctx.live,
        ctx.jobs,
        ephemeral_ttl_seconds=ctx.ephemeral_ttl_seconds,
        echo=ctx.echo,
    )

    def route(rule: str, methods: list[str]) -> Callable[[View], View]:
        return mount(app, rule, methods)

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
        return json_response(
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
        info = ctx.model.info  # issue 13: with the context window and capabilities
        return model_entry(
            alias=info.alias,
            created=ctx.created_at,
            context_window=info.context_window,
            has_thinking=info.has_thinking,
            tool_format=info.tool_format,
        )

    @route("/models", ["GET"])
    async def list_models() -> Response:
        return json_response({"object": "list", "data": [model_object()]})

    @route("/models/<path:model_id>", ["GET"])
    async def get_model(model_id: str) -> Response:
        if model_id not in (ctx.model.info.alias, ctx.model.info.path):
            raise not_found(
                f"The model '{model_id}' does not exist.", param="model", code="model_not_found"
            )
        return json_response(model_object())

    @route("/chat/completions", ["POST"])
    async def chat_completions() -> Response:
        # Spec 001 / decision 15: this server speaks the Responses API only.
        raise ApiError(
            404,
            "invalid_request_error",
            "The Chat Completions API is retired on this server; use POST /v1/responses.",
            code="chat_completions_retired",
        )

    register_response_routes(
        app, services, drop_unsupported_tools=ctx.drop_unsupported_tools, files=ctx.files
    )
    register_conversation_routes(app, ctx)
    register_messages_routes(app, services)
    register_file_routes(app, ctx.files)

    return app
