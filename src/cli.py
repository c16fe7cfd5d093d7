"""``mlx-responses``: the command line. Every flag can also be set by an environment variable.

Precedence: command line, then environment, then the default. ``--help`` lists each flag with
its variable and default.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from . import formats
from .actors.model import ModelSettings
from .api_keys import load_api_keys
from .check import run_check
from .http.server_defaults import parse_temperature
from .model.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from .model.loader import resolve_model_path
from .model.prompt_cache import DEFAULT_MAX_ENTRIES
from .model.source import ModelSourceError, locate_model
from .server import (
    DEFAULT_CONVERSATION_LIMITS,
    DEFAULT_RESPONSE_LIMITS,
    ServerSettings,
    serve,
)
from .storage.choice import default_data_dir, parse_store
from .storage.files import DEFAULT_FILE_LIMITS, FileLimits
from .storage.interface import StoreLimits
from .storage.sqlite import StoreError


def blas_threads_flag(text: str) -> int | None:
    """``--blas-threads``: 'auto' (None) or a count of at least one."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count of at least 1, got {text!r}")
    return count


def tool_format_flag(text: str) -> str | None:
    """``--tool-format``: 'auto' (None: detected from the model) or a registered format name."""
    if text.strip().lower() == "auto":
        return None
    try:
        return formats.get(text.strip()).name
    except formats.UnknownFormat as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def background_key_flag(text: str) -> str:
    """``--background-key``: 'omitted' or 'always'."""
    value = text.strip().lower()
    if value not in ("omitted", "always"):
        raise argparse.ArgumentTypeError(f"expected 'omitted' or 'always', got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class Flag:
    name: str
    env: str
    default: Any
    kind: Callable[[str], Any]
    help: str


SERVE_FLAGS: tuple[Flag, ...] = (
    Flag("--host", "MLX_RESPONSES_HOST", "127.0.0.1", str, "interface to listen on"),
    Flag("--port", "MLX_RESPONSES_PORT", 8080, int, "TCP port (0 picks a free one)"),
    Flag(
        "--model",
        "MLX_RESPONSES_MODEL",
        None,
        str,
        "model folder or hub id to serve (default: the bundled tiny model)",
    ),
    Flag(
        "--alias",
        "MLX_RESPONSES_ALIAS",
        None,
        str,
        "the model name clients send and /v1/models lists "
        f"(default: '{BUNDLED_ALIAS}' for the bundled model, else the folder name or hub id)",
    ),
    Flag(
        "--prefill-step-size",
        "MLX_RESPONSES_PREFILL_STEP_SIZE",
        512,
        int,
        "prompt tokens per prefill chunk; a cancel during prefill waits at most one chunk",
    ),
    Flag(
        "--decode-concurrency",
        "MLX_RESPONSES_DECODE_CONCURRENCY",
        32,
        int,
        "most sequences decoded together in one batch step",
    ),
    Flag(
        "--prompt-concurrency",
        "MLX_RESPONSES_PROMPT_CONCURRENCY",
        8,
        int,
        "most prompts prefilled together in one batch step",
    ),
    Flag(
        "--ctx-size",
        "MLX_RESPONSES_CTX_SIZE",
        None,
        int,
        "context window in tokens (prompt + output) that requests must fit and automatic "
        "compaction plans with (default: the model's own, from its config.json)",
    ),
    Flag(
        "--max-sequences",
        "MLX_RESPONSES_MAX_SEQUENCES",
        256,
        int,
        "admitted sequences (running + waiting) before new requests get 503",
    ),
    Flag(
        "--prompt-cache-bytes",
        "MLX_RESPONSES_PROMPT_CACHE_BYTES",
        None,
        int,
        "bytes of KV cache kept for reuse by later prompts of the same tenant (default: "
        "1/8 of the machine's memory); 0 disables the prompt cache",
    ),
    Flag(
        "--prompt-cache-entries",
        "MLX_RESPONSES_PROMPT_CACHE_ENTRIES",
        DEFAULT_MAX_ENTRIES,
        int,
        "most cached prompt prefixes kept (least recently used evicted first); 0 disables",
    ),
    Flag(
        "--blas-threads",
        "MLX_RESPONSES_BLAS_THREADS",
        "auto",
        blas_threads_flag,
        "threads OpenBLAS runs MLX's CPU products on: a count for every step, or 'auto' (the "
        "default: prefill on OpenBLAS's own count; decode steps too only if it makes a decode "
        "pass at least 1.3x faster than one thread, measured at load, else on one)",
    ),
    Flag(
        "--tool-format",
        "MLX_RESPONSES_TOOL_FORMAT",
        "auto",
        tool_format_flag,
        "the format the model writes tool calls and reasoning in: 'auto' (the default: "
        "tokenizer_config.json's tool_parser_type, else detected from the chat template and "
        f"vocabulary) or one of: {', '.join(formats.names())}",
    ),
    # Spec 000, Storage Flags: names, defaults and environment variables exactly as written there.
    Flag(
        "--responses-store-max-entries",
        "LLAMA_ARG_RESPONSES_STORE_MAX_ENTRIES",
        DEFAULT_RESPONSE_LIMITS.max_entries,
        int,
        "most stored responses kept (least recently used evicted first); 0 disables response "
        "persistence",
    ),
    Flag(
        "--responses-store-max-bytes",
        "MLXCEL_RESPONSES_STORE_MAX_BYTES",
        DEFAULT_RESPONSE_LIMITS.max_bytes,
        int,
        "approximate retained-byte budget of stored responses (their serialised JSON); 0 keeps "
        "the route enabled but evicts stored responses immediately",
    ),
    Flag(
        "--responses-store-ttl-secs",
        "LLAMA_ARG_RESPONSES_STORE_TTL_SECS",
        int(DEFAULT_RESPONSE_LIMITS.ttl_seconds),
        int,
        "seconds a stored response stays readable after it is stored; 0 disables TTL",
    ),
    Flag(
        "--conversation-store-max-entries",
        "LLAMA_ARG_CONVERSATION_STORE_MAX_ENTRIES",
        DEFAULT_CONVERSATION_LIMITS.max_entries,
        int,
        "most conversations kept (least recently used evicted first); 0 disables conversation "
        "transcripts",
    ),
    Flag(
        "--conversation-store-max-bytes",
        "MLXCEL_CONVERSATION_STORE_MAX_BYTES",
        DEFAULT_CONVERSATION_LIMITS.max_bytes,
        int,
        "approximate retained-byte budget of conversations (their serialised JSON); 0 keeps "
        "the route enabled but evicts transcripts immediately",
    ),
    Flag(
        "--conversation-store-ttl-secs",
        "LLAMA_ARG_CONVERSATION_STORE_TTL_SECS",
        int(DEFAULT_CONVERSATION_LIMITS.ttl_seconds),
        int,
        "seconds a conversation stays readable after its last change; 0 disables TTL",
    ),
    Flag(
        "--responses-background-max-jobs",
        "MLXCEL_RESPONSES_BACKGROUND_MAX_JOBS",
        64,
        int,
        "most active background: true responses at once (more get 429); 0 disables background mode",
    ),
    Flag(
        "--responses-background-ephemeral-ttl-secs",
        "MLXCEL_RESPONSES_BACKGROUND_EPHEMERAL_TTL_SECS",
        600,
        int,
        "seconds the final object of a background job created with store: false stays "
        "readable; at least 1",
    ),
    Flag(
        "--unsupported-tools",
        "MLX_RESPONSES_UNSUPPORTED_TOOLS",
        "reject",
        str,
        "what to do with hosted tool types (web_search, ...): 'reject' answers 400, 'drop' "
        "ignores them with a logged warning (for clients such as Codex that always send some)",
    ),
    Flag(
        "--api-keys-file",
        "MLX_RESPONSES_API_KEYS_FILE",
        None,
        str,
        "file of API keys, one per line ('KEY [TENANT-NAME]', '#' comments); each key is a "
        "tenant; with any key configured every route but /health needs 'Authorization: Bearer'",
    ),
    Flag(
        "--max-request-bytes",
        "MLX_RESPONSES_MAX_REQUEST_BYTES",
        32 * 1024 * 1024,
        int,
        "largest request body accepted; a larger one is 413",
    ),
    # Decision 24: the WebSocket mode of /v1/responses (docs/websocket.md).
    Flag(
        "--websocket-max-connections",
        "MLX_RESPONSES_WEBSOCKET_MAX_CONNECTIONS",
        16,
        int,
        "most open WebSocket connections per API key; more are refused with "
        "websocket_connection_limit_reached; 0 turns the WebSocket mode off (an upgrade is a "
        "404, on which clients such as Codex CLI fall back to HTTP)",
    ),
    Flag(
        "--websocket-max-seconds",
        "MLX_RESPONSES_WEBSOCKET_MAX_SECONDS",
        3600,
        float,
        "longest life of a WebSocket connection; then it closes with 1001 (clients reconnect)",
    ),
    # Decision 13: the Files API's in-memory store (docs/files.md).
    Flag(
        "--files-max-bytes",
        "MLX_RESPONSES_FILES_MAX_BYTES",
        DEFAULT_FILE_LIMITS.max_bytes,
        int,
        "byte budget of uploaded files (their data plus a little metadata), least recently used "
        "evicted first; 0 refuses every upload",
    ),
    Flag(
        "--files-max-file-bytes",
        "MLX_RESPONSES_FILES_MAX_FILE_BYTES",
        DEFAULT_FILE_LIMITS.max_file_bytes,
        int,
        "largest file POST /v1/files accepts; a larger one is 413 (uploads are also bounded by "
        "--max-request-bytes)",
    ),
    Flag(
        "--files-ttl-secs",
        "MLX_RESPONSES_FILES_TTL_SECS",
        int(DEFAULT_FILE_LIMITS.ttl_seconds),
        int,
        "seconds an uploaded file stays readable after its upload; 0 disables TTL",
    ),
    Flag(
        "--reasoning-echo-max-bytes",
        "MLXCEL_REASONING_ECHO_MAX_BYTES",
        16 * 1024 * 1024,
        int,
        "byte budget of the reasoning echo (the reasoning of earlier plain replies, put back "
        "when a client replays a reply without it); 0 disables it",
    ),
    # Issue 15: where state lives (docs/stores.md).
    Flag(
        "--store",
        "MLX_RESPONSES_STORE",
        "sqlite",
        str,
        "where responses, conversations, files and background jobs are kept: 'sqlite' (a "
        "durable file in --data-dir), 'sqlite:PATH', 'memory' (forgotten at exit) or "
        "'postgresql://user@host:port/db' (one database shared by replicas)",
    ),
    Flag(
        "--data-dir",
        "MLX_RESPONSES_DATA_DIR",
        None,
        str,
        "folder of the default SQLite store (default: the platform's user data folder, "
        "e.g. $XDG_DATA_HOME/mlx-responses or ~/.local/share/mlx-responses)",
    ),
    Flag(  # issue 15: replicas over one PostgreSQL store (docs/deploy.md)
        "--replica-lease-secs",
        "MLX_RESPONSES_REPLICA_LEASE_SECS",
        10.0,
        float,
        "with a postgresql:// store: seconds a replica's lease lasts (renewed at least every "
        "third of it); the background jobs of a replica that stopped end failed once it expires",
    ),
    Flag(  # issue 13: ServerSettings.reasoning_secret_file
        "--reasoning-secret-file",
        "MLX_RESPONSES_REASONING_SECRET_FILE",
        "",
        str,
        "file holding the secret that seals reasoning (include reasoning.encrypted_content); "
        "created with a random secret when missing. Default: reasoning-secret under "
        "--data-dir",
    ),
    Flag(
        "--default-temperature",
        "MLX_RESPONSES_DEFAULT_TEMPERATURE",
        "",
        str,
        "temperature (0..2) for /v1/responses and /v1/messages requests that give none, e.g. "
        "0 for greedy answers to clients that never send one (Codex CLI); default: 1.0",
    ),
    Flag(  # issue 28
        "--background-key",
        "MLX_RESPONSES_BACKGROUND_KEY",
        "omitted",
        background_key_flag,
        "'omitted': a foreground Response has no 'background' key (spec 000); 'always': every "
        "Response and every event's response carries it, false for foreground, as OpenAI "
        "sends it (for clients and suites that require the key, e.g. Open Responses)",
    ),
    Flag(
        "--log-level",
        "MLX_RESPONSES_LOG_LEVEL",
        "info",
        str,
        "debug, info, warning or error",
    ),
)


def _dest(flag: Flag) -> str:
    return flag.name.removeprefix("--").replace("-", "_")


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="mlx-responses",
        description="A local server for the OpenAI Responses API running one MLX model.",
    )
    parser.add_argument("--version", action="version", version=version_text())  # issue 16
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser(
        "serve",
        help="start the server",
        description="Start the Responses API server. Every flag can also be set through the "
        "environment variable shown; the command line wins.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for flag in SERVE_FLAGS:
        raw = env.get(flag.env)
        try:
            default = flag.default if raw is None else flag.kind(raw)
        except (ValueError, argparse.ArgumentTypeError):
            parser.error(f"environment variable {flag.env}={raw!r} is not a valid {flag.name}")
        serve_parser.add_argument(
            flag.name,
            dest=_dest(flag),
            type=flag.kind,
            default=default,
            help=f"{flag.help} [env: {flag.env}]",
        )
    env_keys = [k.strip() for k in env.get(API_KEY_ENV, "").split(",") if k.strip()]
    serve_parser.add_argument(
        "--api-key",
        dest="api_key",
        action="append",
        default=None,
        help="an API key clients must send as 'Authorization: Bearer KEY' (repeatable; each "
        f"key is its own tenant) [env: {API_KEY_ENV}, comma-separated]",
    )
    serve_parser.set_defaults(env_api_keys=env_keys)
    serve_parser.add_argument(  # issue 16
        "--check",
        action="store_true",
        help="load the model, run one documented prompt through the server, print the "
        "timings and exit (0 when it answered)",
    )
    return parser


API_KEY_ENV = "MLX_RESPONSES_API_KEY"


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    if args.model is None:
        model_path = str(BUNDLED_MODEL_PATH)
        alias = args.alias or BUNDLED_ALIAS
    else:
        model_path = resolve_model_path(args.model)
        alias = args.alias or os.path.basename(os.path.normpath(args.model))
    for name in ("prefill_step_size", "decode_concurrency", "prompt_concurrency", "max_sequences"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("prompt_cache_bytes", "prompt_cache_entries"):
        if (value := getattr(args, name)) is not None and value < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must not be negative, got {value}")
    if args.ctx_size is not None and args.ctx_size < 1:
        raise SystemExit("--ctx-size must be at least 1")
    if not 0 <= args.port < 65536:
        raise SystemExit("--port must be between 0 and 65535")
    responses_store = _store_limits(args, "responses_store")
    conversation_store = _store_limits(args, "conversation_store")
    if args.responses_background_max_jobs < 0:
        raise SystemExit("--responses-background-max-jobs must not be negative")
    if args.responses_background_ephemeral_ttl_secs < 1:
        raise SystemExit("--responses-background-ephemeral-ttl-secs must be at least 1")
    for name in ("files_max_bytes", "files_max_file_bytes", "files_ttl_secs"):
        if (value := getattr(args, name)) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must not be negative, got {value}")
    if args.reasoning_echo_max_bytes < 0:
        raise SystemExit("--reasoning-echo-max-bytes must not be negative")
    if args.max_request_bytes < 1:
        raise SystemExit("--max-request-bytes must be at least 1")
    if args.websocket_max_connections < 0:
        raise SystemExit("--websocket-max-connections must not be negative")
    if args.websocket_max_seconds <= 0:
        raise SystemExit("--websocket-max-seconds must be above 0")
    try:
        api_keys = load_api_keys(args.api_key or args.env_api_keys, args.api_keys_file)
    except OSError as exc:
        raise SystemExit(f"--api-keys-file: {exc}") from None
    if args.unsupported_tools not in ("reject", "drop"):
        raise SystemExit("--unsupported-tools must be 'reject' or 'drop'")
    try:
        store = parse_store(args.store, args.data_dir or default_data_dir())
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if not args.replica_lease_secs > 0:  # issue 15
        raise SystemExit("--replica-lease-secs must be above 0")
    try:
        default_temperature = (
            parse_temperature(args.default_temperature) if args.default_temperature else None
        )
    except ValueError as exc:
        raise SystemExit(f"--default-temperature: {exc}") from None
    return ServerSettings(
        store=store,
        host=args.host,
        port=args.port,
        model=ModelSettings(
            model_path=model_path,
            alias=alias,
            prefill_step_size=args.prefill_step_size,
            completion_batch_size=args.decode_concurrency,
            prefill_batch_size=args.prompt_concurrency,
            max_sequences=args.max_sequences,
            context_size=args.ctx_size,
            prompt_cache_bytes=args.prompt_cache_bytes,
            prompt_cache_entries=args.prompt_cache_entries,
            blas_threads=args.blas_threads,
            tool_format=args.tool_format,
        ),
        responses_store=responses_store,
        conversation_store=conversation_store,
        background_max_jobs=args.responses_background_max_jobs,
        background_ephemeral_ttl_seconds=float(args.responses_background_ephemeral_ttl_secs),
        drop_unsupported_tools=args.unsupported_tools == "drop",
        api_keys=api_keys,
        max_request_bytes=args.max_request_bytes,
        reasoning_echo_max_bytes=args.reasoning_echo_max_bytes,
        default_temperature=default_temperature,
        background_key=args.background_key == "always",
        websocket_max_connections=args.websocket_max_connections,
        websocket_max_seconds=float(args.websocket_max_seconds),
        files=FileLimits(args.files_max_bytes, args.files_max_file_bytes, args.files_ttl_secs),
        data_dir=args.data_dir or None,
        reasoning_secret_file=args.reasoning_secret_file,
        replica_lease_seconds=args.replica_lease_secs,  # issue 15
    )


def _store_limits(args: argparse.Namespace, prefix: str) -> StoreLimits:
    """The ``--<prefix>-max-entries/-max-bytes/-ttl-secs`` flags; a negative one stops start-up."""
    values: dict[str, int] = {}
    for suffix in ("max_entries", "max_bytes", "ttl_secs"):
        value = getattr(args, f"{prefix}_{suffix}")
        if value < 0:
            flag = f"--{prefix}_{suffix}".replace("_", "-")
            raise SystemExit(f"{flag} must not be negative, got {value}")
        values[suffix] = value
    return StoreLimits(
        max_entries=values["max_entries"],
        max_bytes=values["max_bytes"],
        ttl_seconds=values["ttl_secs"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = settings_from_args(args)
    try:  # issue 16: a folder that is not a model, or a hub id that cannot be had, stops here
        model = dataclasses.replace(
            settings.model, model_path=locate_model(settings.model.model_path)
        )
    except ModelSourceError as exc:
        raise SystemExit(f"mlx-responses: {exc}") from None
    settings = dataclasses.replace(settings, model=model)
    if args.check:
        return run_check(settings)
    try:
        trio.run(lambda: serve(settings, handle_signals=True))
    except Exception as exc:  # issue 15: an unusable store file stops start-up with its message
        store_error = _store_error(exc)
        if store_error is None:
            raise
        raise SystemExit(f"mlx-responses: {store_error}") from None
    return 0


def version_text() -> str:
    """``mlx-responses --version``: this package, MLX and mlx-lm (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("mlx-responses", "mlx", "mlx-lm"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def _store_error(exc: BaseException) -> StoreError | None:
    """The ``StoreError`` inside ``exc`` (possibly nested in exception groups), if any."""
    if isinstance(exc, StoreError):
        return exc
    for inner in exc.exceptions if isinstance(exc, BaseExceptionGroup) else ():
        if (found := _store_error(inner)) is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
