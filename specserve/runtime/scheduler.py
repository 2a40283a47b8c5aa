"""In-flight (iteration-level) batching for the reference decoder: sequences join and leave the
running batch between verify steps (Orca, Yu et al., OSDI'22, "iteration-level scheduling";
TensorRT-LLM's in-flight batcher, vLLM's continuous batching).

A :class:`Scheduler` owns a KV cache pool with one slot per sequence; the running sequences are
always its first rows (a finished or cancelled sequence leaves at once and the last row moves
into its slot), so a step's forward runs on a view of those rows. Each :meth:`Scheduler.step`:

1. admits waiting requests while slots are free: one prefill forward over just the newcomers
   (their first token is sampled there), and their proposer state joins
   (:class:`~specserve.runtime.proposers.SlotProposer`); a request that arrives while a step
   runs does not wait for it: the target calls :meth:`Scheduler._preempt` before each layer
   of the step's forward, which prefills newcomers there, in the free rows after the running
   ones (their first token goes out at once; they join the batch when the step ends), so TTFT
   under load is about a prefill, not a step plus a prefill; a prompt longer than
   ``prefill_chunk`` is fed one chunk per step (chunked prefill as in Sarathi, Agrawal et al.
   2024) into a scratch row and moved into its slot for its last chunk, so no step waits for
   more than one chunk of anyone's prefill (the draft model's own prefill is not chunked);
2. runs one speculative step of :class:`~specserve.runtime.decoder.SpecDecoder` over every
   running sequence (per-row draft lengths, per-row lengths in one verify forward);
3. evicts what finished or was cancelled and hands back its result.

Outputs are unchanged by batching: every row's verification depends only on its own tokens,
drafts and generator (the decoder's invariant), so a request's tokens equal its tokens run alone,
at any arrival pattern (tests/runtime/test_scheduler.py). No Triton here: the Triton model is a
thin adapter that calls :meth:`submit` and runs :meth:`step` in its worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.errors import SpecserveError
from specserve.runtime.batch import Batch, GenerationResult
from specserve.runtime.decoder import SpecDecoder
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers import StepOutcome

OnTokens = Callable[[list[int]], None]
OnDone = Callable[[GenerationResult], None]


@dataclass
class Handle:
    """One submitted request: its prompt and callbacks; ``cancelled`` is set by
    :meth:`Scheduler.cancel`; ``result`` once it has finished."""

    prompt: list[int]
    params: SamplingParams
    on_tokens: OnTokens | None = None
    on_done: OnDone | None = None
    return_logits: bool = False
    cancelled: bool = False
    admitted_ns: int = 0   # time.monotonic_ns() when it got a slot (its prefill ran)
    result: GenerationResult | None = None
    row: Batch | None = field(default=None, repr=False)


@dataclass
class _Joining:
    """Newcomers prefilled into the rows after the running ones, not in the batch yet."""

    handles: list[Handle]
    lengths: list[int]      # their cache lengths after the prefill
    fed: int                # prompt tokens that were in the cache before it (chunked)
    hidden: Any             # the prefill's hidden states [m, P, H] (for the proposer)
    seqs: list[list[int]]   # prompt + first token, per newcomer
    aux: Any = None         # the target's captured layers over the whole prompts (EAGLE-3)


class Scheduler:
    """Iteration-level batching of up to ``capacity`` sequences over one :class:`SpecDecoder`.

    ``max_len``: the longest prompt + max_tokens a request may have. Thread-safe :meth:`submit`
    and :meth:`cancel`; :meth:`step` (or :meth:`run_until_idle`) from one thread.
    ``intake``: called on that thread at every preemption point of a step (and so may
    :meth:`submit` what arrived meanwhile; the Triton adapter moves its queue in there)."""

    def __init__(self, decoder: SpecDecoder, capacity: int, max_len: int,
                 prefill_chunk: int = 256, intake: Callable[[], None] | None = None) -> None:
        prop = decoder.proposer
        if prop is not None and not getattr(prop, "inflight", False):
            raise SpecserveError(f"in-flight batching: the {prop.name} proposer keeps per-call "
                                 "state and cannot join a running batch")
        if capacity < 1:
            raise SpecserveError(f"in-flight batching: capacity must be >= 1, got {capacity}")
        self.decoder, self.capacity, self.max_len = decoder, capacity, max_len
        self.look = SpecDecoder._lookahead(prop)
        self.pool: KVCache = decoder.target.new_cache(capacity, max_len + self.look)
        if prop is not None:
            prop.reserve(capacity, max_len)  # type: ignore[attr-defined]
        self.running: list[Handle] = []
        self.lengths: list[int] = []
        self._waiting: deque[Handle] = deque()
        self._lock = threading.Lock()
        # a prompt longer than prefill_chunk is fed chunk by chunk, one chunk per step, into a
        # one-row scratch cache, then moved into its slot: it never stalls the batch longer
        self.prefill_chunk = max(1, prefill_chunk)
        self._scratch: KVCache | None = None
        self._long: Handle | None = None
        self._fed = 0
        self._long_aux: list[torch.Tensor] = []  # its chunks' captured layers (EAGLE-3)
        self._admitting: list[Handle] = []  # between _take and running (a failed prefill)
        self._joining: list[_Joining] = []  # prefilled inside the step in flight
        self._budget = self.prefill_chunk   # prompt tokens this step may still prefill
        self._inside = False                # in a preemption's own prefill
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
        with self._lock:
            return not self.running and not self._waiting and self._long is None

    def step(self) -> bool:
        """Evict the cancelled, admit, one step, evict; False when there was nothing to do."""
        with torch.inference_mode():
            self._budget = self.prefill_chunk
            self._evict()  # cancelled since the last step: their slots go to newcomers now
            self._admit()
            chunked = self._chunk()
            if not self.running:
                return chunked
            self._step()  # newcomers may be prefilled inside it (_preempt)
            for group in self._joining:
                self._attach(group)
            self._joining = []
            self._evict()
        return True

    def drain(self) -> list[Handle]:
        """Take every running and waiting request out (after a failed step: the caller answers
        them); the pool is then empty."""
        with self._lock:
            found = self.running + self._admitting + list(self._waiting) + (
                [self._long] if self._long else [])
            self._waiting.clear()
            self._long = None
        prop = self.decoder.proposer
        if prop is not None:  # whatever a failed step left in it: start over, empty
            prop.reserve(self.capacity, self.max_len)  # type: ignore[attr-defined]
        self.running, self.lengths, self._admitting, self._joining = [], [], [], []
        return list({id(h): h for h in found}.values())

    def run_until_idle(self) -> None:
        while self.step():
            pass

    def _take(self, inside: bool = False) -> list[Handle]:
        """Waiting requests that get a slot now, in order, up to ``prefill_chunk`` prompt tokens
        in all per step (a burst of newcomers is prefilled over several steps, the batch running
        between them; between steps the first one always goes, inside a step only what fits);
        a long prompt starts its chunked prefill between steps when none is in progress (it
        holds a slot), later ones pass it meanwhile."""
        cancelled: list[Handle] = []
        with self._lock:
            out: list[Handle] = []
            keep: deque[Handle] = deque()
            budget = self._budget
            busy = len(self.running) + sum(len(g.handles) for g in self._joining)
            while self._waiting:
                h = self._waiting.popleft()
                free = self.capacity - busy - len(out) - (self._long is not None)
                if h.cancelled:
                    cancelled.append(h)
                elif free <= 0 or ((out or inside) and len(h.prompt) > budget):
                    keep.append(h)
                elif len(h.prompt) > self.prefill_chunk:
                    if self._long is None and not inside:
                        self._long, self._fed = h, 0
                        h.admitted_ns = time.monotonic_ns()  # its slot is held from now
                    else:
                        keep.append(h)
                else:
                    out.append(h)
                    budget -= len(h.prompt)
            self._waiting = keep
            self._budget = budget
            self._admitting += out
        for h in cancelled:  # callbacks run without the lock held
            self._finish(h, Batch([h.prompt], [h.params], self.decoder.device), "cancelled")
        return out

    def _admit(self) -> None:
        new = self._take()
        if new:
            self._join(new, 0)

    def _join(self, new: list[Handle], fed: int) -> None:
        """Prefill ``new`` and make them running rows now (between steps)."""
        self._attach(self._prefill(new, fed))
        self._evict()  # done at the first token (max_tokens 1, a stop token)

    def _prefill(self, new: list[Handle], fed: int) -> _Joining:
        """Prefill ``new`` (after their first ``fed`` prompt tokens, already in their slots)
        into the rows after the running and joining ones and sample their first tokens."""
        dev, prop = self.decoder.device, self.decoder.proposer
        now = time.monotonic_ns()
        for h in new:
            h.admitted_ns = h.admitted_ns or now
            h.row = Batch([h.prompt], [h.params], dev)
            h.row.keep_logits([h.return_logits])
            h.row.k = [0 if prop is None else prop.max_draft_len]
        parts = [h.row for h in new if h.row is not None]
        st = Batch.merge(parts, prop)
        n = len(self.running) + sum(len(g.handles) for g in self._joining)
        view = self.pool.view(n, n + len(new))
        hidden = self.decoder._prefill(st, view, self._deliver(new), fed=fed)
        st.write_back(parts)
        aux = self.decoder._aux()  # read now: a later forward overwrites it
        if aux is not None and fed:  # a chunked prompt: its earlier chunks' states first
            aux = torch.cat([*self._long_aux, aux], dim=1)
        return _Joining(new, view.lengths, fed, hidden, st.seqs, aux)

    def _attach(self, g: _Joining) -> None:
        """Prefilled newcomers become running rows; their proposer state joins."""
        prop = self.decoder.proposer
        if prop is not None:
            prop.admit([h.prompt for h in g.handles],  # type: ignore[attr-defined]
                       StepOutcome(g.hidden, [max(x - g.fed - 1, 0) for x in g.lengths],
                                   [0] * len(g.handles), g.seqs, aux=g.aux))
        self.running += g.handles
        self.lengths += g.lengths
        ids = {id(h) for h in g.handles}
        self._admitting = [h for h in self._admitting if id(h) not in ids]

    def _preempt(self) -> None:
        """Called by the target before each layer of a step's forward: requests that arrived
        since the step began and fit in the free rows and this step's prefill budget are
        prefilled now (first token out at once) and join when the step ends; the running rows
        are not touched (their rows, lengths and proposer state are the step's)."""
        if self._inside:
            return  # the prefill below runs the target too
        self._inside = True
        try:
            if self.intake is not None:
                self.intake()
            if self._waiting:
                new = self._take(inside=True)
                if new:
                    self._joining.append(self._prefill(new, 0))
        finally:
            self._inside = False

    def _chunk(self) -> bool:
        """One chunk of the long prompt in progress; its last chunk goes through the regular
        prefill in its slot (the earlier ones are copied there first). False: none."""
        h = self._long
        if h is None:
            return False
        if h.cancelled:
            self._long = None
            self._finish(h, Batch([h.prompt], [h.params], self.decoder.device), "cancelled")
            return True
        if self._scratch is None:
            self._scratch = self.decoder.target.new_cache(1, self.pool.max_len)
        if len(h.prompt) - self._fed > self.prefill_chunk:
            view = self._scratch.view(0, 1)
            view.lengths = [self._fed]
            piece = h.prompt[self._fed:self._fed + self.prefill_chunk]
            self.decoder.target(torch.tensor([piece], device=self.decoder.device), view)
            aux = self.decoder._aux()
            self._long_aux = ([] if self._fed == 0 else self._long_aux) + (
                [aux] if aux is not None else [])
            self._fed += len(piece)
            return True
        n, fed = len(self.running), self._fed
        for dst, src in zip((*self.pool.k, *self.pool.v), (*self._scratch.k, *self._scratch.v),
                            strict=True):
            dst[n, :, :fed] = src[0, :, :fed]
        self._admitting = [h]
        self._join([h], fed)
        self._long = None  # only now: a failed join leaves it for drain()
        return True

    def _step(self) -> None:
        parts = [h.row for h in self.running if h.row is not None]
        st = Batch.merge(parts, self.decoder.proposer)
        cache = self.pool.view(0, len(parts))
        cache.lengths = self.lengths  # advanced in place by the step
        models = self._models()
        for m in models:  # newcomers are prefilled inside this step's forwards (_preempt)
            m.preempt = self._preempt
        try:
            self.decoder._step(st, cache, self._deliver(list(self.running)))
        finally:
            for m in models:
                m.preempt = None
        st.write_back(parts)

    def _models(self) -> list[Transformer]:
        """The transformers a step runs: the target's and a draft model's forwards are where
        a newcomer can be prefilled."""
        found = [self.decoder.target, getattr(self.decoder.proposer, "model", None)]
        return list({id(m): m for m in found if isinstance(m, Transformer)}.values())

    def _deliver(self, handles: list[Handle]) -> Callable[[int, list[int]], None]:
        def on_step(b: int, new: list[int]) -> None:
            cb = handles[b].on_tokens
            if cb is not None and new:
                cb(new)
        return on_step

    def _evict(self) -> None:
        prop = self.decoder.proposer
        for i in range(len(self.running) - 1, -1, -1):  # descending: swap-remove stays valid
            h = self.running[i]
            assert h.row is not None
            if not (h.row.done[0] or h.cancelled):
                continue
            last = len(self.running) - 1
            if i != last:
                self.pool.move_row(last, i, self.lengths[last])
                self.running[i], self.lengths[i] = self.running[last], self.lengths[last]
            self.running.pop()
            self.lengths.pop()
            if prop is not None:
                prop.evict(i)  # type: ignore[attr-defined]
            self._finish(h, h.row, h.row.finish[0] if h.row.done[0] else "cancelled")

    def _finish(self, h: Handle, row: Batch, reason: str) -> None:
        vocab = self.decoder.target.cfg.vocab_size
        h.result = row.result(0, reason, vocab)
        if h.on_done is not None:
            h.on_done(h.result)
