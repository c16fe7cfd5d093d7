"""The root of the actor tree: start-up order, readiness and shutdown, written in one place.

```
root nursery
 ├─ response store actor            nursery.start (ready = mailbox open)
 ├─ conversation store actor        nursery.start (ready = mailbox open)
 ├─ file store actor                nursery.start (ready = mailbox open)
 ├─ live registry actor             nursery.start (running responses' event logs)
 ├─ reasoning echo actor            nursery.start (reasoning of earlier plain replies)
 ├─ job supervisor                  nursery.start (background responses, one scope each)
 ├─ model actor (+ its MLX thread)  nursery.start (ready = model loaded)
 └─ hypercorn.trio.serve(app)       nursery.start (ready = socket bound)
```
Shutdown (SIGINT/SIGTERM or ``ServerHandle.shutdown``): the model refuses new sequences and
finishes running ones, so every open stream ends with its terminal event; then Hypercorn
closes gracefully, the MLX thread has stopped, and the nursery is cancelled.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from .actors.conversation_store import ConversationStoreHandle, run_conversation_store
from .actors.file_store import FileStoreHandle, run_file_store
from .actors.jobs import JobSupervisorHandle, run_job_supervisor
from .actors.live import LiveRegistryHandle, run_live_registry
from .actors.model import ModelHandle, ModelSettings, run_model_actor
from .actors.reasoning_echo import DEFAULT_MAX_BYTES as DEFAULT_ECHO_BYTES
from .actors.reasoning_echo import run_reasoning_echo
from .actors.response_store import ResponseStoreHandle, run_response_store
from .http.app import AppContext, create_app
from .http.auth import OPEN, ApiKeys
from .storage.choice import MEMORY, StoreChoice, openers
from .storage.files import DEFAULT_FILE_LIMITS, FileLimits
from .storage.interface import StoreLimits

# Spec 000, Storage Flags.
DEFAULT_RESPONSE_LIMITS = StoreLimits(max_entries=1024, max_bytes=268435456, ttl_seconds=3600)
DEFAULT_CONVERSATION_LIMITS = StoreLimits(max_entries=256, max_bytes=67108864, ttl_seconds=3600)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str
    port: int
    model: ModelSettings
    graceful_timeout: float = 10.0
    responses_store: StoreLimits = DEFAULT_RESPONSE_LIMITS
    conversation_store: StoreLimits = DEFAULT_CONVERSATION_LIMITS
    files: FileLimits = DEFAULT_FILE_LIMITS
    background_max_jobs: int = 64
    background_ephemeral_ttl_seconds: float = 600.0
    drop_unsupported_tools: bool = False
    api_keys: ApiKeys = OPEN
    max_request_bytes: int = 32 * 1024 * 1024
    reasoning_echo_max_bytes: int = DEFAULT_ECHO_BYTES
    # Issue 15: the command line defaults to SQLite in the data dir; code and tests to memory.
    store: StoreChoice = MEMORY


@dataclass(frozen=True, slots=True)
class ServerHandle:
    """What ``serve`` reports when ready: the bound URL and the actors (for tests, benchmarks)."""

    base_url: str
    model: ModelHandle
    store: ResponseStoreHandle
    conversations: ConversationStoreHandle
    live: LiveRegistryHandle
    jobs: JobSupervisorHandle
    files: FileStoreHandle
    _stop: trio.Event

    def shutdown(self) -> None:
        self._stop.set()


async def serve(
    settings: ServerSettings,
    *,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    stop = trio.Event()
    stopped_http = trio.Event()
    async with trio.open_nursery() as nursery:
        # Issue 15: each store actor opens its durable backend (if any) on a thread of its own.
        backends = openers(
            settings.store, settings.responses_store, settings.conversation_store, settings.files
        )
        store = await nursery.start(
            partial(run_response_store, settings.responses_store, open_storage=backends.responses)
        )
        conversations = await nursery.start(
            partial(
                run_conversation_store,
                settings.conversation_store,
                open_storage=backends.conversations,
            )
        )
        files = await nursery.start(
            partial(run_file_store, settings.files, open_storage=backends.files)
        )
        live = await nursery.start(run_live_registry)
        echo = await nursery.start(run_reasoning_echo, settings.reasoning_echo_max_bytes)
        jobs = await nursery.start(
            run_job_supervisor,
            settings.background_max_jobs,
            settings.responses_store.max_bytes,
        )
        model = await nursery.start(run_model_actor, settings.model)

        config = HypercornConfig()
        config.bind = [f"{settings.host}:{settings.port}"]
        config.graceful_timeout = settings.graceful_timeout
        config.accesslog = None
        config.errorlog = logging.getLogger("hypercorn.error")
        app = create_app(
            AppContext(
                model=model,
                store=store,
                conversations=conversations,
                live=live,
                jobs=jobs,
                files=files,
                created_at=int(time.time()),
                ephemeral_ttl_seconds=settings.background_ephemeral_ttl_seconds,
                drop_unsupported_tools=settings.drop_unsupported_tools,
                api_keys=settings.api_keys,
                max_request_bytes=settings.max_request_bytes,
                echo=echo,
            )
        )

        async def wait_http_stop() -> None:
            await stopped_http.wait()

        http_done = trio.Event()

        async def run_http(*, task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await hypercorn_serve(
                    app, config, shutdown_trigger=wait_http_stop, task_status=task_status
                )
            finally:
                http_done.set()

        binds = await nursery.start(run_http)
        base_url = binds[0]
        log.info("serving %s at %s", model.info.alias, base_url)
        if handle_signals:
            nursery.start_soon(_watch_signals, stop)
        task_status.started(
            ServerHandle(base_url, model, store, conversations, live, jobs, files, stop)
        )
        await stop.wait()
        log.info("shutting down")
        model.shutdown()
        with trio.move_on_after(settings.graceful_timeout):
            await model.wait_idle()
        stopped_http.set()
        # The HTTP server returns once open requests have finished (bounded by its grace).
        with trio.move_on_after(settings.graceful_timeout + 1):
            await http_done.wait()
        nursery.cancel_scope.cancel()


async def _watch_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()
            return
