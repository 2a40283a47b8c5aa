"""A prefix cache for :meth:`specserve.runtime.decoder.SpecDecoder.verify` calls (TensorRT-LLM's
``draft_input_ids`` requests, which the BLS draft-target loop sends one per iteration with the
whole context so far): the target's K/V of the context's full blocks are restored from a
:class:`~specserve.runtime.kv_pool.KVPool` of target-only blocks, so a call prefills only the
context's tail; after the call the blocks of the context and the accepted tokens are stored for
the next iteration. TensorRT-LLM's draft-target recipe sets ``enable_kv_cache_reuse`` on the
target engine for the same reason (NVIDIA/TensorRT-LLM ``docs/source/advanced/
speculative-decoding.md``, draft-target-model with the Triton BLS).

Outputs are unchanged: position p's K/V depends only on tokens 0..p, and a block is found only
after exactly the same tokens (:func:`~specserve.runtime.kv_pool.chain_hashes`).
"""

from __future__ import annotations

import torch

from specserve.runtime.kv_pool import BLOCK_SIZE, KVPool, Plane, chain_hashes
from specserve.runtime.kvcache import KVCache


class VerifyPrefixCache:
    """The decoder's :class:`~specserve.runtime.decoder.PrefixSource` over a target-only pool of
    ``budget_bytes`` (blocks of ``block_size`` tokens)."""

    def __init__(self, plane: Plane, budget_bytes: int, block_size: int = BLOCK_SIZE,
                 device: torch.device | str = "cpu") -> None:
        self.pool = KVPool.from_budget([plane], budget_bytes, block_size, device)

    def restore(self, seqs: list[list[int]], cache: KVCache) -> list[int]:
        """Each row's cached full-block prefix into ``cache`` (its last token stays out: it is
        the verify step's pending token); the positions restored per row."""
        bs, out = self.pool.block_size, []
        for b, seq in enumerate(seqs):
            ids = self.pool.match(chain_hashes(seq, bs, limit=(len(seq) - 1) // bs))
            if ids:
                cache.restore(b, self.pool.read(ids)[0])
            out.append(len(ids) * bs)
        return out

    def keep(self, seqs: list[list[int]], cache: KVCache) -> None:
        """Store each row's full blocks after the call (positions before ``min(K/V length,
        sequence length)``: the K/V at p is that of ``seq[p]``)."""
        bs = self.pool.block_size
        for b, seq in enumerate(seqs):
            n = min(cache.lengths[b], len(seq)) // bs
            hashes = chain_hashes(seq, bs, limit=n)
            got = self.pool.store(hashes, None, seq[:n * bs])
            new = [(i, blk) for i, (blk, fresh) in enumerate(got) if fresh]
            if new:
                dev = cache.k[0].device
                pos = torch.cat([torch.arange(i * bs, (i + 1) * bs) for i, _ in new]).to(dev)
                self.pool.write([blk for _, blk in new], [cache.export(b, pos)])
            self.pool.release([blk for blk, _ in got])
