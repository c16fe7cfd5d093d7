"""``GET /metrics``: the server's state in Prometheus text format.

Invariants:
- One ``Metrics`` per server (its own ``CollectorRegistry``), so several servers in one
  process (the tests) never share series.
- What the actors already count (batch, tokens, sequences, prompt cache, jobs, sockets,
  stores) is read from their ``statistics()`` snapshots at scrape time by a custom collector:
  nothing is copied or double-counted, and a scrape sends no message to any actor.
- What only happens at an edge is observed here: each HTTP request (route template, method,
  status, latency to the response's headers) by an ``after_request`` hook, and each
  response's time to first token and decode speed (``actors.timings``) by the response task.
- ``/metrics`` is behind the API key like every route but ``/health`` (``app.authenticate``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Response, g, request
from quart_trio import QuartTrio

if TYPE_CHECKING:
    from ..engine.cache_stats import DiskStats
    from ..runtime import Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class Metrics:
    """The series observed at the edges, and the registry ``/metrics`` renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mlx_responses_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "mlx_responses_http_request_duration_seconds",
            "Time from a request's arrival to its response headers (a stream's start).",
            ("route", "method"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "mlx_responses_time_to_first_token_seconds",
            "Time from a response's creation (prompt prepared) to its first generated token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.tps = Histogram(
            "mlx_responses_decode_tokens_per_second",
            "Output tokens per second of each response, after its first token.",
            buckets=TPS_BUCKETS,
            registry=self.registry,
        )

        self.cancellations = Counter(
            "mlx_responses_responses_cancelled",
            "Responses ended by cancellation, by reason (cancel requested, client "
            "disconnected, shutdown, steered, other).",
            ("reason",),
            registry=self.registry,
        )

    # actors.timings.TimingsObserver
    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def finished(self, tokens: int, decode_seconds: float) -> None:
        self.tps.observe(tokens / decode_seconds)

    def cancelled(self, reason: str) -> None:
        self.cancellations.labels(reason).inc()

    # actors.status.TtftHistogram (the status page's percentiles)
    @property
    def ttft_bounds(self) -> tuple[float, ...]:
        return (*map(float, TTFT_BUCKETS), math.inf)

    def ttft_counts(self) -> tuple[int, ...]:
        (family,) = self.ttft.collect()
        return tuple(int(s.value) for s in family.samples if s.name.endswith("_bucket"))

    def watch(self, rt: Runtime) -> None:
        self.registry.register(RuntimeCollector(rt))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RuntimeCollector(Collector):
    """The actors' snapshots as metric families, read at scrape time."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families are built at scrape time

    def collect(self) -> Iterator[Metric]:
        rt = self._rt
        yield _model_info(rt)
        yield from _batch(rt)
        yield from _distributed(rt)
        yield from _responses(rt)
        yield from _stores(rt)


def _model_info(rt: Runtime) -> Metric:
    """The served model (value 1) and what clients see of it, as labels."""
    info = rt.model.info
    return _labelled(
        GaugeMetricFamily(
            "mlx_responses_model_info",
            "The served model (value 1), its alias, context window and tool format.",
            labels=("model", "context_window", "tool_format", "reasoning"),
        ),
        [
            (
                (
                    info.alias,
                    str(info.context_window),
                    info.tool_format,
                    str(info.has_thinking).lower(),
                ),
                1,
            )
        ],
    )


def _batch(rt: Runtime) -> Iterator[Metric]:
    """The model's batch and its prompt cache, from one snapshot."""
    batch = rt.model.statistics()
    yield _labelled(
        GaugeMetricFamily(
            "mlx_responses_batch_sequences",
            "Sequences in the model's batch now, by state.",
            labels=("state",),
        ),
        [
            (("active",), batch.active),
            (("queued",), batch.queued),
            (("prefilling",), batch.prefilling),
            (("decoding",), batch.decoding),
            (("admitted",), batch.admitted),
        ],
    )
    yield _counter(
        "mlx_responses_generated_tokens",
        "Tokens the model has generated since start.",
        batch.tokens_generated,
    )
    yield _counter(
        "mlx_responses_prompt_tokens",
        "Prompt tokens the model has prefilled since start (cache hits excluded).",
        batch.prompt_tokens_processed,
    )
    yield _counter(
        "mlx_responses_batch_steps", "Generation steps of the batch since start.", batch.steps
    )
    yield _gauge(
        "mlx_responses_batch_kv_bytes",
        "KV-cache bytes the sequences in the model's batch hold now (allocated, as of the "
        "latest step).",
        batch.batch_kv_bytes,
    )
    yield _sizes(rt)
    yield _labelled(
        CounterMetricFamily(
            "mlx_responses_sequences_ended",
            "Sequences that left the batch since start, by how they ended.",
            labels=("reason",),
        ),
        [
            (("finished",), batch.sequences_finished),
            (("cancelled",), batch.sequences_cancelled),
            (("failed",), batch.sequences_failed),
        ],
    )
    cache = batch.prompt_cache
    yield _counter("mlx_responses_prompt_cache_hits", "Prompt-cache lookups that hit.", cache.hits)
    yield _counter(
        "mlx_responses_prompt_cache_misses", "Prompt-cache lookups that missed.", cache.misses
    )
    yield _counter(
        "mlx_responses_prompt_cache_reused_tokens",
        "Prompt tokens served from the prompt cache instead of prefilled.",
        cache.tokens_reused,
    )
    yield _counter(
        "mlx_responses_prompt_cache_evictions", "Prompt-cache entries evicted.", cache.evictions
    )
    yield _gauge("mlx_responses_prompt_cache_entries", "Prompt-cache entries.", cache.entries)
    yield _gauge("mlx_responses_prompt_cache_bytes", "Prompt-cache bytes held.", cache.bytes)
    yield from _disk_tier(cache.disk)


def _disk_tier(disk: DiskStats | None) -> Iterator[Metric]:
    """The prompt cache's disk tier, when it has one."""
    if disk is None:
        return
    name = "mlx_responses_prompt_cache_disk"
    yield _gauge(f"{name}_entries", "Prompt-cache files on disk.", disk.entries)
    yield _gauge(f"{name}_bytes", "Prompt-cache bytes on disk.", disk.bytes)
    yield _gauge(f"{name}_max_bytes", "The disk tier's byte budget.", disk.max_bytes)
    yield _counter(f"{name}_hits", "Prompt-cache lookups served from disk.", disk.hits)
    yield _counter(
        f"{name}_misses", "Prompt-cache lookups neither RAM nor disk served.", disk.misses
    )
    yield _counter(f"{name}_writes", "Prompt-cache files written.", disk.writes)
    yield _counter(
        f"{name}_write_errors", "Prompt-cache files that failed to write.", disk.write_errors
    )
    yield _counter(
        f"{name}_skipped",
        "Prompt-cache files skipped: missing, truncated, corrupt or mismatched.",
        disk.skipped,
    )
    yield _counter(
        f"{name}_evictions", "Prompt-cache files deleted for the budget.", disk.evictions
    )
    yield _counter(f"{name}_expired", "Prompt-cache files deleted by the TTL.", disk.expired)


def _sizes(rt: Runtime) -> Metric:
    """The batch's sizes, each with its source (a flag, or the device's default)."""
    sizes = rt.model.sizes
    return _labelled(
        GaugeMetricFamily(
            "mlx_responses_batch_size_limit",
            "The batch's sizes: prompt tokens per prefill chunk, sequences decoded and prompts "
            "prefilled per step; source: flag or device default.",
            labels=("size", "source"),
        ),
        [
            (("prefill_step", sizes.sources[0]), sizes.prefill_step_size),
            (("decode_batch", sizes.sources[1]), sizes.completion_batch_size),
            (("prompt_batch", sizes.sources[2]), sizes.prefill_batch_size),
        ],
    )


def _responses(rt: Runtime) -> Iterator[Metric]:
    """The response supervisor's books: tasks, running responses, jobs and sockets."""
    books = rt.responses.statistics()
    yield _gauge(
        "mlx_responses_response_tasks",
        "Response tasks alive (opening, running, ending).",
        books.tasks,
    )
    yield _gauge(
        "mlx_responses_responses_running",
        "Responses whose events are still open.",
        books.running,
    )
    yield _labelled(
        CounterMetricFamily(
            "mlx_responses_background_jobs",
            "Background jobs since start, by status (started, finished).",
            labels=("status",),
        ),
        [(("started",), books.jobs_started), (("finished",), books.jobs_finished)],
    )
    yield _gauge(
        "mlx_responses_background_jobs_active",
        "Background jobs running now.",
        books.jobs_active,
    )
    yield _gauge(
        "mlx_responses_websocket_connections", "Open WebSocket connections.", books.sockets
    )


def _stores(rt: Runtime) -> Iterator[Metric]:
    """Entries, bytes and evictions of each store."""
    entries = GaugeMetricFamily(
        "mlx_responses_store_entries", "Entries held, per store.", labels=("store",)
    )
    held = GaugeMetricFamily(
        "mlx_responses_store_bytes", "Bytes held, per store.", labels=("store",)
    )
    evicted = CounterMetricFamily(
        "mlx_responses_store_evictions",
        "Entries evicted to stay in budget, per store.",
        labels=("store",),
    )
    stores = [
        ("responses", rt.store.statistics()),
        ("conversations", rt.conversations.statistics()),
        ("files", rt.files.statistics()),
    ]
    if rt.actors.echo is not None:
        stores.append(("reasoning_echo", rt.actors.echo.statistics()))
    for name, stats in stores:
        entries.add_metric((name,), stats.entries)
        held.add_metric((name,), stats.bytes)
        evicted.add_metric((name,), stats.evictions)
    yield entries
    yield held
    yield evicted


def _distributed(rt: Runtime) -> Iterator[Metric]:
    """A sharded model's ranks, each rank's memory and rank 0's broadcast."""
    topology = rt.model.topology
    if topology is None:
        return
    ranks = GaugeMetricFamily(
        "mlx_responses_distributed_ranks",
        "Ranks the model is split over (value), its mode and backend, and whether it still runs.",
        labels=("mode", "backend", "state"),
    )
    state = "ok" if rt.model.fatal is None else "failed"
    ranks.add_metric((topology.mode, topology.backend, state), topology.size)
    yield ranks
    memory = GaugeMetricFamily(
        "mlx_responses_distributed_rank_memory_bytes",
        "MLX memory each rank held after loading its share of the model.",
        labels=("rank",),
    )
    for rank in topology.ranks:
        memory.add_metric((str(rank.rank),), rank.memory_bytes)
    yield memory
    traffic = topology.traffic
    if traffic is not None:
        # Every rank's batch as of the latest exchange (distributed.py's header).
        batch = GaugeMetricFamily(
            "mlx_responses_distributed_rank_batch_sequences",
            "Sequences in each rank's batch after its latest step, as of the latest exchange.",
            labels=("rank",),
        )
        steps = CounterMetricFamily(
            "mlx_responses_distributed_rank_steps",
            "Steps each rank had taken, as of the latest exchange.",
            labels=("rank",),
        )
        for index, seen in enumerate(traffic.batches):
            batch.add_metric((str(index),), seen.sequences)
            steps.add_metric((str(index),), seen.steps)
        yield batch
        yield steps
        yield _counter(
            "mlx_responses_distributed_diverged_exchanges",
            "Exchanges at which a rank's batch differed from rank 0's (0 while in step).",
            traffic.diverged,
        )
        yield _counter(
            "mlx_responses_distributed_broadcast_steps",
            "Steps rank 0 announced to the other ranks.",
            traffic.steps,
        )
        yield _counter(
            "mlx_responses_distributed_broadcast_bytes",
            "Bytes rank 0 broadcast to the other ranks (lengths and messages).",
            traffic.bytes,
        )
        seconds = CounterMetricFamily(
            "mlx_responses_distributed_broadcast_seconds",
            "Seconds rank 0 spent broadcasting (waiting for every rank included).",
            value=traffic.seconds,
        )
        yield seconds


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def _labelled(family: _Family, samples: list[tuple[tuple[str, ...], int]]) -> _Family:
    """``family`` with one sample per (label values, value)."""
    for labels, value in samples:
        family.add_metric(labels, value)
    return family


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: int) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def metrics_of(rt: Runtime) -> Metrics:
    """The server's ``Metrics``: the one its response tasks report to, or a new one."""
    timings = rt.actors.timings
    return timings if isinstance(timings, Metrics) else Metrics()


async def _started() -> None:
    g.metrics_started = time.monotonic()


def install_metrics(app: QuartTrio, rt: Runtime) -> None:
    """The ``/metrics`` route and the request hooks (call before the auth hook is added, so
    a refused request is timed too)."""
    metrics = metrics_of(rt)
    metrics.watch(rt)

    async def observe(response: Response) -> Response:
        rule = request.url_rule
        route = rule.rule if rule is not None else "unmatched"
        metrics.requests.labels(route, request.method, str(response.status_code)).inc()
        started = g.get("metrics_started")
        if isinstance(started, float):
            metrics.latency.labels(route, request.method).observe(time.monotonic() - started)
        return response

    async def scrape() -> Response:
        return Response(metrics.render(), status=200, content_type=CONTENT_TYPE)

    app.before_request(_started)
    app.after_request(observe)
    app.add_url_rule("/metrics", view_func=scrape, methods=["GET"], endpoint="metrics")
