"""The handles of the actor tree, as one value: what every response task and route talks to.

``serve`` builds it once the actors have started; the HTTP app, the response supervisor's
tasks and the tests all receive this one object (with the settings it was started from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .conversation_store import ConversationStoreHandle
from .event_log import EventLog
from .file_store import FileStoreHandle
from .model import ModelHandle
from .reasoning_echo import ReasoningEchoHandle
from .response_store import ResponseStoreHandle
from .timings import TimingsObserver

if TYPE_CHECKING:
    from .hosted_tools import HostedTools
    from .replica_link import ReplicaLink


class RunningResponses(Protocol):
    """Finds a response that is still running (the response supervisor answers)."""

    async def find(self, response_id: str, owner: str = "") -> EventLog | None: ...


@dataclass(frozen=True, slots=True)
class Actors:
    """The handles a response task talks to."""

    model: ModelHandle
    store: ResponseStoreHandle
    conversations: ConversationStoreHandle
    files: FileStoreHandle
    echo: ReasoningEchoHandle | None = None
    # How long a store: false background job's final object stays readable.
    ephemeral_ttl_seconds: float = 600.0
    # Where responses report time to first token and decode speed (``/metrics``).
    timings: TimingsObserver | None = None
    # The link to the other replicas of a shared PostgreSQL store (None otherwise).
    replica: ReplicaLink | None = None
    # The tools the server runs (a web search backend, MCP egress); None: none enabled.
    hosted: HostedTools | None = None
