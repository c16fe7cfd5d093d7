"""Shared pieces of the HTTP edge: JSON in and out, the error envelope, route mounting."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from quart import Response, current_app, g
from quart_trio import QuartTrio

from ..protocol.errors import ApiError, invalid_request
from ..protocol.text import find_unencodable
from .json_constants import Constants

if TYPE_CHECKING:
    from ..protocol.items.sealed import Sealer
    from ..runtime import Runtime

# The deepest nesting of arrays and objects a JSON body may have: deeper bodies are refused
# at the edge rather than left to exhaust a recursive consumer (a JSON Schema compiler, ...).
MAX_JSON_DEPTH = 100

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
    """Strict JSON: no duplicate keys, no NaN/Infinity, UTF-8; at most
    ``MAX_JSON_DEPTH`` deep; every string (keys too) encodable as UTF-8, so no lone surrogate
    escape (``"\\ud800"``) gets past the edge."""
    if isinstance(raw, str):
        raw = raw.encode()
    if not raw.strip():
        raise invalid_request("The request body is empty; expected a JSON object.", None)
    constants = Constants()  # a NaN's refusal names its key
    try:
        decoded = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=constants.record,
        )
    except UnicodeDecodeError:
        raise invalid_request("The request body is not valid UTF-8.", None) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", None) from None
    if json_depth(decoded) > MAX_JSON_DEPTH:
        raise _too_deep()
    constants.refuse_any(decoded)
    bad = find_unencodable(decoded)
    if bad is not None:
        raise invalid_request(bad.message(), bad.path or None, code="invalid_text")
    return decoded


def _too_deep() -> ApiError:
    return invalid_request(
        f"The request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays "
        "and objects are accepted.",
        None,
    )


def json_depth(value: object) -> int:
    """The nesting depth of arrays and objects in a decoded JSON value (iterative)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def mount(app: QuartTrio, rule: str, methods: list[str]) -> Callable[[View], View]:
    """Register a view at ``/v1<rule>`` and at ``<rule>``."""

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


def runtime() -> Runtime:
    """The running server (its settings and actors), for the current request."""
    return cast("Runtime", current_app.extensions["mlx_responses"])


def sealer() -> Sealer:
    """The server's reasoning sealer."""
    return cast("Sealer", current_app.extensions["mlx_responses.sealer"])


def tenant() -> str:
    """The tenant of the current request (set by the app's authentication hook)."""
    return str(getattr(g, "tenant", ""))
