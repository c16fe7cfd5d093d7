"""``mlx-responses serve``'s flags (``cli.py``): each with its environment variable, default,
parser and help, in the order ``--help`` lists them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import formats
from .engine.bundled_model import BUNDLED_ALIAS
from .engine.disk_tier import DEFAULT_DISK_BYTES, DEFAULT_TTL_SECONDS
from .engine.kv_quant import DEFAULT_KV_GROUP_SIZE, KV_BITS, KV_GROUP_SIZES
from .engine.prompt_cache import DEFAULT_MAX_ENTRIES
from .settings import DEFAULT_CONVERSATION_LIMITS, DEFAULT_RESPONSE_LIMITS
from .storage.files import DEFAULT_FILE_LIMITS

API_KEY_ENV = "MLX_RESPONSES_API_KEY"


def _word_or_integer(text: str, word: str, low: int, high: int | None, expected: str) -> int | None:
    """``word`` (None) or an integer in ``low..high`` (no upper bound when None)."""
    if text.strip().lower() == word:
        return None
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def blas_threads_flag(text: str) -> int | None:
    """``--blas-threads``: 'auto' (None) or a count of at least one."""
    return _word_or_integer(text, "auto", 1, None, "'auto' or a count of at least 1")


def on_off_flag(text: str) -> bool:
    """A switch: 'on' (True) or 'off' (False)."""
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {text!r}")
    return value == "on"


# ``--seed``'s largest value: a split model's ranks agree on it as a 32-bit integer.
MAX_SEED = 2**31 - 1


def seed_flag(text: str) -> int | None:
    """``--seed``: 'off' (None: MLX's random keys start from the clock) or 0..``MAX_SEED``."""
    return _word_or_integer(text, "off", 0, MAX_SEED, f"'off' or an integer 0..{MAX_SEED}")


def kv_bits_flag(text: str) -> int | None:
    """``--kv-bits``: 'off' (None: the model's precision) or one of ``KV_BITS``."""
    value = text.strip().lower()
    if value in ("off", "none", ""):
        return None
    if value not in {str(bits) for bits in KV_BITS}:
        choices = " or ".join(str(bits) for bits in KV_BITS)
        raise argparse.ArgumentTypeError(f"expected {choices} (or 'off'), got {text!r}")
    return int(value)


def kv_group_size_flag(text: str) -> int:
    """``--kv-group-size``: one of ``KV_GROUP_SIZES``."""
    value = text.strip()
    if value not in {str(size) for size in KV_GROUP_SIZES}:
        choices = ", ".join(str(size) for size in KV_GROUP_SIZES)
        raise argparse.ArgumentTypeError(f"expected one of {choices}, got {text!r}")
    return int(value)


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


def image_urls_flag(text: str) -> str:
    """``--image-urls``: 'refuse' or 'fetch' (docs/vision.md)."""
    value = text.strip().lower()
    if value not in ("refuse", "fetch"):
        raise argparse.ArgumentTypeError(f"expected 'refuse' or 'fetch', got {text!r}")
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
        None,
        int,
        "prompt tokens per prefill chunk; a cancel during prefill waits at most one chunk "
        "(default: by device, 512 on the CPU, 2048 on a GPU with 8 GiB or more to spare; "
        "docs/operations.md)",
    ),
    Flag(
        "--decode-concurrency",
        "MLX_RESPONSES_DECODE_CONCURRENCY",
        None,
        int,
        "most sequences decoded together in one batch step (default: by device, 32; 64 on a "
        "CUDA GPU with 32 GiB or more to spare)",
    ),
    Flag(
        "--prompt-concurrency",
        "MLX_RESPONSES_PROMPT_CONCURRENCY",
        None,
        int,
        "most prompts prefilled together in one batch step (default: by device, 8)",
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
    Flag(  # docs/prompt-cache.md, "Quantized KV cache"
        "--kv-bits",
        "MLX_RESPONSES_KV_BITS",
        None,
        kv_bits_flag,
        "store the KV cache of the running batch and of the prompt cache quantized to 8 or 4 "
        "bits (plain attention layers; sliding-window and recurrent layers stay as they are): "
        "8 holds about half the bytes per token, 4 about a third, at some cost in quality; "
        "default: off, the model's own precision",
    ),
    Flag(
        "--kv-group-size",
        "MLX_RESPONSES_KV_GROUP_SIZE",
        DEFAULT_KV_GROUP_SIZE,
        kv_group_size_flag,
        "with --kv-bits: values per quantization group (32, 64 or 128); it must divide the "
        "model's attention head size",
    ),
    Flag(
        "--prompt-cache-dir",
        "MLX_RESPONSES_PROMPT_CACHE_DIR",
        "",
        str,
        "folder of the prompt cache's disk tier: entries leaving RAM are written there and "
        "survive a restart (default: prompt-cache under --data-dir)",
    ),
    Flag(
        "--prompt-cache-disk-bytes",
        "MLX_RESPONSES_PROMPT_CACHE_DISK_BYTES",
        DEFAULT_DISK_BYTES,
        int,
        "bytes of prompt-cache files kept in --prompt-cache-dir (least recently used deleted "
        "first); 0 disables the disk tier",
    ),
    Flag(
        "--prompt-cache-disk-ttl-secs",
        "MLX_RESPONSES_PROMPT_CACHE_DISK_TTL_SECS",
        DEFAULT_TTL_SECONDS,
        float,
        "seconds a prompt-cache file unused (not written or served) is kept before it is deleted",
    ),
    Flag(
        "--blas-threads",
        "MLX_RESPONSES_BLAS_THREADS",
        "auto",
        blas_threads_flag,
        "threads OpenBLAS runs MLX's CPU products on: a count for every step, or 'auto' (the "
        "default: prefill on OpenBLAS's own count, a prefill of at most 64 tokens only if it "
        "makes one at least 1.2x faster; decode steps too only if it makes a decode pass at "
        "least 1.3x faster than one thread, measured at load for batches of 1, 4 and 16 "
        "sequences, each size on its own count, else on one)",
    ),
    Flag(  # docs/architecture.md, "A sequence alone"
        "--solo-decode",
        "MLX_RESPONSES_SOLO_DECODE",
        "on",
        on_off_flag,
        "decode a request the batch holds alone outside mlx-lm's BatchGenerator, the model "
        "called on its own cache, which spares it the batch's upkeep (~12%% of a step on "
        "the bundled model), and prefill it alone when its prompt fits one prefill chunk "
        "(its first token sooner): 'on' (the default) or 'off'",
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
    # The storage flags: names, defaults and environment variables as docs/stores.md lists them.
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
    # The WebSocket mode of /v1/responses (docs/websocket.md).
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
    # The Files API's in-memory store (docs/files.md).
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
    # Where state lives (docs/stores.md).
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
    Flag(  # replicas over one PostgreSQL store (docs/deploy.md)
        "--replica-lease-secs",
        "MLX_RESPONSES_REPLICA_LEASE_SECS",
        10.0,
        float,
        "with a postgresql:// store: seconds a replica's lease lasts (renewed at least every "
        "third of it); the background jobs of a replica that stopped end failed once it expires",
    ),
    Flag(  # ServerSettings.reasoning_secret_file
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
    Flag(
        "--seed",
        "MLX_RESPONSES_SEED",
        "off",
        seed_flag,
        "where the random keys of sampling start once the model is loaded (an integer "
        f"0..{MAX_SEED}): requests that give no seed of their own then sample alike from one "
        "start to the next, given the same requests in the same order; 'off' (the default) "
        "starts them from the clock",
    ),
    Flag(
        "--background-key",
        "MLX_RESPONSES_BACKGROUND_KEY",
        "omitted",
        background_key_flag,
        "'omitted': a foreground Response has no 'background' key; 'always': every "
        "Response and every event's response carries it, false for foreground, as OpenAI "
        "sends it (for clients and suites that require the key, e.g. Open Responses)",
    ),
    Flag(  # docs/distributed.md
        "--distributed-backend",
        "MLX_RESPONSES_DISTRIBUTED_BACKEND",
        "any",
        str,
        "when started by mlx.launch over several ranks: mx.distributed's backend (ring, "
        "jaccl, mpi or any)",
    ),
    Flag(
        "--rank-timeout-secs",
        "MLX_RESPONSES_RANK_TIMEOUT_SECS",
        30.0,
        float,
        "when sharded: seconds a rank may take to answer one exchange before the server stops "
        "with a message naming it (its requests fail)",
    ),
    Flag(
        "--image-urls",
        "MLX_RESPONSES_IMAGE_URLS",
        "refuse",
        image_urls_flag,
        "'refuse': an http(s) image URL is a 400 (the server reaches no network on a client's "
        "word); 'fetch': the server downloads it (docs/vision.md)",
    ),
    Flag(
        "--log-level",
        "MLX_RESPONSES_LOG_LEVEL",
        "info",
        str,
        "debug, info, warning or error",
    ),
)
