"""A prefix cache for :meth:`specserve.runtime.decoder.SpecDecoder.verify` calls (TensorRT-LLM's
``draft_input_ids`` requests, which the BLS draft-target loop sends one per iteration with the
whole context so far): the target's K/V of the context's full blocks are restored from a
:class:`~specserve.runtime.kv_pool.KVPool` of target-only blocks, so a call prefills only the
context's tail; after the call the blocks of the context and the accepted tokens are stored for
the next iteration. TensorRT-LLM's draft-target recipe sets ``enable_kv_cache_reuse`` on the
target engine for the same reason (NVIDIA/TensorRT-LLM ``docs/source/advanced/
speculative-decoding.md``, draft-target-model with the Triton BLS).

The context's last, partial block is kept too (:class:`TailStore`, a bounded LRU keyed by the
full blocks' chain hash and the tail's tokens): the BLS loop's next context is this call's
context plus the accepted drafts and the target's token, whose K/V up to that last token this
call computed. With it the next call restores everything but its pending token and runs one
target forward (the verify step) instead of two (the tail's prefill, then the step): the prefill
of a tail of 0-15 tokens cost about as much as the verify step itself (py-spy, docs/results.md,
"The BLS loop against the engine's own speculation").

Outputs are unchanged: position p's K/V depends only on tokens 0..p, and a block or a tail is
found only after exactly the same tokens (:func:`~specserve.runtime.kv_pool.chain_hashes`, the
tail's tokens compared whole).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from specserve.runtime.kv_pool import BLOCK_SIZE, ROOT_HASH, KVPool, Plane, chain_hashes
from specserve.runtime.kvcache import KVCache

#: Share of the budget the tails may take (each holds under one block's positions).
TAIL_SHARE = 16


class TailStore:
    """Partial last blocks: ``(chain hash of the full blocks before it, its tokens) -> K/V``
    [N, *plane] (N < block size), at most ``capacity`` of them, least recently used evicted.
    A tail is taken out when it is restored: the call that restores it stores its successor,
    so a BLS loop holds one tail at a time and ``capacity`` loops keep theirs (an LRU that kept
    every iteration's tail would evict exactly the ones the next round needs once more loops
    than that take turns)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tails: OrderedDict[tuple[int, tuple[int, ...]], torch.Tensor] = OrderedDict()

    def put(self, parent: int, tokens: list[int], data: torch.Tensor) -> None:
        if self.capacity < 1 or not tokens:
            return
        key = (parent, tuple(tokens))
        self.tails[key] = data
        self.tails.move_to_end(key)
        while len(self.tails) > self.capacity:
            self.tails.popitem(last=False)

    def take(self, parent: int, tokens: list[int]) -> torch.Tensor | None:
        """Remove and return the K/V of the longest stored tail after ``parent`` that
        ``tokens`` starts with."""
        for n in range(len(tokens), 0, -1):
            data = self.tails.pop((parent, tuple(tokens[:n])), None)
            if data is not None:
                return data
        return None


class VerifyPrefixCache:
    """The decoder's :class:`~specserve.runtime.decoder.PrefixSource` over a target-only pool of
    ``budget_bytes`` (blocks of ``block_size`` tokens)."""

    def __init__(self, plane: Plane, budget_bytes: int, block_size: int = BLOCK_SIZE,
                 device: torch.device | str = "cpu") -> None:
        tail_bytes = budget_bytes // TAIL_SHARE
        self.pool = KVPool.from_budget([plane], budget_bytes - tail_bytes, block_size, device)
        self.tails = TailStore(tail_bytes // max(block_size * plane.token_bytes, 1))

    def restore(self, seqs: list[list[int]], cache: KVCache) -> list[int]:
        """Each row's cached prefix into ``cache``: its full blocks, then the longest stored tail
        after them (its last token stays out: it is the verify step's pending token); the
        positions restored per row."""
        bs, out = self.pool.block_size, []
        for b, seq in enumerate(seqs):
            hashes = chain_hashes(seq, bs, limit=(len(seq) - 1) // bs)
            ids = self.pool.match(hashes)
            if ids:
                cache.restore(b, self.pool.read(ids)[0])
            parent = hashes[len(ids) - 1] if ids else ROOT_HASH
            start = len(ids) * bs
            tail = self.tails.take(parent, seq[start:start + bs - 1])  # the pending token
            if tail is not None:  # may be in it (the same context again): not restored
                tail = tail[:len(seq) - 1 - start]
                cache.restore(b, tail, at=start)
            out.append(start + (0 if tail is None else tail.shape[0]))
        return out

    def keep(self, seqs: list[list[int]], cache: KVCache) -> None:
        """Store each row's full blocks and its partial last block after the call (positions
        before ``min(K/V length, sequence length)``: the K/V at p is that of ``seq[p]``)."""
        bs = self.pool.block_size
        dev = cache.k[0].device
        for b, seq in enumerate(seqs):
            valid = min(cache.lengths[b], len(seq))
            n = valid // bs
            hashes = chain_hashes(seq, bs, limit=n)
            got = self.pool.store(hashes, None, seq[:n * bs])
            new = [(i, blk) for i, (blk, fresh) in enumerate(got) if fresh]
            if new:
                pos = torch.cat([torch.arange(i * bs, (i + 1) * bs) for i, _ in new]).to(dev)
                self.pool.write([blk for _, blk in new], [cache.export(b, pos)])
            self.pool.release([blk for blk, _ in got])
            if len(got) == n and valid > n * bs:  # the tail's parent blocks are all stored
                self.tails.put(hashes[-1] if n else ROOT_HASH, seq[n * bs:valid],
                               cache.export(b, torch.arange(n * bs, valid, device=dev)))
