"""The scheduler's prefix-cache bookkeeping for its requests: which cached pool blocks a prompt
can reuse, which full blocks of the running rows go into the cache, and a leaving request's
blocks handed back (vLLM v1's ``KVCacheManager`` role beside its scheduler: hash-chained full
blocks, ``vllm/v1/core/kv_cache_manager.py``). :class:`~specserve.runtime.kv_pool.KVPool` holds
the blocks; the runner copies K/V as the plan's :class:`~specserve.runtime.plan.Store` entries
say. Every function takes ``kv`` None (no prefix cache) and then does nothing."""

from __future__ import annotations

from collections.abc import Sequence

from specserve.runtime.kv_pool import ROOT_HASH, KVPool, chain_hashes
from specserve.runtime.plan import Handle, Store


def cached_blocks(kv: KVPool | None, h: Handle, count: bool = True) -> list[int]:
    """The pool blocks of ``h``'s prompt's longest cached full-block prefix (its last token is
    always prefilled: its logits give the first token); ``count``: in the prefix cache's hit
    rate (a request that joins, not one looked up to order the queue)."""
    if kv is None:
        return []
    bs = kv.block_size
    if not h.hashes:
        h.hashes = chain_hashes(h.prompt, bs, limit=(len(h.prompt) - 1) // bs)
    return kv.match(h.hashes[:(len(h.prompt) - 1) // bs], count)


def plan_stores(kv: KVPool | None, rows: Sequence[Handle], leaving: set[int]) -> list[Store]:
    """The full blocks of the runner's ``rows`` (pool row i = ``rows[i]``, as the last plan
    left them) that are not in the prefix cache yet; ``leaving``: ids of the handles that left
    since. Every position before a row's last two tokens is in its K/V and in the proposer's
    state (the draft model feeds a token one step late). A running row stores its prompt's
    blocks (the step after its prefill: what a concurrent request with the same prefix can
    reuse); the blocks it generates go in one store when it leaves (what the next turn of a
    conversation resends). Storing each block as it filled cost 6-8% of tok/s at c = 8-16 when
    nothing was reused (docs/results.md, "How much memory?")."""
    if kv is None:
        return []
    out = []
    bs = kv.block_size
    for i, h in enumerate(rows):
        if h.row is None:
            continue
        seq = h.row.seqs[0]
        upto = max(len(seq) - 2, 0) // bs
        if id(h) not in leaving:
            upto = min(upto, len(h.prompt) // bs)
        if upto <= h.stored:
            continue
        have = len(h.hashes)
        if have < upto:
            h.hashes += chain_hashes(seq[have * bs:upto * bs], bs,
                                     parent=h.hashes[-1] if have else ROOT_HASH)
        lo = h.stored
        got = kv.store(h.hashes[lo:upto], h.hashes[lo - 1] if lo else None,
                       seq[lo * bs:upto * bs])
        h.blocks += [b for b, _ in got]
        h.stored += len(got)
        new = tuple((lo + k, b) for k, (b, fresh) in enumerate(got) if fresh)
        if new:
            out.append(Store(i, new))
    return out


def release_blocks(kv: KVPool | None, h: Handle) -> None:
    """``h`` left: its blocks stay cached, free to evict."""
    if kv is not None and h.blocks:
        kv.release(h.blocks)
    h.blocks = []
