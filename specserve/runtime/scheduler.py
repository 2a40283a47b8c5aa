"""In-flight (iteration-level) batching for the reference decoder: sequences join and leave the
running batch between verify steps (Orca, Yu et al., OSDI'22, "iteration-level scheduling";
TensorRT-LLM's in-flight batcher, vLLM's continuous batching).

Each :meth:`Scheduler.step` runs in three parts, as vLLM v1's engine core does
(vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``: ``schedule()`` returns a
``SchedulerOutput``, ``GPUModelRunner.execute_model`` runs it, ``update_from_output`` applies the
``ModelRunnerOutput``; see :mod:`specserve.runtime.plan`):

1. :meth:`Scheduler.schedule` decides, and only decides: the rows that leave (finished last
   step, or cancelled), the running requests that take a speculative step, the waiting requests
   that join (while slots are free, one prefill forward's worth, shortest prompt first with a
   bound on how often one is passed over; a prompt longer than ``prefill_chunk`` is fed one
   chunk per step into a scratch row, after the step's newcomers, and joins with its last
   chunk: chunked prefill, Sarathi, Agrawal et al. 2024), and whether the speculative step
   runs: not while the next waiting prefill still fits in the running rows' wait of
   ``prefill_chunk`` prompt tokens since their last token (prefill first, as vLLM v0
   scheduled, within chunked prefill's bound; the queue is ordered again before every
   forward), as a frozen :class:`~specserve.runtime.plan.StepPlan`;
2. :class:`~specserve.runtime.runner.ModelRunner` executes it: the newcomers' prefill (first
   token sampled), then one step of :class:`~specserve.runtime.decoder.SpecDecoder` over the
   running rows and the newcomers (per-row draft lengths, per-row lengths in one verify
   forward);
3. :meth:`Scheduler.update` applies each phase's outcome to the requests: emitted tokens
   (streamed), stats, stops and finish; a finished request leaves (its row goes in the next
   plan's ``evict``) and gets its result. Newcomers join shortest prompt first, and each
   prefill forward's first tokens go out as it ends, before the step's speculative tokens.

Outputs are unchanged by batching: every row's verification depends only on its own tokens,
drafts and generator (the decoder's invariant), so a request's tokens equal its tokens run alone,
at any arrival pattern (tests/runtime/test_scheduler.py, test_scheduler_property.py). No Triton
here: the Triton model is a thin adapter that calls :meth:`submit` and runs :meth:`step` in its
worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from specserve.errors import SpecserveError
from specserve.runtime.batch import Batch
from specserve.runtime.decoder import SpecDecoder
from specserve.runtime.kv_pool import BLOCK_SIZE, KVEvent
from specserve.runtime.params import SamplingParams
from specserve.runtime.plan import (
    Chunk,
    Handle,
    Join,
    OnDone,
    OnTokens,
    StepOutput,
    StepPlan,
)
from specserve.runtime.prefix_blocks import cached_blocks, plan_stores, release_blocks
from specserve.runtime.runner import GROUP_TOKENS, ModelRunner

__all__ = ["Handle", "OnDone", "OnTokens", "Scheduler"]

# prompt tokens prefilled between two decode phases while no running row has decoded yet (the
# bound exists for rows waiting for their next token; rows that only hold their first token
# let a burst be prefilled first, shortest first, each forward's first tokens out as it ends).
# vLLM-CPU's API server takes 2,048 tokens a step (vllm/engine/arg_utils.py, CPU defaults). A
# cold burst of 16 held-out chat prompts: TTFT p50 2.02 s at 256, 1.42 s at 2,048
# (benchmarks/burst_ttft.py, 2026-12-07)
IDLE_PREFILL_TOKENS = 2048
# steps a waiting request may be passed over by later, shorter ones before it goes first
PASS_LIMIT = 8


class Scheduler:
    """Iteration-level batching of up to ``capacity`` sequences over one :class:`SpecDecoder`.

    ``max_len``: the longest prompt + max_tokens a request may have. Thread-safe :meth:`submit`
    and :meth:`cancel`; :meth:`step` (or :meth:`run_until_idle`) from one thread.
    ``intake``: called on that thread at the start of every :meth:`schedule` (and so may
    :meth:`submit` what arrived meanwhile; the Triton adapter moves its queue in there).
    ``prefix_cache_bytes`` > 0: a prefix cache of that budget (:mod:`specserve.runtime.
    kv_pool`, blocks of ``block_size`` tokens; ``on_event`` hears of blocks stored and
    removed): a newcomer whose prompt starts with cached full blocks gets them copied into its
    row and prefills only the rest; a row's prompt blocks are stored the step after its
    prefill, the blocks it generated when it leaves
    (:func:`~specserve.runtime.prefix_blocks.plan_stores`)."""

    def __init__(self, decoder: SpecDecoder, capacity: int, max_len: int,
                 prefill_chunk: int = 256, intake: Callable[[], None] | None = None,
                 prefix_cache_bytes: int = 0, block_size: int = BLOCK_SIZE,
                 on_event: Callable[[KVEvent], None] | None = None,
                 prefill_threads: int = 0) -> None:
        if capacity < 1:
            raise SpecserveError(f"in-flight batching: capacity must be >= 1, got {capacity}")
        self.runner = ModelRunner(decoder, capacity, max_len, prefix_cache_bytes, block_size,
                                  on_event, prefill_threads)
        self.kv = self.runner.kv
        self._prev: tuple[Handle, ...] = ()  # the runner's rows after the last plan
        self._gone: list[Handle] = []  # left since the last plan: their blocks to release
        self.decoder, self.capacity, self.max_len = decoder, capacity, max_len
        self.running: list[Handle] = []   # pool row i = running[i] (after the next evictions)
        self._waiting: deque[Handle] = deque()
        self._submitted = 0  # requests submitted so far (each Handle's arrival)
        self._lock = threading.Lock()
        self.prefill_chunk = max(1, prefill_chunk)
        self._long: Handle | None = None  # a prompt in chunked prefill (it holds a slot)
        self._stalled = 0  # prompt tokens prefilled since the running rows' last decode phase
        self._fed = 0                     # its tokens in the scratch row
        self._leaving: list[int] = []     # rows removed since the last plan, in order
        self._plan: StepPlan | None = None  # in flight (drain() answers its newcomers)
        self.intake = intake

    def submit(self, prompt: list[int], params: SamplingParams, on_tokens: OnTokens | None = None,
               on_done: OnDone | None = None, return_logits: bool = False) -> Handle:
        """Queue one request (checked now: a bad one raises here, never inside a step)."""
        self.decoder.check_prompt(prompt)
        params.validate()
        self.decoder.check_prediction(params, self.max_len)
        need = len(prompt) + params.max_tokens
        if need > self.max_len:
            raise SpecserveError(f"generate: prompt + max_tokens = {need} exceeds the engine's "
                                 f"{self.max_len}")
        h = Handle(list(prompt), params, on_tokens, on_done, return_logits)
        with self._lock:
            h.arrival, self._submitted = self._submitted, self._submitted + 1
            self._waiting.append(h)
        return h

    def cancel(self, h: Handle) -> None:
        """Stop ``h`` at the next step boundary (its slot is freed there); a waiting request
        never starts."""
        h.cancelled = True

    @property
    def waiting(self) -> int:
        """Requests submitted and not running yet (no free slot, or not admitted yet)."""
        with self._lock:
            return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing to run: no request running, waiting or in chunked prefill, and no leaver
        whose blocks are still to be stored and released (that step runs before a loop waits
        for the next request, not in that request's first step)."""
        with self._lock:
            return not (self.running or self._waiting or self._long is not None
                        or self._leaving or self._gone)

    def step(self) -> bool:
        """Schedule, run (the newcomers' prefill, then the speculative step), update after
        each phase; False when there was nothing to do."""
        plan = self.schedule()
        if plan.empty:
            return False
        self._plan = plan
        done = [0]

        def joined(out: StepOutput) -> None:  # each prefill forward's first tokens, at once
            i = done[0]
            self.update(replace(plan, join=plan.join[i:i + len(out.rows)]), out)
            done[0] += len(out.rows)

        self.runner.prefill(plan, joined)
        if plan.decodes:
            self.update(plan, self.runner.decode(plan))
        self._plan = None
        return True

    def schedule(self) -> StepPlan:
        """The next step's plan: rows that leave, requests that run, newcomers that join."""
        if self.intake is not None:
            self.intake()
        for i in range(len(self.running) - 1, -1, -1):  # cancelled since the last step
            h = self.running[i]
            if h.cancelled:
                self._remove(h)
                self._finish(h, h.state(), "cancelled")
        store = plan_stores(self.kv, self._prev, {id(h) for h in self._gone})
        for h in self._gone:  # after their last blocks are planned
            release_blocks(self.kv, h)
        self._gone = []
        evict, self._leaving = tuple(self._leaving), []
        n = len(self.running)
        if not n:  # no row waits on a decode phase
            self._stalled = 0
        limit = self._wait_limit()
        new, taken, nxt = self._take(limit)
        new.sort(key=self._uncached)  # shortest first: the step's forwards emit in this order
        joins = [Join(h, n + i, 0, tuple(h.blocks)) for i, h in enumerate(new)]
        chunk, last = self._next_chunk()
        if last is not None:
            joins.append(Join(last, n + len(joins), self._fed))
            self._long = None  # drain() finds it in the plan now
        now = time.monotonic_ns()  # one admission time per group: they share the prefill
        for j in joins:
            self._admit(j.handle, now)
        tokens = taken + (0 if chunk is None else chunk.stop - chunk.start)
        if last is not None:
            tokens += len(last.prompt) - self._fed
        decode = (*self.running, *(j.handle for j in joins))
        self._prev = decode
        if chunk is not None and self._long is not None:  # its next chunk (or its rest)
            piece = min(self.prefill_chunk, len(self._long.prompt) - self._fed)
            nxt = piece if nxt is None else min(nxt, piece)
        decodes = self._decodes(tokens, limit, nxt)
        self._stalled = 0 if decodes else self._stalled + tokens
        for h in decode if decodes else ():
            h.decoded = True
        return StepPlan(evict, decode, tuple(joins), chunk, limit, tokens,
                        tuple(store), decodes)

    def update(self, plan: StepPlan, out: StepOutput) -> None:
        """Apply one phase's outcome: each row's tokens (streamed), stats, stop and finish.
        Newcomers become running rows (after the running ones, in join order); one that
        finished at its first token passes the step's speculative outcome by."""
        if out.phase == "prefill":
            handles = [j.handle for j in plan.join]
            self.running += handles
        else:
            handles = list(plan.decode)
        for h, r in zip(handles, out.rows, strict=True):
            if h.result is not None:
                continue
            row = h.state()
            row.apply(r)
            if r.tokens and h.on_tokens is not None:
                h.on_tokens(list(r.tokens))
            if r.finish:
                self._remove(h)
                self._finish(h, row, r.finish)

    def drain(self) -> list[Handle]:
        """Take every running and waiting request out (after a failed step: the caller answers
        them); the pool is then empty."""
        with self._lock:
            found = self.running + list(self._waiting) + ([self._long] if self._long else [])
            self._waiting.clear()
            self._long = None
        if self._plan is not None:
            found += [j.handle for j in self._plan.join]
        self.running, self._leaving, self._plan = [], [], None
        self._prev, self._gone, self._stalled = (), [], 0
        for h in found:
            h.blocks, h.stored = [], 0
        self.runner.reset()  # whatever a failed step left in the pool, the proposer, the cache
        return list({id(h): h for h in found if h.result is None}.values())

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def _take(self, limit: int) -> tuple[list[Handle], int, int | None]:
        """Waiting requests that join now, shortest prompt first (:meth:`_order`), while slots
        are free, within the running rows' wait (``limit`` prompt tokens between two of their
        decode phases, :meth:`_wait_limit`; the first prompt of a wait always fits) and one
        prefill forward's worth (:data:`~specserve.runtime.runner.GROUP_TOKENS`; a longer
        prompt alone): the waiting requests are ordered again before the next forward, so one
        that arrives meanwhile can go ahead of longer ones. A long prompt (over ``limit``)
        starts its chunked prefill when none is in progress (it holds a slot); later ones pass
        it meanwhile. Also the prompt tokens taken and the fewest a waiting request left
        behind could prefill next (None: none can join, no slot or none waiting)."""
        cancelled: list[Handle] = []
        room = limit - self._stalled
        nxt: int | None = None
        with self._lock:
            out: list[Handle] = []
            started: Handle | None = None  # a long prompt whose chunked prefill starts now
            budget = min(room, GROUP_TOKENS)
            for h, size in self._order():
                free = self.capacity - len(self.running) - len(out) - (self._long is not None)
                if h.cancelled:
                    cancelled.append(h)
                elif free <= 0:
                    continue
                elif size > limit:  # chunked from its start (no cached prefix), its own budget
                    if self._long is None:
                        self._long, self._fed, started = h, 0, h
                        h.admitted_ns = time.monotonic_ns()  # its slot is held from now
                elif size > budget and (out or size > room):
                    nxt = size if nxt is None else min(nxt, size)
                else:
                    out.append(h)
                    budget -= size
                    cut = cached_blocks(self.kv, h)
                    if cut:
                        assert self.kv is not None
                        self.kv.acquire(cut)
                        h.blocks, h.stored = list(cut), len(cut)
            gone = {id(h) for h in (*out, *cancelled, self._long) if h is not None}
            keep = [h for h in self._waiting if id(h) not in gone]
            last = max((h.arrival for h in (*out, *([started] if started else []))),
                       default=-1)
            for h in keep:  # passed over by a later request (one that joined or started)
                h.passed += h.arrival < last
            self._waiting = deque(keep)
        if self.capacity - len(self.running) - len(out) - (self._long is not None) <= 0:
            nxt = None  # the step's newcomers take the last slots
        for h in cancelled:  # callbacks run without the lock held
            self._finish(h, Batch([h.prompt], [h.params], self.decoder.device), "cancelled")
        return out, sum(self._uncached(h) for h in out), nxt

    def _wait_limit(self) -> int:
        """Prompt tokens prefilled between two decode phases of the running rows:
        ``prefill_chunk``, or :data:`IDLE_PREFILL_TOKENS` while none of them has decoded yet
        (nothing generating waits: a burst is prefilled first, shortest first). A chunk can
        take a wait past it by up to one chunk (the chunk is never cut)."""
        if any(h.decoded for h in self.running):
            return self.prefill_chunk
        return max(self.prefill_chunk, IDLE_PREFILL_TOKENS)

    def _decodes(self, tokens: int, limit: int, nxt: int | None) -> bool:
        """Whether a step that prefills ``tokens`` goes on to decode: yes unless the next
        prefill (``nxt`` tokens: a waiting prompt that can join, or the long prompt's next
        chunk) still fits in the running rows' wait of ``limit``; then their tokens come after
        it (vLLM v0's prefill-first scheduling, bounded as chunked prefill bounds it)."""
        return not tokens or nxt is None or self._stalled + tokens + nxt > limit

    def _order(self) -> list[tuple[Handle, int]]:
        """The waiting requests and their uncached prompt tokens in the order they may join:
        shortest first (shortest job first: a burst's median first token comes after the
        short prompts' prefills, not after whichever long one arrived a millisecond ahead),
        except that one passed over by later requests in :data:`PASS_LIMIT` steps goes first,
        in arrival order (no prompt starves behind a stream of shorter ones). With no slot
        free nothing joins: arrival order, no prefix lookups (only cancellations are found)."""
        if self.capacity - len(self.running) - (self._long is not None) <= 0:
            return [(h, 0) for h in self._waiting]
        bs = 0 if self.kv is None else self.kv.block_size
        sized = [(h, len(h.prompt) - len(cached_blocks(self.kv, h, False)) * bs)
                 for h in self._waiting]
        return sorted(sized, key=lambda hs: (0, 0) if hs[0].passed >= PASS_LIMIT else (1, hs[1]))

    def _uncached(self, h: Handle) -> int:
        """Prompt tokens ``h``'s prefill runs (those after its cached blocks)."""
        return len(h.prompt) - len(h.blocks) * (0 if self.kv is None else self.kv.block_size)

    def _next_chunk(self) -> tuple[Chunk | None, Handle | None]:
        """The long prompt's next chunk, or (its rest fits one chunk) the prompt itself, to
        join with its last chunk."""
        h = self._long
        if h is None:
            return None, None
        if h.cancelled:
            self._long = None
            self._finish(h, Batch([h.prompt], [h.params], self.decoder.device), "cancelled")
            return None, None
        if len(h.prompt) - self._fed > self.prefill_chunk:
            c = Chunk(h, self._fed, self._fed + self.prefill_chunk)
            self._fed = c.stop
            return c, None
        return None, h

    def _admit(self, h: Handle, now: int) -> None:
        """A newcomer's request state (its first token is sampled by this step's prefill)."""
        prop = self.decoder.proposer
        h.admitted_ns = h.admitted_ns or now
        h.row = Batch([h.prompt], [h.params], self.decoder.device)
        h.row.keep_logits([h.return_logits])
        h.row.k = [0 if prop is None else prop.max_draft_len]

    def _remove(self, h: Handle) -> None:
        """``h`` leaves the running rows (the last one moves into its row); the runner does the
        same in the next plan's ``evict``."""
        i = next(i for i, x in enumerate(self.running) if x is h)
        last = len(self.running) - 1
        self.running[i] = self.running[last]
        self.running.pop()
        self._leaving.append(i)
        self._gone.append(h)

    def _finish(self, h: Handle, row: Batch, reason: str) -> None:
        vocab = self.decoder.target.cfg.vocab_size
        h.result = row.result(0, reason, vocab)
        if h.on_done is not None:
            h.on_done(h.result)
