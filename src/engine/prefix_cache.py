"""The prompt-prefix cache's pure core: a radix tree of token prefixes per tenant, with LRU.

It stores opaque values (the generation thread stores KV caches) under ``(tenant, tokens)``
and answers "which stored value serves the most of this prompt?". No MLX here: the caller
copies and trims what it gets (``prompt_cache.py``).

Invariants:
- A tenant's entries are only ever found by that tenant's lookups (a hit is a timing side
  channel, so the tenant is part of the key, not a filter applied afterwards).
- ``bytes`` is the sum of the stored entries' sizes and never exceeds ``max_bytes`` after a
  call returns; the entry count never exceeds ``max_entries``. Least recently used (stored or
  served) goes first, except that the most recent entry of each ``partition`` (a tenant's
  ``prompt_cache_key``) goes only once every other entry has gone: one busy key cannot evict
  the latest entry of every other key while the bounds can hold them. Entries stored without
  a partition are plain LRU. An entry larger than ``max_bytes`` is not kept (counted as an
  eviction). Partitions never reach across tenants (they are counted per tenant).
- ``lookup`` reuses at most ``limit`` tokens of the prompt and picks, among
  - an entry equal to a prefix of the prompt (used as it is),
  - an entry that shares a longer prefix with the prompt but goes on past it or diverges
    (used trimmed to the shared part; only when ``trimmable`` says the value allows it),
  the one that reuses the most tokens; on a tie, the one that needs no trimming, then the
  shortest. This is what mlx-lm's ``LRUPromptCache`` does (exact, longer trimmed, shorter).
  A value ``trimmable`` refuses (a recurrent or hybrid model's cache) is never trimmed: it
  serves only prompts it is an exact prefix of (segment checkpoints exist for those), and a
  trimmable entry sharing fewer tokens elsewhere in the tree still serves what it can.
- Every lookup counts as exactly one hit (``reused > 0``) or one miss; ``peek`` counts
  nothing and moves nothing (a caller that serves from elsewhere counts with ``record``).
- ``on_remove`` hears of every entry that leaves other than by ``clear`` or by being stored
  again under the same key: evicted (``evicted`` true) or dropped as redundant or on request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .cache_stats import PrefixCacheStats

V = TypeVar("V")

Tokens = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefixMatch(Generic[V]):
    """What a lookup found: ``value`` stored under ``key``; keep its first ``reused`` tokens
    (``trim`` = ``len(key) - reused`` tokens to cut off its end first)."""

    key: Tokens
    value: V
    reused: int

    @property
    def trim(self) -> int:
        return len(self.key) - self.reused


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    nbytes: int
    partition: str | None = None


@dataclass(slots=True, eq=False)
class _Node(Generic[V]):
    # ``edge`` is the run of tokens from the parent to this node (empty only at a root).
    edge: Tokens
    parent: _Node[V] | None
    children: dict[int, _Node[V]] = field(default_factory=dict)
    entry: _Entry[V] | None = None


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of ``a`` and ``b`` (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# Told of an entry that leaves: its tenant, key, value, and whether it was evicted.
RemoveHook = Callable[[str, Tokens, V, bool], None]


class PrefixCache(Generic[V]):
    """LRU-bounded radix tree from ``(tenant, tokens)`` to values. Not thread-safe: owned by
    one thread (the generation thread)."""

    def __init__(
        self, max_bytes: int, max_entries: int, on_remove: RemoveHook[V] | None = None
    ) -> None:
        if max_bytes < 0 or max_entries < 0:
            raise ValueError("prefix cache bounds must not be negative")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._roots: dict[str, _Node[V]] = {}
        self._lru: OrderedDict[tuple[str, Tokens], _Node[V]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._reused = 0
        self._evictions = 0
        # (tenant, partition) -> how many entries it holds (partitioned entries only).
        self._partitions: dict[tuple[str, str], int] = {}
        self._on_remove = on_remove
        self.stats = PrefixCacheStats(max_bytes=max_bytes, max_entries=max_entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_entries > 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keys(self, tenant: str) -> list[Tokens]:
        """The tenant's stored keys, least recently used first (tests and diagnostics)."""
        return [key for owner, key in self._lru if owner == tenant]

    def items(self) -> list[tuple[str, Tokens, V]]:
        """Every entry as ``(tenant, key, value)``, least recently used first."""
        out: list[tuple[str, Tokens, V]] = []
        for (owner, key), node in self._lru.items():
            assert node.entry is not None
            out.append((owner, key, node.entry.value))
        return out

    def __contains__(self, item: tuple[str, Tokens]) -> bool:
        return item in self._lru

    # -- lookup ---------------------------------------------------------------------------

    def peek(
        self,
        tenant: str,
        tokens: Sequence[int],
        *,
        limit: int | None = None,
        trimmable: Callable[[V], bool] = lambda _: True,
    ) -> PrefixMatch[V] | None:
        """What ``lookup`` would find, without counting it or making it recently used."""
        tokens = tuple(tokens)
        limit = len(tokens) if limit is None else max(0, min(limit, len(tokens)))
        match = self._find(tenant, tokens, limit, trimmable) if self.enabled else None
        return None if match is None or match.reused == 0 else match

    def record(self, reused: int) -> None:
        """Count a lookup served elsewhere: a hit of ``reused`` tokens, or a miss (0)."""
        if reused > 0:
            self._hits += 1
            self._reused += reused
        else:
            self._misses += 1
        self._refresh()

    def touch(self, tenant: str, tokens: Sequence[int]) -> None:
        """Make the entry under ``tokens`` most recently used (if there is one)."""
        key = (tenant, tuple(tokens))
        if key in self._lru:
            self._lru.move_to_end(key)

    def discard(self, tenant: str, tokens: Sequence[int]) -> None:
        """Drop the entry under ``tokens`` (if there is one); not an eviction."""
        if (tenant, tuple(tokens)) in self._lru:
            self._remove(tenant, tuple(tokens))
            self._refresh()

    def lookup(
        self,
        tenant: str,
        tokens: Sequence[int],
        *,
        limit: int | None = None,
        trimmable: Callable[[V], bool] = lambda _: True,
    ) -> PrefixMatch[V] | None:
        """The entry that serves the most of ``tokens`` (at most ``limit`` of them), or None.
        A hit makes the entry most recently used."""
        tokens = tuple(tokens)
        limit = len(tokens) if limit is None else max(0, min(limit, len(tokens)))
        match = self._find(tenant, tokens, limit, trimmable) if self.enabled else None
        if match is None or match.reused == 0:
            self._misses += 1
            match = None
        else:
            self._hits += 1
            self._reused += match.reused
            self._lru.move_to_end((tenant, match.key))
        self._refresh()
        return match

    def _find(
        self, tenant: str, tokens: Tokens, limit: int, trimmable: Callable[[V], bool]
    ) -> PrefixMatch[V] | None:
        root = self._roots.get(tenant)
        if root is None:
            return None
        best: PrefixMatch[V] | None = None
        node = root
        depth = 0  # tokens matched down to ``node``
        path: list[tuple[_Node[V], int]] = []  # the nodes matched whole, with their depth
        # Entries on the path are prefixes of ``tokens``: usable untrimmed up to ``limit``.
        while True:
            path.append((node, depth))
            if node.entry is not None and 0 < depth <= limit:
                best = PrefixMatch(tokens[:depth], node.entry.value, depth)
            child = node.children.get(tokens[depth]) if depth < len(tokens) else None
            if child is None:
                below, shared = node, depth
                path.pop()
                break
            k = common_length(child.edge, tokens[depth : depth + len(child.edge)])
            if k < len(child.edge):
                below, shared = child, depth + k
                break
            node, depth = child, depth + len(child.edge)
        # Any entry under ``below`` shares ``shared`` tokens with the prompt: trimmed, it
        # serves ``min(shared, limit)`` of them. The shortest such entry is the cheapest.
        # Failing that (no entry there can be trimmed), an entry off the path higher up
        # shares as many tokens as its branch point is deep.
        for top, reach, skip in [(below, shared, None)] + [
            (n, d, below if i == len(path) - 1 else path[i + 1][0])
            for i, (n, d) in reversed(list(enumerate(path)))
        ]:
            reusable = min(reach, limit)
            if reusable <= 0 or (best is not None and best.reused >= reusable):
                return best
            found = self._shortest_trimmable(top, skip, trimmable)
            if found is not None:
                assert found.entry is not None
                return PrefixMatch(_key_of(found), found.entry.value, reusable)
        return best

    def _shortest_trimmable(
        self, top: _Node[V], skip: _Node[V] | None, trimmable: Callable[[V], bool]
    ) -> _Node[V] | None:
        """The shortest entry in ``top``'s subtree, but not in ``skip``'s, that ``trimmable``
        allows."""
        if skip is None:
            nodes = list(_entries_below(top))
        else:
            nodes = [(0, top)] if top.entry is not None else []
            for child in top.children.values():
                if child is not skip:
                    nodes += _entries_below(child)
        for _, node in sorted(nodes, key=lambda pair: pair[0]):
            assert node.entry is not None
            if trimmable(node.entry.value):
                return node
        return None

    # -- insertion and eviction ------------------------------------------------------------

    def insert(
        self,
        tenant: str,
        tokens: Sequence[int],
        value: V,
        nbytes: int,
        *,
        supersedes_prefixes: bool = False,
        replaces: Sequence[int] | None = None,
        partition: str | None = None,
    ) -> None:
        """Store ``value`` under ``(tenant, tokens)``, replacing an entry with the same key;
        ``partition`` (the request's ``prompt_cache_key``) protects the latest entry of each
        partition from eviction while others can go (see the module's invariants).
        ``supersedes_prefixes``: the value can be trimmed, so entries under proper prefixes
        of ``tokens`` are redundant and dropped (not counted as evictions); then ``replaces``
        too, if given: the entry this one grew from, whose own continuation the
        conversation did not follow (an agent's replayed reply that re-tokenized
        differently), so it would only hold memory."""
        tokens = tuple(tokens)
        if not self.enabled or not tokens:
            return
        if nbytes > self.max_bytes:
            self._evictions += 1
            self._refresh()
            return
        node = self._node_for(tenant, tokens)
        if node.entry is not None:
            self._bytes -= node.entry.nbytes
            self._count(tenant, node.entry.partition, -1)
        node.entry = _Entry(value, nbytes, partition)
        self._count(tenant, partition, 1)
        self._bytes += nbytes
        self._lru[(tenant, tokens)] = node
        self._lru.move_to_end((tenant, tokens))
        if supersedes_prefixes and replaces is not None:
            parent_key = tuple(replaces)
            if parent_key != tokens and (tenant, parent_key) in self._lru:
                self._remove(tenant, parent_key)
        if supersedes_prefixes:
            ancestor = node.parent
            depth = len(tokens) - len(node.edge)
            while ancestor is not None:
                parent = ancestor.parent
                if ancestor.entry is not None:
                    self._remove(tenant, tokens[:depth])
                depth -= len(ancestor.edge)
                ancestor = parent
        while len(self._lru) > self.max_entries or self._bytes > self.max_bytes:
            self._remove(*self._victim(), evicted=True)
            self._evictions += 1
        self._refresh()

    def trim_to(self, max_bytes: int) -> None:
        """Evict least recently used entries until at most ``max_bytes`` are held."""
        while self._lru and self._bytes > max(0, max_bytes):
            self._remove(*self._victim(), evicted=True)
            self._evictions += 1
        self._refresh()

    def clear(self) -> None:
        self._roots.clear()
        self._lru.clear()
        self._partitions.clear()
        self._bytes = 0
        self._refresh()

    def _victim(self) -> tuple[str, Tokens]:
        """The least recently used entry that is not its partition's only (latest) one; the
        least recently used of all when every entry is."""
        for (owner, key), node in self._lru.items():
            assert node.entry is not None
            partition = node.entry.partition
            if partition is None or self._partitions[(owner, partition)] > 1:
                return owner, key
        return next(iter(self._lru))

    def _count(self, tenant: str, partition: str | None, change: int) -> None:
        if partition is None:
            return
        slot = (tenant, partition)
        left = self._partitions.get(slot, 0) + change
        if left > 0:
            self._partitions[slot] = left
        else:
            self._partitions.pop(slot, None)

    def _node_for(self, tenant: str, tokens: Tokens) -> _Node[V]:
        """The node for ``tokens`` in the tenant's tree, made (splitting an edge) if needed."""
        node = self._roots.get(tenant)
        if node is None:
            node = self._roots[tenant] = _Node((), None)
        depth = 0
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                leaf: _Node[V] = _Node(tokens[depth:], node)
                node.children[tokens[depth]] = leaf
                return leaf
            k = common_length(child.edge, tokens[depth : depth + len(child.edge)])
            if k < len(child.edge):
                # Split ``child``'s edge after its first ``k`` tokens.
                middle: _Node[V] = _Node(child.edge[:k], node)
                node.children[tokens[depth]] = middle
                child.edge = child.edge[k:]
                child.parent = middle
                middle.children[child.edge[0]] = child
                child = middle
            node, depth = child, depth + len(child.edge)
        return node

    def _remove(self, tenant: str, tokens: Tokens, evicted: bool = False) -> None:
        node = self._lru.pop((tenant, tokens))
        entry = node.entry
        assert entry is not None
        self._bytes -= entry.nbytes
        self._count(tenant, entry.partition, -1)
        node.entry = None
        # Prune: drop empty leaves, merge a valueless node with its only child.
        while node.parent is not None and node.entry is None and len(node.children) <= 1:
            parent = node.parent
            if not node.children:
                del parent.children[node.edge[0]]
            else:
                (only,) = node.children.values()
                only.edge = node.edge + only.edge
                only.parent = parent
                parent.children[only.edge[0]] = only
                # Keys held by the LRU are unchanged; only the tree's shape is.
            node = parent
        if node.parent is None and not node.children and node.entry is None:
            self._roots.pop(tenant, None)
        if self._on_remove is not None:  # the tree is whole again: the hook may look at it
            self._on_remove(tenant, tokens, entry.value, evicted)

    def _refresh(self) -> None:
        self.stats = PrefixCacheStats(
            hits=self._hits,
            misses=self._misses,
            tokens_reused=self._reused,
            evictions=self._evictions,
            entries=len(self._lru),
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            max_entries=self.max_entries,
        )


def _entries_below(start: _Node[V]) -> Iterator[tuple[int, _Node[V]]]:
    """Nodes holding an entry in ``start``'s subtree (itself included), with their depth
    below ``start``'s parent (only the order matters)."""
    stack: list[tuple[_Node[V], int]] = [(start, len(start.edge))]
    while stack:
        node, depth = stack.pop()
        if node.entry is not None:
            yield depth, node
        for child in node.children.values():
            stack.append((child, depth + len(child.edge)))


def _key_of(node: _Node[V]) -> Tokens:
    """The tokens from the root to ``node``."""
    parts: list[Tokens] = []
    walk: _Node[V] | None = node
    while walk is not None:
        parts.append(walk.edge)
        walk = walk.parent
    return tuple(token for part in reversed(parts) for token in part)
