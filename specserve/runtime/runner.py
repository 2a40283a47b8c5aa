"""The model runner of in-flight batching: it executes a :class:`~specserve.runtime.plan.StepPlan`
and says what happened, as vLLM v1's ``GPUModelRunner.execute_model`` does for the scheduler's
``SchedulerOutput`` (vllm-project/vllm ``vllm/v1/worker/gpu_model_runner.py``): the runner owns
the model-side state, the scheduler owns the requests (:mod:`specserve.runtime.plan`).

Model-side state: one KV pool with a row per sequence (the running ones are its first rows, so
a step's forward runs on a view of them), each row's KV length, a one-row scratch cache for
chunked prefill (Sarathi, Agrawal et al. 2024) and the proposer's per-row state, joined and left
through its :class:`~specserve.runtime.proposers.SlotProposer`. A plan runs in two phases:

1. :meth:`ModelRunner.prefill`: the plan's evictions (swap-remove: the last row moves into the
   hole, in the pool, the lengths and the proposer alike), a long prompt's chunk into the
   scratch row, and the newcomers' prefill into the rows after the running ones (one forward
   per group of equal ``fed``; a chunked prompt's earlier chunks are copied into its row
   first) with their first tokens sampled; each group's proposer state joins after it;
2. :meth:`ModelRunner.decode`: one speculative step of :class:`~specserve.runtime.decoder.
   SpecDecoder` over the running rows and the newcomers (a newcomer that finished at its first
   token rides along as a finished row: nothing is emitted for it).

Both return a :class:`~specserve.runtime.plan.StepOutput` and change no request: the decoder
runs on a batch detached from the requests' state (:meth:`Batch.detach`); the scheduler's
``update`` applies the outputs. Every row's verification depends only on its own tokens, drafts
and generator, so a request's tokens equal its tokens run alone at any arrival pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from specserve.errors import SpecserveError
from specserve.runtime.batch import Batch, RowOutput
from specserve.runtime.decoder import SpecDecoder
from specserve.runtime.kv_pool import BLOCK_SIZE, KVEvent, KVPool
from specserve.runtime.kvcache import KVCache
from specserve.runtime.plan import Chunk, Join, StepOutput, StepPlan, Store
from specserve.runtime.proposers import Restored, SlotProposer, StepOutcome
from specserve.runtime.proposers.base import NOTHING_RESTORED

# a prefill forward runs at most this many times the tokens of its rows (padding included)
PAD_LIMIT = 1.25
# a prefill forward of several prompts runs at most this many of their tokens: a step's first
# tokens go out forward by forward (prefill is compute-bound: splitting costs a weight read).
# A cold burst of 16 held-out chat prompts (2,197 tokens, the real model): TTFT p50 1.30 s at
# 512, 1.00 s at 128, 1.20 s at 64 and 32, the whole burst the same (benchmarks/burst_ttft.py)
GROUP_TOKENS = 128


class ModelRunner:
    """Executes step plans over ``capacity`` pool rows of up to ``max_len`` tokens each.
    ``prefix_cache_bytes`` > 0: a prefix cache (:class:`KVPool`) of that many bytes, blocks of
    ``block_size`` tokens, holding the target's K/V and the proposer's planes per position."""

    def __init__(self, decoder: SpecDecoder, capacity: int, max_len: int,
                 prefix_cache_bytes: int = 0, block_size: int = BLOCK_SIZE,
                 on_event: Callable[[KVEvent], None] | None = None,
                 prefill_threads: int = 0) -> None:
        prop = decoder.proposer
        self.prefill_threads = prefill_threads  # > 0: torch threads for phase 1's forwards
        self.slots: SlotProposer | None = None if prop is None else prop.slots()
        if prop is not None and self.slots is None:
            raise SpecserveError(f"in-flight batching: the {prop.name} proposer keeps per-call "
                                 "state and cannot join a running batch")
        self.decoder, self.capacity, self.max_len = decoder, capacity, max_len
        self.pool: KVCache = decoder.target.new_cache(capacity, max_len + decoder.lookahead())
        self.capture = () if prop is None else prop.aux_layers
        self._scratch: KVCache | None = None
        self.kv: KVPool | None = None
        self.reset()
        if prefix_cache_bytes > 0:
            planes = [self.pool.plane("target"),
                      *(() if self.slots is None else self.slots.planes())]
            self.kv = KVPool.from_budget(planes, prefix_cache_bytes, block_size,
                                         decoder.device, on_event)

    def reset(self) -> None:
        """An empty pool (start, or after a failed step): no row, no pending proposer state,
        an empty prefix cache (what a failed step was writing is not trusted)."""
        self.lengths: list[int] = []  # KV length of each pool row in use
        self._long_aux: list[torch.Tensor] = []  # a chunked prompt's captured layers (EAGLE-3)
        if self.slots is not None:
            self.slots.reserve(self.capacity, self.max_len)
        if self.kv is not None:
            self.kv.clear()

    @property
    def rows(self) -> int:
        """Pool rows in use."""
        return len(self.lengths)

    @torch.inference_mode()
    def prefill(self, plan: StepPlan,
                on_group: Callable[[StepOutput], None] | None = None) -> StepOutput:
        """Phase 1: stores into the prefix cache, evictions, the newcomers' prefill (rows in
        ``plan.join`` order; their cached prefixes restored first) and their proposer state,
        then the chunk; on ``prefill_threads`` torch threads when > 0 and there is a prefill
        (prompt forwards are compute-bound matmuls; a decode step's are not). ``on_group``
        hears each prefill forward's rows as soon as it ran (their first tokens need not wait
        for the step's other forwards)."""
        with intra_op_threads(self.prefill_threads if plan.join or plan.chunk else 0):
            return self._phase1(plan, on_group)

    def _phase1(self, plan: StepPlan,
                on_group: Callable[[StepOutput], None] | None = None) -> StepOutput:
        for s in plan.store:
            self._store(s)
        for row in plan.evict:
            self._evict(row)
        if len(plan.decode) - len(plan.join) != self.rows:
            raise SpecserveError(f"in-flight batching: the plan runs {len(plan.decode)} rows "
                                 f"with {len(plan.join)} newcomers, the pool holds {self.rows}")
        out: list[RowOutput] = []
        bs = 0 if self.kv is None else self.kv.block_size
        for group in _groups(plan.join, bs):
            rows = self._prefill(group)
            out += rows
            if on_group is not None:
                on_group(StepOutput("prefill", tuple(rows)))
        if plan.chunk is not None:  # after the newcomers: their first tokens do not wait on it
            self._chunk(plan.chunk)
        return StepOutput("prefill", tuple(out))

    @torch.inference_mode()
    def decode(self, plan: StepPlan) -> StepOutput:
        """Phase 2: one speculative step of rows ``0..len(plan.decode)-1``."""
        rows: tuple[RowOutput, ...] = ()
        n = len(plan.decode)
        if n:
            st = Batch.detach([h.state() for h in plan.decode], self.decoder.proposer)
            cache = self.pool.view(0, n)
            cache.lengths = self.lengths[:n]  # advanced in place by the step
            self.decoder.step(st, cache)
            self.lengths[:n] = cache.lengths
            rows = tuple(st.outputs())
        return StepOutput("decode", rows)

    def _store(self, s: Store) -> None:
        """Full blocks of row ``s.row`` into the prefix cache's blocks."""
        assert self.kv is not None
        bs = self.kv.block_size
        pos = torch.cat([torch.arange(i * bs, (i + 1) * bs) for i, _ in s.blocks])  # [N]
        if int(pos.max()) >= self.lengths[s.row]:
            raise RuntimeError(f"prefix cache: row {s.row} holds {self.lengths[s.row]} "
                               f"positions, asked to store up to {int(pos.max()) + 1}")
        pos = pos.to(self.pool.k[0].device)
        data = [self.pool.export(s.row, pos),
                *(() if self.slots is None else self.slots.export(s.row, pos))]
        self.kv.write([b for _, b in s.blocks], data)

    def _restore(self, row: int, j: Join) -> Restored:
        """Join ``j``'s cached prefix blocks into pool row ``row``; the proposer's planes."""
        if not j.blocks:
            return NOTHING_RESTORED
        assert self.kv is not None
        data = self.kv.read(j.blocks)
        self.pool.restore(row, data[0])
        return Restored(data[0].shape[0], tuple(data[1:]))

    def _evict(self, row: int) -> None:
        last = self.rows - 1
        if row != last:
            self.pool.move_row(last, row, self.lengths[last])
            self.lengths[row] = self.lengths[last]
        self.lengths.pop()
        if self.slots is not None:
            self.slots.evict(row)

    def _chunk(self, c: Chunk) -> None:
        """``prompt[start:stop]`` into the scratch row (its captured layers kept)."""
        if self._scratch is None:
            self._scratch = self.decoder.target.new_cache(1, self.pool.max_len)
        view = self._scratch.view(0, 1)
        view.lengths = [c.start]
        piece = torch.tensor([c.handle.prompt[c.start:c.stop]], device=self.decoder.device)
        aux = self.decoder.target.run(piece, view, capture=self.capture).aux
        self._long_aux = ([] if c.start == 0 else self._long_aux) + (
            [aux] if aux is not None else [])

    def _prefill(self, group: list[Join]) -> list[RowOutput]:
        """Prefill one group (consecutive rows, one ``fed``) and sample its first tokens."""
        start, fed, m = group[0].row, group[0].fed, len(group)
        if fed:  # a chunked prompt: its earlier chunks into its row first
            assert self._scratch is not None and m == 1
            for dst, src in zip((*self.pool.k, *self.pool.v),
                                (*self._scratch.k, *self._scratch.v), strict=True):
                dst[start, :, :fed] = src[0, :, :fed]
        restored = [self._restore(start + i, j) for i, j in enumerate(group)]
        skip = [fed or r.length for r in restored]
        st = Batch.detach([j.handle.state() for j in group], self.decoder.proposer)
        view = self.pool.view(start, start + m)
        fwd = self.decoder.prefill(st, view, fed=skip)
        self.lengths += view.lengths
        aux = fwd.aux
        if aux is not None and fed:  # its earlier chunks' captured layers first
            aux = torch.cat([*self._long_aux, aux], dim=1)
        if self.slots is not None:
            last = [max(x - k - 1, 0) for x, k in zip(view.lengths, skip, strict=True)]
            self.slots.admit([j.handle.prompt for j in group],
                             StepOutcome(fwd.hidden, last, [0] * m, st.seqs, aux=aux), restored)
        return st.outputs()


def _groups(joins: tuple[Join, ...], block_size: int = 0) -> list[list[Join]]:
    """Consecutive joins with the same ``fed`` (one prefill forward each), split where one
    more row would pad the forward past :data:`PAD_LIMIT` times the tokens it runs (rows are
    right-padded to the longest: a 500-token prompt among 70-token ones ran 16 x 500 tokens
    for 16 x 180) or take it past :data:`GROUP_TOKENS`. ``block_size``: the prefix cache's (a
    join's cached blocks are not run)."""
    out: list[list[Join]] = []
    sizes: list[int] = []
    for j in joins:
        n = len(j.handle.prompt) - j.skip(block_size)
        if (out and out[-1][0].fed == j.fed == 0 and sum(sizes) + n <= GROUP_TOKENS
                and max(*sizes, n) * (len(sizes) + 1) <= PAD_LIMIT * (sum(sizes) + n)):
            out[-1].append(j)
            sizes.append(n)
        else:
            out.append([j])
            sizes = [n]
    return out


@contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` torch intra-op threads (0: as they are), then restore them."""
    old = torch.get_num_threads()
    if n <= 0 or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
