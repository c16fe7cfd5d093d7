"""The running server as one value: its settings, its actors' handles, its address.

``serve`` reports it when ready; the HTTP app reads it (``http.common.runtime()``), tests and
benchmarks use it to look at the actors' statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from .actors.conversation_store import ConversationStoreHandle
from .actors.file_store import FileStoreHandle
from .actors.model import ModelHandle
from .actors.response_store import ResponseStoreHandle
from .actors.runtime import Actors
from .actors.status import StatusHandle
from .actors.supervisor import ResponseSupervisorHandle
from .settings import ServerSettings


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: ServerSettings
    actors: Actors
    responses: ResponseSupervisorHandle
    created_at: int
    _stop: trio.Event
    base_url: str = ""
    status: StatusHandle | None = None  # the status page's history

    @property
    def model(self) -> ModelHandle:
        return self.actors.model

    @property
    def store(self) -> ResponseStoreHandle:
        return self.actors.store

    @property
    def conversations(self) -> ConversationStoreHandle:
        return self.actors.conversations

    @property
    def files(self) -> FileStoreHandle:
        return self.actors.files

    def shutdown(self) -> None:
        self._stop.set()

    async def wait_stopping(self) -> None:
        """Return once shutdown has begun."""
        await self._stop.wait()
