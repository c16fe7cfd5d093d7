"""``GET /openapi.json``: an OpenAPI 3.1 description of the routes this server mounts.

Invariants:
- The paths are read from the app's own URL map when first asked, so every mounted ``/v1``
  route (and ``/health``) is listed and nothing that is not. The routes without the ``/v1``
  prefix are the same operations and are not listed twice.
- Request bodies use this server's own Pydantic schemas where it has them
  (``CreateResponseBody``, ``CompactBody``); 200 bodies use the pinned ``openai`` SDK's types,
  which every 200 body validates against strictly, when the SDK is installed (it is a test
  dependency, not the server's). Other bodies are described as JSON objects.
  Every operation's ``default`` response is OpenAI's error envelope.
- Built once per app and cached; serving it reads no state and needs no key beyond the usual.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any, Final

from pydantic import TypeAdapter

from .compact_schema import CompactBody
from .schemas import CreateResponseBody

if TYPE_CHECKING:
    from quart_trio import QuartTrio

__all__ = ["openapi_document", "register_openapi_route"]

_REF: Final = "#/components/schemas/{model}"
_ARGUMENT: Final = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")

# (method, path) -> the body schema's model; the rest take a JSON object, or nothing.
_BODIES: Final[dict[tuple[str, str], Any]] = {
    ("POST", "/v1/responses"): CreateResponseBody,
    ("POST", "/v1/responses/input_tokens"): CreateResponseBody,
    ("POST", "/v1/responses/compact"): CompactBody,
}
_NO_BODY: Final = frozenset({"GET", "DELETE"})
_NO_BODY_POSTS: Final = frozenset({"/v1/responses/{response_id}/cancel"})
# (method, path) -> the SDK type of its 200 body ("module:name" in the ``openai`` package, a
# test dependency only: without it installed these bodies are described as JSON objects).
_REPLIES: Final[dict[tuple[str, str], str]] = {
    ("POST", "/v1/responses"): "responses:Response",
    ("GET", "/v1/responses/{response_id}"): "responses:Response",
    ("POST", "/v1/responses/{response_id}/cancel"): "responses:Response",
    ("GET", "/v1/responses/{response_id}/input_items"): "responses:ResponseItemList",
    ("POST", "/v1/responses/compact"): "responses:CompactedResponse",
    ("POST", "/v1/conversations"): "conversations:Conversation",
    ("GET", "/v1/conversations/{conversation_id}"): "conversations:Conversation",
    ("POST", "/v1/conversations/{conversation_id}"): "conversations:Conversation",
    ("DELETE", "/v1/conversations/{conversation_id}"): "conversations:ConversationDeletedResource",
    ("POST", "/v1/conversations/{conversation_id}/items"): "conversations:ConversationItemList",
    ("GET", "/v1/conversations/{conversation_id}/items"): "conversations:ConversationItemList",
    (
        "GET",
        "/v1/conversations/{conversation_id}/items/{item_id}",
    ): "conversations:ConversationItem",
    ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"): "conversations:Conversation",
    ("POST", "/v1/files"): ":FileObject",
    ("GET", "/v1/files/{file_id}"): ":FileObject",
    ("DELETE", "/v1/files/{file_id}"): ":FileDeleted",
    ("GET", "/v1/models/{model_id}"): ":Model",
}


def _sdk_type(spec: str) -> Any:
    """The ``openai.types`` class named by ``spec``, or ``None`` without the SDK."""
    module, _, name = spec.partition(":")
    try:
        found = importlib.import_module(f"openai.types.{module}" if module else "openai.types")
    except ImportError:
        return None
    return getattr(found, name, None)


_STREAMED: Final = frozenset({("POST", "/v1/responses"), ("POST", "/v1/messages")})
_ERROR: Final = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_UPLOAD: Final = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream"},
        "purpose": {"type": "string"},
        "expires_after[anchor]": {"type": "string"},
        "expires_after[seconds]": {"type": "string"},
    },
}


def _schema(kind: Any, components: dict[str, Any]) -> dict[str, Any]:
    """A ``$ref`` to ``kind``'s schema, adding it and its definitions to ``components``."""
    name = getattr(kind, "__name__", None) or str(kind)
    if name not in components:
        schema = TypeAdapter(kind).json_schema(ref_template=_REF)
        for key, value in schema.pop("$defs", {}).items():
            components.setdefault(key, value)
        components[name] = schema
    return {"$ref": _REF.format(model=name)}


def _operation(method: str, path: str, endpoint: str, components: dict[str, Any]) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": endpoint.removeprefix("v1.")}
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"\{([^}]+)\}", path)
    ]
    if parameters:
        operation["parameters"] = parameters
    if method == "POST" and path == "/v1/files":
        operation["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": _UPLOAD}},
        }
    elif (method, path) in _BODIES:
        body = _schema(_BODIES[method, path], components)
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    elif method not in _NO_BODY and path not in _NO_BODY_POSTS:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    reply: dict[str, Any] = {"type": "object"}
    sdk_type = _sdk_type(_REPLIES[method, path]) if (method, path) in _REPLIES else None
    if sdk_type is not None:
        reply = _schema(sdk_type, components)
    content: dict[str, Any] = {"application/json": {"schema": reply}}
    if path.endswith("/content"):
        content = {"application/octet-stream": {"schema": {"type": "string"}}}
    if (method, path) in _STREAMED:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    operation["responses"] = {
        "200": {"description": "OK", "content": content},
        "default": {
            "description": "An error (OpenAI's envelope)",
            "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}},
        },
    }
    return operation


def openapi_document(app: QuartTrio, title: str = "mlx-responses") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app``'s ``/v1`` routes and ``/health``."""
    components: dict[str, Any] = {"Error": _ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if not (rule.rule.startswith("/v1/") or rule.rule == "/health") or rule.websocket:
            continue  # (the WebSocket mode is described in docs/websocket.md, not here)
        path = _ARGUMENT.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(
                method, path, rule.endpoint, components
            )
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": components},
    }


def register_openapi_route(app: QuartTrio) -> None:
    """Mount ``GET /openapi.json`` (built on first request, then cached)."""
    from .common import json_response

    cached: list[dict[str, Any]] = []

    @app.get("/openapi.json")
    async def openapi() -> Any:
        if not cached:
            cached.append(openapi_document(app))
        return json_response(cached[0])
