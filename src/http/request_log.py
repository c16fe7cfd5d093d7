"""One structured log line per HTTP request (logger ``mlx_responses.requests``, level INFO).

Invariants:
- Each line is one JSON object: ``method``, ``path`` (no query string), ``status``,
  ``duration_ms`` (to the response headers; a stream's body may run on), ``response_id``
  (the Response or Message the request created or read, else null), ``tenant`` (the tenant's
  label, never its key), ``stream``.
- WebSocket traffic logs on the same logger with ``method: "WS"``: a line when a
  connection opens and when it closes, and one per ``response.create`` when its response ends
  (``log_socket``).
- Never a key, a header value, a body or any generated text: the response id is read from the
  first bytes of a JSON body (``{"id":"resp_...``) or set by a route in ``g.response_id``.
"""

from __future__ import annotations

import json
import logging
import re
import time

from quart import Response, g, request
from quart.wrappers.response import DataBody
from quart_trio import QuartTrio

log = logging.getLogger("mlx_responses.requests")

_LEADING_ID = re.compile(rb'^\{"id":"((?:resp|msg|conv|file|cmp)[-_][A-Za-z0-9_-]{1,120})"')


async def _response_id(response: Response) -> str | None:
    explicit = getattr(g, "response_id", None)
    if isinstance(explicit, str):
        return explicit
    if response.mimetype != "application/json" or not isinstance(response.response, DataBody):
        return None
    head = (await response.get_data(as_text=False))[:200]
    match = _LEADING_ID.match(head)
    return match.group(1).decode() if match else None


response_id_of = _response_id  # the status page's request lines read it the same way


def install_request_log(app: QuartTrio) -> None:
    """Register the hooks; call before any other ``before_request`` so every request is timed."""

    @app.before_request
    async def start_clock() -> None:
        g.request_started = time.perf_counter()

    @app.after_request
    async def log_line(response: Response) -> Response:
        if log.isEnabledFor(logging.INFO):
            started = getattr(g, "request_started", None)
            duration = 0.0 if started is None else (time.perf_counter() - started) * 1000
            line = {
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round(duration, 1),
                "response_id": await _response_id(response),
                "tenant": str(getattr(g, "tenant", "")),
                "stream": response.mimetype == "text/event-stream",
            }
            log.info("request %s", json.dumps(line, separators=(",", ":")))
        return response


def log_socket(event: str, **fields: object) -> None:
    """One line for WebSocket traffic on the same logger: ``open`` and ``close`` of a
    connection, and each ``response.create`` when it ends (its response id, the HTTP-like
    ``status``: 200 for a response that ran, whatever it ended as, else the refusal's status,
    and the response's own terminal ``response_status``)."""
    if log.isEnabledFor(logging.INFO):
        line = {"method": "WS", "path": "/v1/responses", "event": event, **fields}
        log.info("request %s", json.dumps(line, separators=(",", ":")))
