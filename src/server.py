"""The root of the actor tree: start-up order, readiness and shutdown, written in one place.

```
root nursery
 ├─ store actor (+ its I/O thread)   nursery.start (ready = backends open): responses,
 │                                  conversations, files, the reasoning echo
 ├─ model actor (+ its MLX thread)  nursery.start (ready = model loaded)
 ├─ response supervisor             nursery.start (every response a task, one scope each)
 ├─ status history                  nursery.start (the status page's samples and requests)
 └─ hypercorn.trio.serve(app)       nursery.start (ready = socket bound)
```
Shutdown (SIGINT/SIGTERM or ``Runtime.shutdown``): the model refuses new sequences and
finishes running ones, so every open stream ends with its terminal event; then Hypercorn
closes gracefully, the MLX thread has stopped, and the nursery is cancelled.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import sys
import time
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart_trio import QuartTrio

from .actors.hosted_tools import open_hosted_tools
from .actors.model import ModelHandle, run_model_actor
from .actors.replica_link import new_replica_id, start_replica_link
from .actors.runtime import Actors
from .actors.status import run_status_history
from .actors.store import Store, run_store
from .actors.supervisor import (
    ResponseSupervisorHandle,
    SupervisorSettings,
    run_response_supervisor,
)
from .engine.distributed import RankLost
from .http.app import create_app
from .http.metrics import Metrics
from .runtime import Runtime
from .settings import DEFAULT_CONVERSATION_LIMITS, DEFAULT_RESPONSE_LIMITS, ServerSettings
from .startup import log_startup
from .storage.choice import Budgets, backends_opener

__all__ = [
    "DEFAULT_CONVERSATION_LIMITS",
    "DEFAULT_RESPONSE_LIMITS",
    "Runtime",
    "ServerHandle",
    "ServerSettings",
    "serve",
]

# What ``serve`` reports (the name tests and benchmarks know it by).
ServerHandle = Runtime

log = logging.getLogger(__name__)

# The generation thread shares the GIL with the event loop. It gives the GIL up for
# every MLX evaluation and needs it back right after; with Python's default switch interval
# (5 ms) a busy event loop could keep it waiting that long each time, a large share of a
# decode step on a fast model. A shorter interval bounds the wait (bench/throughput.py).
GIL_SWITCH_INTERVAL_SECONDS = 0.0005
# At shutdown, how long the running responses may go without one ending before the rest (each
# waiting on a hosted call) are cancelled.
SETTLE_SECONDS = 0.2


async def serve(
    settings: ServerSettings,
    *,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start the actors in order, each ready before the next; serve until stopped; shut down."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_SECONDS)
    stop = trio.Event()
    hosted_tools = open_hosted_tools(settings.web_search, settings.mcp)
    async with hosted_tools as hosted, trio.open_nursery() as nursery:
        replica_id = new_replica_id()
        store = await _start_store(nursery, settings, replica_id)
        model = await nursery.start(run_model_actor, settings.model)
        metrics = Metrics()
        replica = await start_replica_link(
            nursery,
            settings.store,
            store.responses,
            replica_id=replica_id,
            lease_seconds=settings.replica_lease_seconds,
            limits=settings.responses_store,
        )
        actors = Actors(
            model,
            store.responses,
            store.conversations,
            store.files,
            store.echo,
            timings=metrics,
            replica=replica,
            hosted=hosted,
        )
        responses = await _start_supervisor(nursery, settings, actors)
        if replica is not None:
            replica.bind(responses.cancel)
        status = await nursery.start(run_status_history, model, responses, metrics)
        runtime = Runtime(settings, actors, responses, int(time.time()), stop, status=status)
        http = await _start_http(nursery, settings, create_app(runtime))
        runtime = dataclasses.replace(runtime, base_url=http.base_url)
        log.info("serving %s at %s", model.info.alias, runtime.base_url)
        log_startup(log, model.info, model.blas, model.device, model.topology, model.sizes)
        if handle_signals:
            nursery.start_soon(_watch_signals, stop)
        nursery.start_soon(_watch_model_failure, model.failed, stop)
        task_status.started(runtime)
        await stop.wait()
        log.info("shutting down")
        await _drain(settings, model, responses)
        await http.close(settings.graceful_timeout + 1)
        nursery.cancel_scope.cancel()
    if model.fatal is not None:
        raise RankLost(model.fatal)


async def _start_store(nursery: trio.Nursery, settings: ServerSettings, replica_id: str) -> Store:
    """The store actor; it opens the durable backends (if any) on a thread of its own."""
    budgets = Budgets(
        settings.responses_store,
        settings.conversation_store,
        settings.files,
        settings.reasoning_echo_max_bytes,
    )
    opener = backends_opener(
        settings.store,
        budgets,
        replica_id=replica_id,
        lease_seconds=settings.replica_lease_seconds,
        responses=settings.response_storage,
    )
    store: Store = await nursery.start(partial(run_store, budgets, open_backends=opener))
    return store


async def _start_supervisor(
    nursery: trio.Nursery, settings: ServerSettings, actors: Actors
) -> ResponseSupervisorHandle:
    supervisor_settings = SupervisorSettings(
        max_jobs=settings.background_max_jobs,
        max_job_bytes=settings.responses_store.max_bytes,
        ephemeral_ttl_seconds=settings.background_ephemeral_ttl_seconds,
        max_sockets_per_tenant=settings.websocket_max_connections,
    )
    responses: ResponseSupervisorHandle = await nursery.start(
        run_response_supervisor, actors, supervisor_settings
    )
    return responses


@dataclasses.dataclass(frozen=True, slots=True)
class _Http:
    """The running HTTP server: its first bound address, and how to stop it."""

    base_url: str
    stop: trio.Event
    done: trio.Event

    async def close(self, grace_seconds: float) -> None:
        """Stop accepting; return once open requests have finished (bounded by the grace)."""
        self.stop.set()
        with trio.move_on_after(grace_seconds):
            await self.done.wait()


async def _start_http(nursery: trio.Nursery, settings: ServerSettings, app: QuartTrio) -> _Http:
    """Hypercorn on ``settings.host:port``; ready once its socket is bound."""
    config = HypercornConfig()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.graceful_timeout = settings.graceful_timeout
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    stop, done = trio.Event(), trio.Event()

    async def wait_stop() -> None:
        await stop.wait()

    async def run_http(*, task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await hypercorn_serve(app, config, shutdown_trigger=wait_stop, task_status=task_status)
        finally:
            done.set()

    binds: list[str] = await nursery.start(run_http)
    return _Http(binds[0], stop, done)


async def _drain(
    settings: ServerSettings, model: ModelHandle, responses: ResponseSupervisorHandle
) -> None:
    """The model refuses new sequences and finishes the running ones, bounded by the grace.
    The responses still running once theirs have published (``SETTLE_SECONDS`` without one
    ending) wait on a hosted call, which no sequence holds: they are cancelled, to end
    ``failed`` as those the stopping model ended do."""
    await model.shutdown()
    with trio.move_on_after(settings.graceful_timeout):
        if model.fatal is None:  # a lost rank's batch never empties
            await model.wait_idle()
        # The sequences are out of the batch; their responses publish their terminal
        # events (a run may be between receives) before the HTTP server stops.
        running, still = responses.statistics().running, trio.current_time()
        while running:
            await trio.sleep(0.001)
            now, was = trio.current_time(), running
            running = responses.statistics().running
            if running < was:
                still = now
            elif now - still > SETTLE_SECONDS:
                await responses.cancel_running("shutdown")
                still = math.inf


async def _watch_model_failure(failed: trio.Event, stop: trio.Event) -> None:
    """A sharded model that lost a rank stops the server (its requests failed)."""
    await failed.wait()
    stop.set()


async def _watch_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()
            return
