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
from collections.abc import Sequence
from pathlib import Path

import trio

from .actors.model import ModelSettings
from .actors.model_port import thread_settings
from .api_keys import load_api_keys
from .check import run_check
from .cli_flags import (
    API_KEY_ENV,
    SERVE_FLAGS,
    Flag,
    background_key_flag,
    blas_threads_flag,
    tool_format_flag,
)
from .engine.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from .engine.distributed import RankLost, launched_rank, sharded_launch
from .engine.follower import run_follower
from .engine.kv_quant import KvQuant, KvQuantUnsupported
from .engine.loader import resolve_model_path
from .engine.source import ModelSourceError, locate_model
from .engine.topology import Sharding
from .hosted import mcp_client, web_search
from .http.server_defaults import parse_temperature
from .server import ServerSettings, serve
from .storage.choice import default_data_dir, parse_store
from .storage.files import FileLimits
from .storage.interface import StoreLimits
from .storage.sqlite import StoreError
from .temp_folder import temp_folder_problem

# The flags table lives in cli_flags.py; its names stay importable from here.
__all__ = [
    "API_KEY_ENV",
    "SERVE_FLAGS",
    "Flag",
    "background_key_flag",
    "blas_threads_flag",
    "build_parser",
    "main",
    "settings_from_args",
    "tool_format_flag",
    "version_text",
]


def _dest(flag: Flag) -> str:
    return flag.name.removeprefix("--").replace("-", "_")


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="mlx-responses",
        description="A local server for the OpenAI Responses API running one MLX model.",
    )
    parser.add_argument("--version", action="version", version=version_text())
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
    serve_parser.add_argument(
        "--pipeline",
        action="store_true",
        default=env.get("MLX_RESPONSES_PIPELINE", "") not in ("", "0", "false"),
        help="when started by mlx.launch over several ranks: split the model by layers "
        "(pipeline parallel) instead of by tensors [env: MLX_RESPONSES_PIPELINE]",
    )
    serve_parser.add_argument(
        "--check",
        action="store_true",
        help="load the model, run one documented prompt through the server, print the "
        "timings and exit (0 when it answered)",
    )
    web_search.add_flags(serve_parser, env)  # docs/tools.md
    mcp_client.add_flags(serve_parser, env)
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The parsed flags as settings; a value out of range stops start-up with its flag's name.

    The checks run in the flags' order, so the first bad flag is the one named.
    """
    model_path, alias = _model_location(args)
    _check_engine_flags(args)
    responses_store = _store_limits(args, "responses_store")
    conversation_store = _store_limits(args, "conversation_store")
    _check_server_flags(args)
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
    if not args.replica_lease_secs > 0:
        raise SystemExit("--replica-lease-secs must be above 0")
    default_temperature = _default_temperature(args)
    return ServerSettings(
        store=store,
        host=args.host,
        port=args.port,
        model=_model_settings(args, model_path, alias),
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
        replica_lease_seconds=args.replica_lease_secs,
        fetch_image_urls=args.image_urls == "fetch",
        web_search=_web_search_settings(args),
        mcp=mcp_client.settings_from(args),
    )


def _web_search_settings(args: argparse.Namespace) -> web_search.WebSearchSettings:
    """``--web-search`` and its settings, checked now: a backend that cannot be built stops
    start-up with its flag's name."""
    chosen = web_search.settings_from(args)
    if chosen.kind == "local" and chosen.index_dir is None:
        raise SystemExit("--web-search local needs --web-search-index DIR")
    if chosen.kind == "local" and chosen.index_dir is not None and not chosen.index_dir.is_dir():
        raise SystemExit(f"--web-search-index {chosen.index_dir}: not a folder")
    if chosen.kind == "searxng" and not chosen.searxng_url:
        raise SystemExit("--web-search searxng needs --searxng-url URL")
    url = chosen.searxng_url or ""
    if chosen.kind == "searxng" and not url.lower().startswith(("http://", "https://")):
        raise SystemExit(f"--searxng-url {url}: expected an http or https URL")
    if chosen.kind == "ddgs":
        raise SystemExit(web_search.ddgs_refusal())
    return chosen


def _model_location(args: argparse.Namespace) -> tuple[str, str]:
    """The model's path and the alias clients name it by (the bundled model without ``--model``)."""
    if args.model is None:
        return str(BUNDLED_MODEL_PATH), args.alias or BUNDLED_ALIAS
    alias = args.alias or os.path.basename(os.path.normpath(args.model))
    return resolve_model_path(args.model), alias


def _check_engine_flags(args: argparse.Namespace) -> None:
    """The batch, cache, context and port flags' ranges."""
    for name in ("prefill_step_size", "decode_concurrency", "prompt_concurrency", "max_sequences"):
        if (value := getattr(args, name)) is not None and value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.prompt_cache_disk_ttl_secs <= 0:
        raise SystemExit("--prompt-cache-disk-ttl-secs must be above 0")
    for name in ("prompt_cache_bytes", "prompt_cache_entries", "prompt_cache_disk_bytes"):
        if (value := getattr(args, name)) is not None and value < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must not be negative, got {value}")
    if args.ctx_size is not None and args.ctx_size < 1:
        raise SystemExit("--ctx-size must be at least 1")
    if not 0 <= args.port < 65536:
        raise SystemExit("--port must be between 0 and 65535")


def _check_server_flags(args: argparse.Namespace) -> None:
    """The background, files, request-size and WebSocket flags' ranges."""
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


def _default_temperature(args: argparse.Namespace) -> float | None:
    """``--default-temperature``, or None when the flag is unset."""
    try:
        return parse_temperature(args.default_temperature) if args.default_temperature else None
    except ValueError as exc:
        raise SystemExit(f"--default-temperature: {exc}") from None


def _model_settings(args: argparse.Namespace, model_path: str, alias: str) -> ModelSettings:
    return ModelSettings(
        model_path=model_path,
        alias=alias,
        prefill_step_size=args.prefill_step_size,
        completion_batch_size=args.decode_concurrency,
        prefill_batch_size=args.prompt_concurrency,
        max_sequences=args.max_sequences,
        context_size=args.ctx_size,
        prompt_cache_bytes=args.prompt_cache_bytes,
        prompt_cache_entries=args.prompt_cache_entries,
        prompt_cache_dir=args.prompt_cache_dir
        or str(Path(args.data_dir or default_data_dir()) / "prompt-cache"),
        prompt_cache_disk_bytes=args.prompt_cache_disk_bytes,
        prompt_cache_disk_ttl=args.prompt_cache_disk_ttl_secs,
        blas_threads=args.blas_threads,
        solo_decode=args.solo_decode,
        tool_format=args.tool_format,
        sharding=_sharding(args),
        kv_quant=None if args.kv_bits is None else KvQuant(args.kv_bits, args.kv_group_size),
        seed=args.seed,
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
    temp_problem = temp_folder_problem(os.environ)
    if temp_problem is not None:  # else every compiled kernel would fail (temp_folder.py)
        raise SystemExit(f"mlx-responses: {temp_problem}")
    try:  # a folder that is not a model, or a hub id that cannot be had, stops here
        model = dataclasses.replace(
            settings.model, model_path=locate_model(settings.model.model_path)
        )
    except ModelSourceError as exc:
        raise SystemExit(f"mlx-responses: {exc}") from None
    settings = dataclasses.replace(settings, model=model)
    rank = launched_rank()
    if model.sharding is not None and rank:  # a follower rank
        code = run_follower(thread_settings(model), rank)
        # Straight out: MLX's ring threads may still hold a dead peer's sockets, and its
        # static destructors would abort on them (exit status 134 instead of this one).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.check:
        return run_check(settings)
    try:
        trio.run(lambda: serve(settings, handle_signals=True))
    except RankLost as exc:  # loud, and no wait for a thread stuck on a lost rank
        logging.getLogger("mlx_responses").critical("the sharded model stopped: %s", exc)
        print(f"mlx-responses: the sharded model stopped: {exc}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(1)
    except Exception as exc:  # an unusable store file or --kv-bits stops start-up with its message
        store_error = _store_error(exc)
        if store_error is None:
            raise
        raise SystemExit(f"mlx-responses: {store_error}") from None
    return 0


def _sharding(args: argparse.Namespace) -> Sharding | None:
    """Sharded when ``mlx.launch`` started this process as one of several ranks."""
    if not sharded_launch():
        if args.pipeline:
            raise SystemExit("--pipeline needs several ranks: start with mlx.launch")
        return None
    if not args.rank_timeout_secs > 0:
        raise SystemExit("--rank-timeout-secs must be above 0")
    return Sharding(
        "pipeline" if args.pipeline else "tensor",
        args.distributed_backend,
        args.rank_timeout_secs,
    )


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


def _store_error(exc: BaseException) -> StoreError | KvQuantUnsupported | None:
    """The ``StoreError`` or ``KvQuantUnsupported`` inside ``exc`` (possibly nested in
    exception groups, or the cause of a failed load), if any."""
    if isinstance(exc, StoreError | KvQuantUnsupported):
        return exc
    if isinstance(exc.__cause__, KvQuantUnsupported):
        return exc.__cause__
    for inner in exc.exceptions if isinstance(exc, BaseExceptionGroup) else ():
        if (found := _store_error(inner)) is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
