"""Shared pieces of the HTTP edge: JSON in and out, the error envelope, route mounting."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, g
from quart_trio import QuartTrio

from ..protocol.errors import ApiError, invalid_request
from .json_constants import Constants

View = Callable[..., Awaitable[Response]]


def json_response(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, mimetype="application/json")


def error_response(error: ApiError) -> Response:
    return json_response(error.envelope(), error.status)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def decode_json_body(raw: bytes | str) -> object:
    """Strict JSON (decision 3): no duplicate keys, no NaN/Infinity, UTF-8."""
    if isinstance(raw, str):
        raw = raw.encode()
    if not raw.strip():
        raise invalid_request("The request body is empty; expected a JSON object.", None)
    constants = Constants()  # issue 13: a NaN's refusal names its key
    try:
        decoded = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=constants.record,
        )
    except UnicodeDecodeError:
        raise invalid_request("The request body is not valid UTF-8.", None) from None
    except ValueError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", None) from None
    constants.refuse_any(decoded)
    return decoded


def mount(app: QuartTrio, rule: str, methods: list[str]) -> Callable[[View], View]:
    """Register a view at ``/v1<rule>`` and at ``<rule>`` (decision 19)."""

    def register(view: View) -> View:
        name = view.__name__
        app.add_url_rule(f"/v1{rule}", view_func=view, methods=methods, endpoint=f"v1.{name}")
        app.add_url_rule(rule, view_func=view, methods=methods, endpoint=name)
        return view

    return register


def sse_response(body: Any) -> Response:
    """An event-stream response over an async iterator of bytes."""
    response = Response(body, mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None  # an event stream lasts as long as generation does
    return response


def tenant() -> str:
    """The tenant of the current request (set by the app's authentication hook)."""
    return str(getattr(g, "tenant", ""))
