"""The live status page: ``GET /`` (one HTML file, no build step), its data as JSON
(``GET /status``) and as a live event stream (``GET /status/events``).

Invariants:
- The page itself (``/``) is public, like ``/health``: it holds no data. Its data routes are
  behind the API key like every other route (``app.authenticate``); the page sends the key it
  is given as a bearer header over a fetch-based event stream.
- A view is one tenant's: its own running responses and jobs (the supervisor filters by
  owner), its own last requests (the status history filters by owner); the batch charts, the
  time to first token, the cache hit rate and the running totals are the whole server's,
  anonymous counts in which no other tenant's response is named.
- Nothing here owns state: the samples and request lines live in the status history actor
  (``actors.status``), the running responses in the supervisor; this module asks them and
  renders. Cancel is the ordinary ``POST /v1/responses/{id}/cancel`` (the page calls it).
- The page's own routes are not recorded as requests (the list shows the tenant's API work).
- The event stream ends when the server begins to shut down, so an open page never holds up
  the graceful close.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import trio
from quart import Response, g, request
from quart_trio import QuartTrio

from ..actors.status import (
    HISTORY_SECONDS,
    SAMPLE_SECONDS,
    RequestLine,
    StatusHistory,
    bucket_deltas,
    quantile,
    rates,
    ratio,
)
from ..startup import backend
from .common import json_response, runtime, sse_response, tenant
from .request_log import response_id_of

if TYPE_CHECKING:
    from ..actors.supervisor import RunningResponse
    from ..runtime import Runtime

PAGE_PATH = "/"
DATA_PATHS = ("/status", "/status/events")
# How often the event stream sends a view (the history samples once per SAMPLE_SECONDS).
UPDATE_SECONDS = 1.0
# Time to first token is summarised over this window.
TTFT_WINDOW_SECONDS = HISTORY_SECONDS


@cache
def page_html() -> bytes:
    return files("mlx_responses.http").joinpath("status_page.html").read_bytes()


@cache
def _backend(device: str) -> str:
    # The model actor's fact (MLX asked once on the generation thread), never MLX here.
    return backend(device)[0]


@cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-responses")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _sharded(rt: Runtime) -> str:
    """The backend line goes on with the ranks, mode and memory per rank."""
    topology = rt.model.topology
    return "" if topology is None else f"; {topology.describe()}"


def _server_part(rt: Runtime) -> dict[str, Any]:
    settings = rt.settings
    model = settings.model
    info = rt.model.info
    return {
        "model": info.alias,
        "path": info.path,
        "context_window": info.context_window,
        "tool_format": info.tool_format,
        "reasoning": info.has_thinking,
        "backend": _backend(rt.model.device) + _sharded(rt),
        "blas": None if rt.model.blas is None else rt.model.blas.to_json(),
        # The batch's sizes and where each came from (a flag, or the device's default).
        "sizes": rt.model.sizes.to_json(),
        # The ranks a sharded model runs on (None: one process).
        "distributed": (
            None if rt.model.topology is None else rt.model.topology.as_json(rt.model.fatal)
        ),
        "version": _version(),
        "started_at": rt.created_at,
        "flags": {
            "--ctx-size": model.context_size,
            "--decode-concurrency": model.completion_batch_size,
            "--prompt-concurrency": model.prefill_batch_size,
            "--prefill-step-size": model.prefill_step_size,
            "--max-sequences": model.max_sequences,
            "--prompt-cache-bytes": model.prompt_cache_bytes,
            "--prompt-cache-entries": model.prompt_cache_entries,
            "--blas-threads": "auto" if model.blas_threads is None else model.blas_threads,
            "--solo-decode": "on" if model.solo_decode else "off",
            "--kv-bits": None if model.kv_quant is None else model.kv_quant.bits,
            "--kv-group-size": None if model.kv_quant is None else model.kv_quant.group_size,
            "--store": settings.store.describe(),
            "--responses-background-max-jobs": settings.background_max_jobs,
            "--default-temperature": settings.default_temperature,
            "api keys": len(settings.api_keys.entries),
        },
    }


def _samples_part(history: StatusHistory) -> list[dict[str, Any]]:
    samples = history.samples
    tokens = dict(rates(samples, lambda s: s.tokens_generated))
    prompt = dict(rates(samples, lambda s: s.prompt_tokens))
    return [
        {
            "t": round(s.at, 3),
            "active": s.active,
            "queued": s.queued,
            "prefilling": s.prefilling,
            "decoding": s.decoding,
            "tokens_per_second": round(tokens.get(s.at, 0.0), 1),
            "prompt_tokens_per_second": round(prompt.get(s.at, 0.0), 1),
        }
        for s in samples
    ]


def _ttft_part(history: StatusHistory) -> dict[str, Any]:
    samples = history.samples
    if not samples:
        return {"window_seconds": TTFT_WINDOW_SECONDS, "count": 0}
    newest = samples[-1]
    oldest = next(s for s in samples if s.at >= newest.at - TTFT_WINDOW_SECONDS)
    window = bucket_deltas(oldest.ttft_counts, newest.ttft_counts)
    bounds = history.ttft_bounds

    def ms(q: float) -> float | None:
        value = quantile(q, bounds, window)
        return None if value is None else round(value * 1000, 1)

    return {
        "window_seconds": round(newest.at - oldest.at),
        "count": window[-1] if window else 0,
        "p50_ms": ms(0.5),
        "p90_ms": ms(0.9),
        "p99_ms": ms(0.99),
        "since_start_count": newest.ttft_counts[-1] if newest.ttft_counts else 0,
    }


def _cache_part(rt: Runtime, history: StatusHistory) -> dict[str, Any]:
    cache_now = rt.model.statistics().prompt_cache
    part: dict[str, Any] = {
        **cache_now.to_json(),
        "hit_rate": ratio(cache_now.hits, cache_now.hits + cache_now.misses),
    }
    samples = history.samples
    if samples:
        first, last = samples[0], samples[-1]
        hits, misses = last.cache_hits - first.cache_hits, last.cache_misses - first.cache_misses
        part["window_hit_rate"] = ratio(hits, hits + misses)
        part["window_lookups"] = max(hits + misses, 0)
    return part


def _running_part(running: tuple[RunningResponse, ...]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.response_id,
            "kind": "background" if r.background else "foreground",
            "status": r.status,
            "age_seconds": round(r.age_seconds, 1),
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
        }
        for r in running
    ]


def _request_part(line: RequestLine) -> dict[str, Any]:
    return {
        "at": round(line.at, 3),
        "method": line.method,
        "path": line.path,
        "status": line.status,
        "duration_ms": line.duration_ms,
        "response_id": line.response_id,
        "stream": line.stream,
    }


async def status_view(rt: Runtime, owner: str) -> dict[str, Any]:
    """One tenant's view of the server, as the page renders it."""
    history = await rt.status.history(owner) if rt.status is not None else StatusHistory((), (), ())
    running = await rt.responses.running(owner)
    books = rt.responses.statistics()
    batch = rt.model.statistics()
    return {
        "object": "mlx.status",
        "now": round(time.time(), 3),
        "interval_seconds": SAMPLE_SECONDS,
        "tenant": owner or None,
        "server": _server_part(rt),
        "batch": {
            "active": batch.active,
            "queued": batch.queued,
            "prefilling": batch.prefilling,
            "decoding": batch.decoding,
            "capacity": rt.model.sizes.completion_batch_size,
            "tokens_generated": batch.tokens_generated,
            "kv_bytes": batch.batch_kv_bytes,
        },
        # Every tenant's, as counts only.
        "totals": {"running": books.running, "jobs_active": books.jobs_active},
        "samples": _samples_part(history),
        "ttft": _ttft_part(history),
        "prompt_cache": _cache_part(rt, history),
        "responses": _running_part(running),
        "requests": [_request_part(line) for line in history.requests],
    }


async def status_page() -> Response:
    response = Response(page_html(), status=200, mimetype="text/html")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
    )
    return response


async def status_json() -> Response:
    return json_response(await status_view(runtime(), tenant()))


async def status_events() -> Response:
    rt, owner = runtime(), tenant()

    async def body() -> AsyncIterator[bytes]:
        while True:
            view = await status_view(rt, owner)
            data = json.dumps(view, separators=(",", ":"))
            yield f"event: status\ndata: {data}\n\n".encode()
            with trio.move_on_after(UPDATE_SECONDS) as waiting:
                await rt.wait_stopping()
            if not waiting.cancelled_caught:
                return  # shutting down: an open page must not hold up the graceful close

    return sse_response(body())


def install_status_page(app: QuartTrio) -> None:
    """The page's routes and the hook that tells the status history each answered request."""

    @app.after_request
    async def record_request(response: Response) -> Response:
        rt = runtime()
        path = request.path
        if rt.status is None or path == PAGE_PATH or path in DATA_PATHS:
            return response
        started = getattr(g, "request_started", None)
        duration = 0.0 if started is None else (time.perf_counter() - started) * 1000
        line = RequestLine(
            at=time.time(),
            method=request.method,
            path=path,
            status=response.status_code,
            duration_ms=round(duration, 1),
            response_id=await response_id_of(response),
            stream=response.mimetype == "text/event-stream",
        )
        await rt.status.saw_request(tenant(), line)
        return response

    app.add_url_rule(PAGE_PATH, view_func=status_page, methods=["GET"], endpoint="status_page")
    app.add_url_rule("/status", view_func=status_json, methods=["GET"], endpoint="status")
    app.add_url_rule(
        "/status/events", view_func=status_events, methods=["GET"], endpoint="status_events"
    )
