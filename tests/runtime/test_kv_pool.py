"""The prefix cache (specserve.runtime.kv_pool) and its use by the in-flight scheduler.

Pool: the hash chain (a block's name depends on every token before it), reference counts,
the LRU free list (a freed sequence's tail is evicted first), the byte budget, events.
Scheduler: a newcomer restores a cached prefix only after exactly the same tokens, and an
evicted block is never found again (its tokens equal their run alone).
Planted faults these fail on: a block hash that ignores its parent (a block shared
by position-shifted text); an evicted block whose hash stays in the index (a block reused after
its content changed); see the report of the change for the counts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.kv_pool import (
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVPool,
    Plane,
    block_hash,
    chain_hashes,
)
from specserve.runtime.proposers import ExternalDraftProposer
from specserve.runtime.scheduler import Scheduler
from specserve.runtime.verify_cache import TailStore, VerifyPrefixCache
from tests.runtime.conftest import TinyModels
from tests.runtime.test_scheduler import _proposer

PLANE = Plane("x", (2,), torch.float32)


def _pool(n: int, events: list[KVEvent] | None = None) -> KVPool:
    return KVPool([PLANE], 2, n, on_event=None if events is None else events.append)


def test_a_block_hash_names_its_whole_prefix() -> None:
    a = chain_hashes([1, 2, 3, 4, 5], 2)
    assert len(a) == 2  # full blocks only
    assert chain_hashes([1, 2, 3, 4, 9, 9], 2)[:2] == a
    assert chain_hashes([1, 2, 3, 4], 2, limit=1) == a[:1]
    shifted = chain_hashes([3, 4], 2)  # the same block tokens after another prefix
    assert shifted[0] != a[1]
    assert block_hash(a[0], [3, 4]) == a[1]


def test_match_finds_the_longest_cached_prefix() -> None:
    pool = _pool(4)
    h = chain_hashes([1, 2, 3, 4, 5, 6], 2)
    got = pool.store(h[:2], None, [1, 2, 3, 4])
    assert [fresh for _, fresh in got] == [True, True]
    assert pool.match(h) == [b for b, _ in got]
    assert pool.match(chain_hashes([1, 2, 9, 9], 2)) == [got[0][0]]
    assert pool.match(chain_hashes([9, 9, 3, 4], 2)) == []


def test_reference_counts_and_the_lru_free_list() -> None:
    pool = _pool(3)
    a = chain_hashes([1, 1, 2, 2], 2)
    ids = [b for b, _ in pool.store(a, None, [1, 1, 2, 2])]
    pool.acquire(ids[:1])  # a second holder of the first block
    pool.release(ids)
    assert pool.in_use == 1 and pool.cached == 2
    b = chain_hashes([7, 7, 8, 8], 2)
    got = pool.store(b, None, [7, 7, 8, 8])  # one never-used slot, then the LRU one
    assert len(got) == 2 and pool.match(a) == [ids[0]]  # a's tail went, its held head stays
    pool.release(ids[:1])
    pool.release([x for x, _ in got])
    # least recently used first: a's head (freed first), then b's tail before its head
    assert list(pool.free) == [ids[0], got[1][0], got[0][0]]
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(ids[:1])


def test_a_full_pool_skips_stores() -> None:
    pool = _pool(1)
    a = chain_hashes([1, 1, 2, 2], 2)
    got = pool.store(a, None, [1, 1, 2, 2])
    assert len(got) == 1 and pool.stats.skipped == 1  # the chain is cut where none is free
    assert pool.store(chain_hashes([5, 5], 2), None, [5, 5]) == []  # held: nothing to evict


def test_the_budget_sets_the_block_count() -> None:
    per = KVPool.block_bytes([PLANE], 16)  # 16 tokens x 2 floats
    assert per == 128
    assert KVPool.from_budget([PLANE], 10 * per + 5).num_blocks == 10
    with pytest.raises(SpecserveError, match="holds no block"):
        KVPool.from_budget([PLANE], per - 1)


def test_write_read_and_events() -> None:
    events: list[KVEvent] = []
    pool = _pool(1, events)
    h = chain_hashes([1, 2, 3, 4], 2)
    (b, _), = pool.store(h[:1], None, [1, 2])
    pool.write([b], [torch.tensor([[1.0, 2.0], [3.0, 4.0]])])
    assert torch.equal(pool.read([b])[0], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    pool.release([b])
    pool.store(chain_hashes([5, 6], 2), None, [5, 6])
    assert events[0] == BlockStored((h[0],), None, (1, 2), 2)
    assert events[1] == BlockRemoved((h[0],))
    pool.clear()
    assert pool.cached == 0 and isinstance(events[-1], BlockRemoved)


# the scheduler with a prefix cache of 4-token blocks
BLOCK = 4


def _run(m: TinyModels, kind: str, prompts: list[list[int]], cache: int
         ) -> tuple[list[list[int]], Scheduler]:
    """The prompts one after another (each arrives when the last finished)."""
    sch = Scheduler(SpecDecoder(m.target, _proposer(kind, m)), 2, max_len=64,
                    prefix_cache_bytes=cache, block_size=BLOCK)
    out = []
    for p in prompts:
        h = sch.submit(p, SamplingParams(max_tokens=6))
        sch.run_until_idle()
        assert h.result is not None
        out.append(h.result.token_ids)
    return out, sch


def _alone(m: TinyModels, kind: str, prompts: list[list[int]]) -> list[list[int]]:
    dec = SpecDecoder(m.target, _proposer(kind, m))
    return [dec.generate([p], SamplingParams(max_tokens=6))[0].token_ids for p in prompts]


A, B, C, D = [11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34], [41, 42, 43, 44]
E, F = [51, 52, 53, 54], [61, 62, 63, 64]
SHIFTED = [  # no two prompts start alike, but every block of a later prompt appears at
    # another position of an earlier one (or after another block)
    A + B + C + [5], B + C + [6], C + D + [7], D + A + B + [8], E + A + B + [9], F + C + [3]]


@pytest.mark.parametrize("kind", ["none", "draft_same"])
def test_a_prefix_is_restored_only_after_the_same_tokens(tiny_models: TinyModels,
                                                         kind: str) -> None:
    got, sch = _run(tiny_models, kind, SHIFTED, 1 << 22)
    assert got == _alone(tiny_models, kind, SHIFTED)
    assert sch.kv is not None and sch.kv.stats.hit == 0  # no prompt repeats a prefix


@pytest.mark.parametrize("kind", ["none", "eagle3"])
def test_a_restored_prefix_gives_the_tokens_of_a_full_prefill(tiny_models: TinyModels,
                                                              kind: str) -> None:
    turns = [A + B + [5], A + B + [5, 6, 7, 8, 9], A + B + C + D + [1], A + [2, 2, 2, 2, 3]]
    got, sch = _run(tiny_models, kind, turns, 1 << 22)
    assert got == _alone(tiny_models, kind, turns)
    assert sch.kv is not None and sch.kv.stats.hit >= 4


def test_an_evicted_block_is_never_restored(tiny_models: TinyModels) -> None:
    """A cache of two blocks: every prompt evicts the last one's blocks; its hashes must go
    with them (else a repeated prompt restores another prompt's K/V)."""
    m = tiny_models
    dec = SpecDecoder(m.target)
    per = KVPool.block_bytes([m.target.new_cache(1, 1).plane("t")], BLOCK)
    prompts = [A + B + [1], C + D + [2], A + B + [1], C + D + [2], A + B + [1]]
    got, sch = _run(m, "none", prompts, 2 * per)
    assert got == [dec.generate([p], SamplingParams(max_tokens=6))[0].token_ids
                   for p in prompts]
    assert sch.kv is not None and sch.kv.num_blocks == 2 and sch.kv.stats.evicted >= 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_bls_loop_verify_calls_reuse_the_context_and_verify_alike(
        tiny_models: TinyModels, temperature: float) -> None:
    """The BLS draft-target loop's shape: each iteration one verify call with the whole
    context so far and 4 drafts (the target's own, one of them made wrong in two iterations
    of three, so that 1-5 tokens are kept); with the verify prefix cache each call restores
    the context's full blocks, and its tokens and logits equal the call without it."""
    m = tiny_models
    plane = m.target.new_cache(1, 1).plane("target")
    cache = VerifyPrefixCache(plane, 1 << 22, block_size=BLOCK)
    restored = _spy_restore(cache)
    dec, drafter = SpecDecoder(m.target), SpecDecoder(m.target_copy)
    ctx = [7, 8, 9, 10, 11, 12, 13]
    lens = []
    for it in range(12):
        drafts = drafter.generate([ctx], SamplingParams(max_tokens=4, min_tokens=4))[0].token_ids
        if it % 3:
            drafts[it % 3] = (drafts[it % 3] + 1) % m.target.cfg.vocab_size
        p = SamplingParams(max_tokens=5, temperature=temperature, seed=it)
        runs = [dec.verify([ctx], p, ExternalDraftProposer([drafts]), return_logits=True,
                           prefix=pre)[0] for pre in (None, cache)]
        assert runs[0].token_ids == runs[1].token_ids, f"iteration {it}"
        assert runs[1].logits is not None and runs[0].logits is not None
        assert torch.allclose(runs[0].logits, runs[1].logits, atol=1e-5), f"iteration {it}"
        lens.append(len(ctx))
        ctx = ctx + runs[0].token_ids
    assert cache.pool.stats.hit >= 12
    assert any(n % BLOCK == 0 for n in lens)  # a context ending on a block boundary
    # from the second call on, the whole context but its pending token is restored (the full
    # blocks and the last call's tail): the call's only target forward is the verify step
    assert restored == [0] + [n - 1 for n in lens[1:]]


def _spy_restore(cache: VerifyPrefixCache) -> list[int]:
    """The positions each ``cache.restore`` call restored (row 0), recorded as it runs."""
    seen: list[int] = []
    real = cache.restore

    def restore(seqs: list[list[int]], kv: Any) -> list[int]:
        out = real(seqs, kv)
        seen.append(out[0])
        return out
    cache.restore = restore  # type: ignore[method-assign]
    return seen


def test_a_tail_is_restored_only_after_the_same_blocks_and_the_same_tokens(
        tiny_models: TinyModels) -> None:
    """Contexts that share a tail's tokens after other full blocks (``B + T`` after ``A + T``),
    or share the blocks but not the tail (``A + U``), restore no tail; ``A + T`` again restores
    it. Every call's logits equal the call without a cache."""
    m = tiny_models
    cache = VerifyPrefixCache(m.target.new_cache(1, 1).plane("target"), 1 << 22,
                              block_size=BLOCK)
    restored = _spy_restore(cache)
    dec = SpecDecoder(m.target)
    a, b, t, u = [5, 6, 7, 8], [9, 10, 11, 12], [20, 21, 22], [20, 23, 22]
    for ctx in (a + t, b + t, a + u, a + t, a + t + [3]):
        p = SamplingParams(max_tokens=3)
        runs = [dec.verify([ctx], p, ExternalDraftProposer([[1, 2]]), return_logits=True,
                           prefix=pre)[0] for pre in (None, cache)]
        assert runs[0].logits is not None and runs[1].logits is not None
        assert torch.allclose(runs[0].logits, runs[1].logits, atol=1e-5), ctx
    # a+t stores block a and its tail [20, 21, 22]; b+t: nothing of a's; a+u: block a only
    # (its tail differs at the second token); a+t again: block a and the stored tail but its
    # last token (the pending one); a+t+[3]: block a and the whole stored tail
    assert restored == [0, 0, BLOCK, BLOCK + 2, BLOCK + 3]


def test_tail_store_is_a_bounded_lru_taken_by_its_longest_prefix() -> None:
    store = TailStore(capacity=2)
    x, y = torch.zeros(2, 1), torch.ones(1, 1)
    store.put(1, [4, 5], x)
    store.put(1, [4], y)
    assert store.take(2, [4, 5]) is None  # another prefix
    assert store.take(1, [4, 5, 6]) is x  # the longest stored tail the tokens start with
    assert store.take(1, [4, 5]) is y  # taken out: the next longest is left
    assert store.take(1, [4, 5]) is None
    store.put(1, [4], y)
    store.put(1, [7], y)
    store.put(1, [8], y)  # over capacity: the least recently stored goes
    assert store.take(1, [4]) is None and store.take(1, [7]) is y and store.take(1, [8]) is y


def test_as_many_interleaved_loops_as_tails_all_restore_their_tails(
        tiny_models: TinyModels) -> None:
    """Two BLS loops taking turns with room for two tails: each call finds its loop's tail
    (a restored tail is taken out, so a loop holds one at a time)."""
    m = tiny_models
    cache = VerifyPrefixCache(m.target.new_cache(1, 1).plane("target"), 1 << 22,
                              block_size=BLOCK)
    cache.tails = TailStore(capacity=2)
    restored = _spy_restore(cache)
    dec = SpecDecoder(m.target)
    loops, lens = [[7, 8, 9, 10, 11], [3, 1, 4, 1, 5, 9]], []
    for _ in range(4):
        for i, ctx in enumerate(loops):
            lens.append(len(ctx))
            out = dec.verify([ctx], SamplingParams(max_tokens=3),
                             ExternalDraftProposer([[1, 2]]), prefix=cache)[0]
            loops[i] = ctx + out.token_ids
    assert restored[2:] == [n - 1 for n in lens[2:]]
