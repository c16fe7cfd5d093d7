"""The server's settings: one frozen value, built by the CLI (or a test) and read by everyone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .actors.model import ModelSettings
from .actors.reasoning_echo import DEFAULT_MAX_BYTES as DEFAULT_ECHO_BYTES
from .api_keys import OPEN, ApiKeys
from .hosted.mcp_client import McpSettings
from .hosted.web_search import WebSearchSettings
from .protocol.tools.hosted import HostedSwitches
from .storage.choice import MEMORY, StoreChoice, default_data_dir
from .storage.files import DEFAULT_FILE_LIMITS, FileLimits
from .storage.interface import ResponseStorage, StoreLimits

# The storage flags' defaults (docs/stores.md).
DEFAULT_RESPONSE_LIMITS = StoreLimits(max_entries=1024, max_bytes=268435456, ttl_seconds=3600)
DEFAULT_CONVERSATION_LIMITS = StoreLimits(max_entries=256, max_bytes=67108864, ttl_seconds=3600)


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
    # The command line defaults to SQLite in the data dir; code and tests to memory.
    store: StoreChoice = MEMORY
    # --default-temperature: for requests that give none (None: OpenAI's 1.0).
    default_temperature: float | None = None
    # --background-key always: every Response carries ``background``.
    background_key: bool = False
    # The seam for fault injection into the response store: tests install a backend factory.
    response_storage: Callable[[], ResponseStorage] | None = None
    # The WebSocket mode: most open connections per tenant, and a connection's longest life.
    websocket_max_connections: int = 16
    websocket_max_seconds: float = 3600.0
    # --data-dir (None: the platform's user data folder) and --reasoning-secret-file
    # ("": ``reasoning-secret`` under the data dir), read through ``reasoning_secret_path``.
    data_dir: str | None = None
    reasoning_secret_file: str = ""
    # With a postgresql:// store, how long a replica's lease lasts (docs/deploy.md).
    replica_lease_seconds: float = 10.0
    # --image-urls fetch (off by default: docs/vision.md says why).
    fetch_image_urls: bool = False
    # Tools the server runs (docs/tools.md): the web search backend, the MCP hosts it may reach.
    web_search: WebSearchSettings = field(default_factory=WebSearchSettings)
    mcp: McpSettings = field(default_factory=McpSettings)

    @property
    def hosted_switches(self) -> HostedSwitches:
        """Which hosted tools a request may use (the rest are a 400 naming the flag, or
        dropped under ``--unsupported-tools drop``)."""
        return HostedSwitches(
            web_search=self.web_search.kind != "off",
            mcp=self.mcp.policy is not None,
            drop_unsupported=self.drop_unsupported_tools,
        )

    def reasoning_secret_path(self) -> Path:
        """The file of the secret that seals reasoning (created on first use)."""
        if self.reasoning_secret_file:
            return Path(self.reasoning_secret_file)
        return Path(self.data_dir or default_data_dir()) / "reasoning-secret"
