"""The prompt cache's disk tier: entries that leave RAM are written to a directory, and come
back on a hit, also after a restart.

Called only on the generation thread (it makes and reads MLX arrays). The index of what the
directory holds is the pure ``DiskIndex``; this module reads and writes the files.

Invariants:
- A file is ``MAGIC``, the SHA-256 of the rest, then a safetensors body written by mlx-lm's
  ``save_prompt_cache`` (every cache kind with a ``state``: plain, rotating, quantized KV,
  recurrent arrays) whose metadata carries the tenant, both fingerprints, the rank, the tokens,
  and what the RAM tier keeps beside an entry (its prompt length, its move, its whole size).
- Written to a temp file in the same directory, flushed to disk, then renamed over its name:
  a reader sees a whole file or none. The name is ``disk_index.entry_name`` of its key.
- Nothing is served that was not verified: at start only headers are read (each bounded by
  ``MAX_HEADER_BYTES``), and a file whose header does not parse, whose name is not its key's,
  whose fingerprints or rank are not ours, or whose size is not what its header says
  (truncated) is skipped, counted and deleted (another rank's shard is only skipped); at load the whole file is read (at most the
  size the index recorded) and its digest and metadata checked again before any array is
  made. A file that fails is counted, deleted and dropped from the index; the prompt is then
  served by what the RAM tier has, or prefilled.
- Best effort: a failed write is counted and logged, never raised into the batch.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache_stats import DiskStats
from .disk_index import SUFFIX, DiskEntry, DiskIndex, decode_tokens, encode_tokens, entry_name
from .prefix_cache import PrefixMatch, Tokens

log = logging.getLogger(__name__)

MAGIC = b"MLXKV01\n"
_DIGEST = 32
_PREAMBLE = len(MAGIC) + _DIGEST
# A header longer than this is not read (the tokens make most of it: 8 bytes each, base64).
MAX_HEADER_BYTES = 64 << 20
# Without a --prompt-cache-disk-bytes: the command line's disk budget.
DEFAULT_DISK_BYTES = 8 << 30
# Without a --prompt-cache-disk-ttl-secs: the response store's own default TTL.
DEFAULT_TTL_SECONDS = 3600.0
_FIELDS = ("tenant", "model", "layout", "rank", "tokens", "prompt_tokens", "moved")


class BadFile(Exception):
    """A file that must not be served (what is wrong with it is the message)."""


class OtherRank(BadFile):
    """Another rank's shard in a folder the ranks share: not ours to count or delete."""


@dataclass(frozen=True, slots=True)
class Header:
    """What a file's header says: its key and the fields of its ``DiskEntry``."""

    tenant: str
    tokens: Tokens
    entry: DiskEntry


def model_fingerprint(path: str) -> str:
    """The model's identity as far as a KV cache cares: its config and its weight files'
    names, sizes and modification times (a changed file is a different model: a miss)."""
    digest = hashlib.sha256()
    root = Path(path)
    config = root / "config.json"
    digest.update(config.read_bytes() if config.is_file() else path.encode())
    for weights in sorted(root.glob("*.safetensors")):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def _our_classes() -> dict[str, type]:
    """The cache classes of ours an entry may hold, by name (the rest are mlx-lm's)."""
    from .kv_cache import SequenceQuantizedCache

    return {"SequenceQuantizedCache": SequenceQuantizedCache}


def layout_fingerprint(
    model: Any, share: tuple[int, int] = (1, 1), kv_quant: object | None = None
) -> str:
    """The cache layout an entry must match: each layer's cache class and its fixed settings
    (a rotating window's size and kept tokens), the share of a sharded rank, and the KV
    quantization (``--kv-bits``/``--kv-group-size``: an entry is stored as the batch holds it,
    so a server quantizing otherwise must not read it)."""
    from mlx_lm.models.cache import make_prompt_cache

    parts = []
    for layer in make_prompt_cache(model):
        fixed = [getattr(layer, name, None) for name in ("max_size", "keep", "group_size", "bits")]
        parts.append(f"{type(layer).__name__}{fixed}")
    parts.append(f"share={share}")
    if kv_quant is not None:
        parts.append(f"kv={kv_quant!r}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _metadata_of(raw: dict[str, str]) -> dict[str, str]:
    """Our fields of a body's metadata (``save_prompt_cache`` nests them under ``0.``)."""
    return {key[2:]: value for key, value in raw.items() if key.startswith("0.")}


def _tight(layer: Any) -> Any:
    """A plain KV cache without the unused room of its buffers (the rest as it is)."""
    from mlx_lm.models.cache import KVCache

    if type(layer) is not KVCache or layer.keys is None:
        return layer
    fresh = KVCache()
    offset = layer.offset
    fresh.keys, fresh.values = layer.keys[..., :offset, :], layer.values[..., :offset, :]
    fresh.offset = offset
    return fresh


class DiskTier:
    """One rank's directory of prompt-cache entries (see the module header)."""

    def __init__(
        self,
        directory: str | Path,
        max_bytes: int,
        ttl_seconds: float,
        model: str,
        layout: str,
        rank: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self._index = DiskIndex(max_bytes, ttl_seconds)
        self._model, self._layout, self._rank = model, layout, rank
        self._clock = clock

    @property
    def stats(self) -> DiskStats:
        return self._index.stats

    def __contains__(self, item: tuple[str, Tokens]) -> bool:
        return item in self._index

    def keys(self, tenant: str) -> list[Tokens]:
        return self._index.keys(tenant)

    def name_of(self, tenant: str, tokens: Sequence[int]) -> str:
        return entry_name(tenant, self._model, self._layout, self._rank, tokens)

    # -- start-up ----------------------------------------------------------------------------

    def open(self) -> None:
        """Make the directory and index what it holds (headers only, oldest use first)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found: list[Header] = []
        for path in self.directory.iterdir():
            if path.name.endswith(".tmp"):  # a write that a crash interrupted
                path.unlink(missing_ok=True)
            elif path.name.endswith(SUFFIX):
                try:
                    found.append(self._read_header(path))
                except OtherRank:
                    continue
                except BadFile as exc:
                    log.warning("prompt cache: skipping %s: %s", path.name, exc)
                    self._index.bad()
                    path.unlink(missing_ok=True)
        for header in sorted(found, key=lambda h: h.entry.used_at):
            self._index.add(header.tenant, header.tokens, header.entry)
        self._index.expire(self._clock())
        self._delete_dropped()

    def _read_header(self, path: Path) -> Header:
        try:
            with path.open("rb") as file:
                preamble = file.read(_PREAMBLE + 8)
                if len(preamble) < _PREAMBLE + 8 or not preamble.startswith(MAGIC):
                    raise BadFile("not a prompt-cache file")
                (length,) = struct.unpack("<Q", preamble[_PREAMBLE:])
                if length > MAX_HEADER_BYTES:
                    raise BadFile("header too long")
                header = json.loads(file.read(length))
                size = os.fstat(file.fileno())
        except (OSError, ValueError) as exc:
            raise BadFile(f"unreadable: {exc}") from exc
        if not isinstance(header, dict):
            raise BadFile("header is not an object")
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        if size.st_size != _PREAMBLE + 8 + length + max(ends, default=0):
            raise BadFile("truncated")
        fields = self._check(_metadata_of(header.get("__metadata__") or {}), path.name)
        entry = DiskEntry(
            path.name,
            size.st_size,
            fields["trimmable"] == "1",
            int(fields["prompt_tokens"]),
            int(fields["moved"]),
            int(fields["whole_bytes"]),
            size.st_mtime,
        )
        return Header(fields["tenant"], decode_tokens(base64.b64decode(fields["tokens"])), entry)

    def _check(self, fields: dict[str, str], name: str) -> dict[str, str]:
        """``fields`` if they are ours and name ``name`` (else ``BadFile``)."""
        if any(key not in fields for key in (*_FIELDS, "trimmable", "whole_bytes")):
            raise BadFile("metadata incomplete")
        if (fields["model"], fields["layout"]) != (self._model, self._layout):
            raise BadFile("another model or cache layout")
        if fields["rank"] != str(self._rank):
            raise OtherRank("another rank's shard")
        tokens = decode_tokens(base64.b64decode(fields["tokens"]))
        if self.name_of(fields["tenant"], tokens) != name:
            raise BadFile("name does not match its key")
        return fields

    # -- lookup and load ---------------------------------------------------------------------

    def find(self, tenant: str, key: Tokens, limit: int) -> PrefixMatch[DiskEntry] | None:
        match = self._index.find(tenant, key, limit, self._clock())
        self._delete_dropped()
        return match

    def entry(self, tenant: str, key: Tokens) -> PrefixMatch[DiskEntry] | None:
        """The entry stored exactly under ``key`` (a sharded follower loads what rank 0 chose)."""
        match = self._index.find(tenant, key, len(key), self._clock())
        return match if match is not None and match.key == key else None

    def load(self, tenant: str, match: PrefixMatch[DiskEntry]) -> list[Any] | None:
        """The cache of ``match``'s file, verified; None (counted, deleted) if it fails."""
        try:
            layers = self._load(tenant, match.key, match.value)
        except Exception as exc:  # any failure is a bad file, never a served one
            log.warning("prompt cache: skipping %s: %s", match.value.name, exc)
            self._index.bad(tenant, match.key)
            self._delete_dropped()
            return None
        now = self._clock()
        self._index.served(tenant, match.key, match.reused, now)
        with contextlib.suppress(OSError):
            os.utime(self.directory / match.value.name, (now, now))
        return layers

    def missed(self) -> None:
        self._index.missed()

    def _load(self, tenant: str, key: Tokens, entry: DiskEntry) -> list[Any]:
        import mlx.core as mx
        from mlx.utils import tree_unflatten
        from mlx_lm.models import cache as cache_module

        path = self.directory / entry.name
        with path.open("rb") as file:
            data = file.read(entry.nbytes + 1)  # bounded: the size the index recorded
        if len(data) != entry.nbytes or not data.startswith(MAGIC):
            raise BadFile("changed since it was indexed")
        body = data[_PREAMBLE:]
        if hashlib.sha256(body).digest() != data[len(MAGIC) : _PREAMBLE]:
            raise BadFile("digest mismatch (corrupt)")
        loaded: Any = mx.load(io.BytesIO(body), format="safetensors", return_metadata=True)
        arrays: dict[str, Any] = loaded[0]
        raw: dict[str, str] = loaded[1]
        fields = self._check(_metadata_of(raw), entry.name)
        if fields["tenant"] != tenant or decode_tokens(base64.b64decode(fields["tokens"])) != key:
            raise BadFile("another key")
        nested = tree_unflatten(list(raw.items()))
        _, classes, scalars = nested
        for position, kind in scalars[1:]:
            array = arrays[position]
            if kind == "scalar":
                arrays[position] = array.item()
            elif kind == "none":
                arrays[position] = None
            elif kind == "string":
                arrays[position] = "".join(chr(i) for i in array.tolist())
            else:
                raise BadFile(f"unknown scalar kind {kind!r}")
        states = tree_unflatten(list(arrays.items()))
        layers = []
        ours = _our_classes()
        for name, state in zip(classes, states, strict=True):
            kind_class: Any = ours.get(name) or getattr(cache_module, name, None)
            if not isinstance(kind_class, type) or not issubclass(
                kind_class, cache_module._BaseCache
            ):
                raise BadFile(f"unknown cache class {name!r}")
            layers.append(kind_class.from_state(state))  # type: ignore[attr-defined]
        held = {
            int(layer.offset) for layer in layers if isinstance(getattr(layer, "offset", None), int)
        }
        if held and held != {len(key)}:
            raise BadFile("its cache does not hold its tokens")
        mx.eval([layer.state for layer in layers])
        return layers

    # -- writing -----------------------------------------------------------------------------

    def write(
        self,
        tenant: str,
        key: Tokens,
        layers: Sequence[Any],
        *,
        prompt_tokens: int,
        moved: int,
        whole_bytes: int,
        trimmable: bool,
    ) -> None:
        """Keep ``layers`` (which hold exactly ``key``) on disk; a failure is counted."""
        if (tenant, key) in self._index:
            return
        name = self.name_of(tenant, key)
        try:
            size = self._write(
                name, tenant, key, layers, prompt_tokens, moved, whole_bytes, trimmable
            )
        except Exception:
            log.exception("prompt cache: could not write an entry to %s", self.directory)
            self._index.wrote(False)
            return
        self._index.wrote(True)
        entry = DiskEntry(name, size, trimmable, prompt_tokens, moved, whole_bytes, self._clock())
        self._index.add(tenant, key, entry)
        self._delete_dropped()

    def _write(
        self,
        name: str,
        tenant: str,
        key: Tokens,
        layers: Sequence[Any],
        prompt_tokens: int,
        moved: int,
        whole_bytes: int,
        trimmable: bool,
    ) -> int:
        from mlx_lm.models.cache import save_prompt_cache

        metadata = {
            "tenant": tenant,
            "model": self._model,
            "layout": self._layout,
            "rank": str(self._rank),
            "tokens": base64.b64encode(encode_tokens(key)).decode(),
            "prompt_tokens": str(prompt_tokens),
            "moved": str(moved),
            "whole_bytes": str(whole_bytes),
            "trimmable": "1" if trimmable else "0",
        }
        buffer = io.BytesIO()
        save_prompt_cache(buffer, [_tight(layer) for layer in layers], metadata)
        body = buffer.getbuffer()
        temp = self.directory / f".{name}.{os.getpid()}.tmp"
        try:
            with temp.open("wb") as file:
                file.write(MAGIC)
                file.write(hashlib.sha256(body).digest())
                file.write(body)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, self.directory / name)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return _PREAMBLE + len(body)

    def clear(self) -> None:
        """Delete every entry of this tier (a cleared prompt cache)."""
        self._index.clear()
        self._delete_dropped()

    def _delete_dropped(self) -> None:
        for name in self._index.take_dropped():
            with contextlib.suppress(OSError):
                (self.directory / name).unlink()
