"""A paged prefix cache of KV blocks (prefix caching as vLLM v1's ``BlockPool`` does it,
vllm-project/vllm ``vllm/v1/core/block_pool.py`` and ``vllm/v1/core/kv_cache_utils.py``):

- a sequence's tokens are cut into fixed-size blocks (``block_size`` tokens, 16 by default as
  vLLM's); only full blocks are cached;
- a full block is named by its **token chain**: ``hash(parent hash, its tokens)`` (vLLM's
  ``hash_block_tokens(parent_block_hash, curr_block_token_ids)``), so equal hashes mean equal
  *prefixes*, not only equal blocks (:func:`chain_hashes`);
- a pool of ``num_blocks`` block slots, from a memory budget in bytes (:meth:`KVPool.
  from_budget`), holds one tensor per *plane* (a per-token state: the target's K/V over all
  layers, the draft model's, EAGLE-3's fused features), ``[num_blocks, block_size, *shape]``;
- blocks are shared by reference count; a block whose count drops to 0 stays cached in an LRU
  free list (vLLM's ``FreeKVCacheBlockQueue``) and is evicted (its hash forgotten) only when a
  new block needs its slot; a sequence's blocks are freed last block first, so its tail goes
  before the prefix others share (vLLM frees ``reversed(req_blocks)``).

The pool is bookkeeping plus tensors: who decides what to look up, store and release is the
scheduler (:mod:`specserve.runtime.scheduler`); the model runner copies rows' state in and out
(:meth:`KVPool.read` / :meth:`KVPool.write`). ``on_event`` (optional) is told of every block
stored and removed (:class:`BlockStored` / :class:`BlockRemoved`, the events of vLLM's
``vllm/distributed/kv_events.py`` that Dynamo's KV router consumes).

What is paged and what is not: the running rows' K/V stay contiguous (one
``[capacity, n_kv, max_len + lookahead, D]`` buffer per layer; attention never reads the pool).
The pool is a paged copy of full blocks: a newcomer's cached prefix is copied into its row and
only the rest is prefilled; a row's full blocks are stored as they fill and kept after it
leaves. A full pool skips a store (never an error), and a request never waits for the pool.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specserve.errors import SpecserveError

BLOCK_SIZE = 16  # tokens per block (vLLM's default block_size)
ROOT_HASH = 0  # the parent hash of a sequence's first block


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The 64-bit name of a full block: a hash of its parent block's hash and its tokens."""
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "little"))
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens))
    return int.from_bytes(h.digest(), "little")


def chain_hashes(tokens: Sequence[int], block_size: int, limit: int | None = None,
                 parent: int = ROOT_HASH) -> list[int]:
    """The hash chain of ``tokens``' full blocks (at most ``limit`` of them)."""
    n = len(tokens) // block_size if limit is None else min(limit, len(tokens) // block_size)
    out: list[int] = []
    for i in range(n):
        parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


@dataclass(frozen=True)
class Plane:
    """One per-token state the pool keeps per block: ``shape`` per token, ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def token_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class BlockStored:
    """Blocks stored (vLLM's ``BlockStored``): their hashes in chain order, the parent of the
    first (None: a sequence's first block), their tokens, the block size."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks evicted (vLLM's ``BlockRemoved``)."""

    block_hashes: tuple[int, ...]


KVEvent = BlockStored | BlockRemoved


@dataclass(frozen=True)
class PoolStats:
    """Counters: blocks looked up and found (hit rate), stored, evicted, stores skipped because
    every block was in use."""

    queried: int
    hit: int
    stored: int
    evicted: int
    skipped: int


class KVPool:
    """``num_blocks`` block slots of ``block_size`` tokens, one storage tensor per plane."""

    def __init__(self, planes: Sequence[Plane], block_size: int, num_blocks: int,
                 device: torch.device | str = "cpu",
                 on_event: Callable[[KVEvent], None] | None = None) -> None:
        if block_size < 1 or num_blocks < 1:
            raise SpecserveError(f"kv pool: block_size {block_size} and num_blocks "
                                 f"{num_blocks} must be >= 1")
        self.planes, self.block_size, self.num_blocks = tuple(planes), block_size, num_blocks
        # torch.empty: untouched pages cost no resident memory until a block is written
        self.storage = [torch.empty((num_blocks, block_size, *p.shape), dtype=p.dtype,
                                    device=device) for p in self.planes]
        self.on_event = on_event
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._queried = self._hit = self._stored = self._evicted = self._skipped = 0

    @classmethod
    def from_budget(cls, planes: Sequence[Plane], budget_bytes: int,
                    block_size: int = BLOCK_SIZE, device: torch.device | str = "cpu",
                    on_event: Callable[[KVEvent], None] | None = None) -> KVPool:
        """As many blocks as ``budget_bytes`` holds; SpecserveError when not one fits."""
        per_block = block_size * sum(p.token_bytes for p in planes)
        n = budget_bytes // max(per_block, 1)
        if n < 1:
            raise SpecserveError(f"kv pool: a budget of {budget_bytes} bytes holds no block "
                                 f"({per_block} bytes each: {block_size} tokens)")
        return cls(planes, block_size, n, device, on_event)

    @staticmethod
    def block_bytes(planes: Sequence[Plane], block_size: int = BLOCK_SIZE) -> int:
        return block_size * sum(p.token_bytes for p in planes)

    @property
    def stats(self) -> PoolStats:
        return PoolStats(self._queried, self._hit, self._stored, self._evicted, self._skipped)

    @property
    def cached(self) -> int:
        """Blocks holding a named prefix (in use or free)."""
        return len(self.by_hash)

    @property
    def in_use(self) -> int:
        return sum(1 for r in self.ref if r)

    def match(self, hashes: Sequence[int], count: bool = True) -> list[int]:
        """The block ids of the longest cached prefix of ``hashes`` (nothing is acquired);
        ``count``: in the hit-rate counters (False: a look that admits nothing)."""
        out: list[int] = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        if count:
            self._queried += len(hashes)
            self._hit += len(out)
        return out

    def acquire(self, ids: Sequence[int]) -> None:
        """One more reference to each block (a cached free block leaves the free list)."""
        for b in ids:
            if self.ref[b] == 0:
                self.free.pop(b, None)
            self.ref[b] += 1

    def release(self, ids: Sequence[int]) -> None:
        """One reference less to each block, the last one first; a block no one holds goes to
        the free list's most recently used end (still cached)."""
        for b in reversed(ids):
            if self.ref[b] <= 0:
                raise RuntimeError(f"kv pool: block {b} released more often than acquired")
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def store(self, hashes: Sequence[int], parent: int | None,
              tokens: Sequence[int]) -> list[tuple[int, bool]]:
        """Blocks for the hashes of a chain (``tokens``: the blocks' tokens, for the event),
        each acquired once: ``(id, True)`` a new block, its data the caller's to :meth:`write`
        before anyone reads it; ``(id, False)`` a block that is cached already. When no block
        is free the rest of the chain is not stored (the list is shorter). The caller releases
        the ids later (:meth:`release`). ``parent``: the hash before ``hashes[0]`` (None: the
        chain starts the sequence)."""
        out: list[tuple[int, bool]] = []
        bs = self.block_size
        for i, h in enumerate(hashes):
            have = self.by_hash.get(h)
            if have is not None:
                self.acquire([have])
                out.append((have, False))
                continue
            b = self._take()
            if b is None:
                self._skipped += len(hashes) - i
                break
            self.hash_of[b], self.by_hash[h], self.ref[b] = h, b, 1
            out.append((b, True))
            self._stored += 1
            if self.on_event is not None:
                self.on_event(BlockStored((h,), parent if i == 0 else hashes[i - 1],
                                          tuple(tokens[i * bs:(i + 1) * bs]), bs))
        return out

    def _take(self) -> int | None:
        """A free slot: never used ones first, then the least recently used cached one
        (evicted: its hash forgotten)."""
        if not self.free:
            return None
        b, _ = self.free.popitem(last=False)
        old = self.hash_of[b]
        if old is not None:
            del self.by_hash[old]
            self.hash_of[b] = None
            self._evicted += 1
            if self.on_event is not None:
                self.on_event(BlockRemoved((old,)))
        return b

    def clear(self) -> None:
        """Forget every block (after a failed step: what it was writing is not trusted)."""
        removed = tuple(self.by_hash)
        self.ref = [0] * self.num_blocks
        self.hash_of = [None] * self.num_blocks
        self.by_hash = {}
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))
        if removed and self.on_event is not None:
            self.on_event(BlockRemoved(removed))

    def write(self, ids: Sequence[int], data: Sequence[torch.Tensor]) -> None:
        """Blocks ``ids`` take ``data``: per plane ``[len(ids) * block_size, *shape]``."""
        idx = torch.tensor(list(ids), dtype=torch.long)
        for buf, x in zip(self.storage, data, strict=True):
            buf[idx] = x.reshape(len(ids), self.block_size, *x.shape[1:]).to(buf.dtype)

    def read(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """Blocks ``ids``' data: per plane ``[len(ids) * block_size, *shape]`` (a copy)."""
        idx = torch.tensor(list(ids), dtype=torch.long)
        return [buf[idx].reshape(len(ids) * self.block_size, *buf.shape[2:])
                for buf in self.storage]
