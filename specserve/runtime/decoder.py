"""The reference speculative decoder: propose, verify in one target forward, keep the accepted
path (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023; Medusa tree attention, Cai et al. 2024).

The loop composes; it does not compute: proposers live in :mod:`specserve.runtime.proposers`,
the model in :mod:`specserve.runtime.model`, one step's execution (steps 2-4 below) and the
prefill in :mod:`specserve.runtime.step`, and all acceptance math in :mod:`specserve.spec`
(``greedy_verify``, ``rejection_sample``, ``typical_acceptance``, ``tree_greedy_verify``). The
decoder knows proposers only through the :class:`~specserve.runtime.proposers.Proposer` protocol;
the verification is picked by the kind of proposal (chain or tree), never by the proposer's class.

Invariant per sequence: ``seqs[b] = prompt + generated``; its last token (the "pending" token,
sampled from the target but not yet fed) is not in the target cache, so
``cache.lengths[b] == len(seqs[b]) - 1``. One step, for every unfinished sequence:

1. ask the proposer for K drafts after the pending token (or a tree rooted at it);
2. run the target once over ``[pending, drafts]`` (chain, causal mask) or the tree nodes (tree
   mask, depth positions);
3. verify: greedy at temperature 0, lossless rejection sampling otherwise; emitted = accepted
   drafts + one recovered/bonus token;
4. keep the accepted K/V (advance the length; gather the accepted tree path into place), roll
   the proposer back (``update``), apply stop conditions, record stats, stream new tokens.

The first generated token comes from the prefill forward and is not counted as a verify step.
:meth:`SpecDecoder.verify` is the exception: one verify step of drafts given after a full context
(TensorRT-LLM's ``draft_input_ids``): the prefill feeds ``context[:-1]`` and samples nothing, the
context's last token is the pending one, so the first step's target distribution at position 0
is the one that follows the context.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch

from specserve.errors import SpecserveError
from specserve.runtime.batch import Batch, GenerationResult
from specserve.runtime.draft_policy import DraftLenPolicy
from specserve.runtime.forced_drafts import ForcedDrafts, RowChain
from specserve.runtime.grammar import DraftGuide
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Forward, Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers import (
    ChainProposal,
    Proposal,
    ProposalRequest,
    Proposer,
    StepOutcome,
    TreeProposal,
)
from specserve.runtime.proposers.prediction import (
    MAX_PREDICTION_DRAFT,
    overlay,
    prediction_drafts,
)
from specserve.runtime.step import (
    OnStep,
    chain_step,
    kmax,
    prefill_step,
    tree_step,
)
from specserve.runtime.timing import step_clock
from specserve.spec.schedule import DraftSchedule

__all__ = ["GenerationResult", "SamplingParams", "SpecDecoder"]


def _backlog(p: Proposer | None) -> int:
    """Positions ``p``'s next proposal must catch up on first."""
    return 0 if p is None else p.backlog()



class PrefixSource(Protocol):
    """A prefix cache for one call's rows (:mod:`specserve.runtime.verify_cache`)."""

    def restore(self, seqs: list[list[int]], cache: KVCache) -> list[int]:
        """Write each row's cached prefix into ``cache``; the positions written per row."""

    def keep(self, seqs: list[list[int]], cache: KVCache) -> None:
        """After the call: store what the rows' K/V holds."""


class SpecDecoder:
    """Speculative decoding with a target :class:`Transformer` and an optional proposer
    (None = plain decoding, the baseline)."""

    def __init__(self, target: Transformer, proposer: Proposer | None = None,
                 adaptive_draft_len: bool = False, schedule: DraftSchedule | None = None,
                 draft_policy: DraftLenPolicy | None = None,
                 forced: ForcedDrafts | None = None) -> None:
        """``adaptive_draft_len``: per sequence, draft up to 2 more tokens after a step that
        accepted everything and 1 fewer (at least 1) after a rejection, within the proposer's
        ``max_draft_len`` (the schedule of HF's assisted generation; chain proposers only).
        ``schedule``: load-aware speculation, the draft budget (chain K, or Medusa tree nodes;
        0 = none) from the number of sequences in each step (:mod:`specserve.spec.schedule`).
        ``draft_policy``: the draft length per step (0 included) from measured acceptance and
        step cost (:mod:`specserve.runtime.draft_policy`; chain proposers), within the
        schedule's budget and each request's cap. ``forced``: structured output's
        grammar-forced tokens as drafts, merged with the proposer's
        (:mod:`specserve.runtime.forced_drafts`). Lossless either way; all off by default so
        that K is what was asked for."""
        self.target = target
        self.proposer = proposer
        self.adaptive_draft_len = adaptive_draft_len
        self.schedule = schedule
        self.draft_policy = draft_policy
        self.forced = forced
        self.device = target.device
        self._cache: KVCache | None = None
        self._lock = threading.Lock()  # one generate() at a time: the KV cache is reused
        if proposer is not None:
            proposer.bind(target)

    @property
    def spec_mode(self) -> str:
        return self.proposer.name if self.proposer is not None else "none"

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | Sequence[SamplingParams],
                 on_step: OnStep | None = None, *,
                 return_logits: bool | Sequence[bool] = False) -> list[GenerationResult]:
        """Generate for a batch of token-id prompts; ``on_step(seq_index, new_token_ids)`` is
        called whenever a sequence emits tokens (first token included). ``return_logits`` (all
        rows, or per row): fill ``GenerationResult.logits``; off, nothing is kept."""
        plist = self._check(prompts, params)
        with self._lock:
            return self._generate(prompts, plist, on_step, self.proposer, False,
                                  self._want(return_logits, len(prompts)))

    def verify(self, contexts: list[list[int]],
               params: SamplingParams | Sequence[SamplingParams],
               proposer: Proposer | None = None, on_step: OnStep | None = None, *,
               return_logits: bool | Sequence[bool] = False,
               prefix: PrefixSource | None = None) -> list[GenerationResult]:
        """ONE verify step after each full context, with ``proposer`` (default: the decoder's
        own; bound here) proposing after the context's last token, e.g.
        :class:`~specserve.runtime.proposers.ExternalDraftProposer` (TensorRT-LLM's
        ``draft_input_ids``). Two target forwards: ``context[:-1]`` (prefill, nothing sampled;
        skipped when every context has one token) and ``[context[-1], drafts]`` (the chain or
        tree step: greedy at T=0, rejection sampling otherwise). Each row emits its accepted
        drafts + 1 (at most ``max_tokens``; fewer at a stop token) and ends ("verified").
        ``prefix``: a prefix cache (:mod:`specserve.runtime.verify_cache`) that restores the
        contexts' cached full blocks before the prefill and keeps their blocks after."""
        plist = self._check(contexts, params)
        prop = self.proposer if proposer is None else proposer
        with self._lock:
            if prop is not None and prop is not self.proposer:
                prop.bind(self.target)
            return self._generate(contexts, plist, on_step, prop, True,
                                  self._want(return_logits, len(contexts)), prefix)

    @staticmethod
    def _want(flag: bool | Sequence[bool], n: int) -> list[bool]:
        want = [flag] * n if isinstance(flag, bool) else [bool(x) for x in flag]
        if len(want) != n:
            raise SpecserveError(f"generate: {len(want)} return_logits flags for {n} prompts")
        return want

    def _generate(self, prompts: list[list[int]], plist: list[SamplingParams],
                  on_step: OnStep | None, prop: Proposer | None, verify: bool,
                  want_logits: list[bool],
                  prefix: PrefixSource | None = None) -> list[GenerationResult]:
        st = Batch(prompts, plist, self.device)
        st.prop, st.one_step = prop, verify
        st.keep_logits(want_logits)
        look = self._lookahead(prop)
        # the longest any row can grow (not max prompt + max budget: rows valid alone stay valid)
        max_len = max(len(q) + p.max_tokens for q, p in zip(prompts, plist, strict=True)) + look
        cache = self._get_cache(len(prompts), max_len, look)
        with torch.inference_mode():
            fed = [0] * len(prompts) if prefix is None else prefix.restore(st.seqs, cache)
            fwd = self._prefill(st, cache, on_step, sample=not verify, fed=fed)
            if prop is not None:
                prop.start([list(p) for p in prompts], max_len)
                n = len(prompts)
                last = [max(x - f - 1, 0) for x, f in zip(cache.lengths, fed, strict=True)]
                prop.update(StepOutcome(fwd.hidden, last, [0] * n, st.seqs, aux=fwd.aux))
            while not all(st.done):
                self._step(st, cache, on_step)
                if verify:  # one step only
                    for b in st.active():
                        st.done[b], st.finish[b] = True, "verified"
            if prefix is not None:
                prefix.keep(st.seqs, cache)
        vocab = self.target.cfg.vocab_size
        return [st.result(b, st.finish[b], vocab) for b in range(len(prompts))]

    def _check(self, prompts: list[list[int]],
               params: SamplingParams | Sequence[SamplingParams]) -> list[SamplingParams]:
        if not prompts:
            raise SpecserveError("generate: every prompt needs at least one token")
        for prompt in prompts:
            self.check_prompt(prompt)
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise SpecserveError(f"generate: {len(plist)} params for {len(prompts)} prompts")
        for p in plist:
            p.validate()
            self.check_prediction(p, self.target.cfg.max_position_embeddings)
        return plist

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """Raise SpecserveError unless ``prompt`` is non-empty and inside the vocabulary."""
        if len(prompt) == 0:
            raise SpecserveError("generate: every prompt needs at least one token")
        vocab = self.target.cfg.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise SpecserveError(f"generate: token id {bad} outside the vocab ({vocab})")

    def check_prediction(self, params: SamplingParams, context: int) -> None:
        """Raise SpecserveError unless ``params.prediction`` fits ``context`` tokens and the
        vocabulary."""
        pred, vocab = params.prediction, self.target.cfg.vocab_size
        if len(pred) > context:
            raise SpecserveError(f"prediction has {len(pred)} tokens, more than the context "
                                 f"length {context}")
        bad = next((t for t in pred if not 0 <= t < vocab), None)
        if bad is not None:
            raise SpecserveError(f"prediction: token id {bad} outside the vocab ({vocab})")

    def lookahead(self) -> int:
        """Cache rows a verify forward of this decoder's proposer may add past a sequence."""
        return self._lookahead(self.proposer)

    def prefill(self, st: Batch, cache: KVCache, fed: int | Sequence[int] = 0) -> Forward:
        """In-flight batching (:mod:`specserve.runtime.runner`): prefill ``st``'s prompts
        (after their first ``fed`` tokens, in ``cache`` already: one count for all rows, or
        one per row) and sample their first tokens into ``st``; the hidden states and
        captured layers of the tokens run (row b's from index 0, right-padded)."""
        return self._prefill(st, cache, None, fed=fed)

    def step(self, st: Batch, cache: KVCache) -> None:
        """In-flight batching: one speculative step of every row of ``st`` (steps 1-4)."""
        self._step(st, cache, None)

    @staticmethod
    def _lookahead(prop: Proposer | None) -> int:
        """Cache rows a verify forward may add past a sequence: the proposer's most, or a
        prediction's (:data:`MAX_PREDICTION_DRAFT`), + 2."""
        return max(0 if prop is None else prop.lookahead, MAX_PREDICTION_DRAFT) + 2

    def _get_cache(self, batch: int, max_len: int, lookahead: int) -> KVCache:
        if max_len > self.target.cfg.max_position_embeddings + lookahead:
            raise SpecserveError(
                f"generate: prompt + max_tokens = {max_len} exceeds the model's "
                f"max_position_embeddings ({self.target.cfg.max_position_embeddings})")
        c = self._cache
        if c is None or c.batch != batch or c.max_len < max_len:
            c = self._cache = self.target.new_cache(batch, max_len)
        c.lengths = [0] * batch
        return c

    def _prefill(self, st: Batch, cache: KVCache, on_step: OnStep | None,
                 sample: bool = True, fed: int | Sequence[int] = 0) -> Forward:
        """The prefill forward and first tokens (:func:`~specserve.runtime.step.prefill_step`)."""
        return prefill_step(self.target, st, cache, on_step, sample, fed)

    def _step(self, st: Batch, cache: KVCache, on_step: OnStep | None) -> None:
        """1. propose, then verify as the proposal's kind asks (no proposal: plain decoding)."""
        p, n = st.prop, len(st.seqs)
        if not st.k:
            st.k = [0 if p is None else p.max_draft_len] * n
        budget = None if self.schedule is None else self.schedule.at(len(st.active()))
        cap = budget if budget is not None else max(st.k, default=0)
        k_max = kmax(st)
        limits = [0 if st.done[b] else min(st.k[b], cap, st.params[b].draft_cap(k_max),
                                           st.params[b].max_tokens - len(st.out[b]) - 1)
                  for b in range(n)]  # no drafts beyond max_tokens (nor the schedule's budget,
        # nor the request's num_draft_tokens); a row capped below the longest chain asks a
        # tree proposer for its chain (a tree cannot be cut per row)
        predicting = [b for b in st.active() if st.params[b].prediction]
        chain_only = bool(predicting) or any(st.params[b].draft_cap(k_max) < k_max
                                             for b in st.active())
        guide = DraftGuide(st.guides, st.active()) if any(st.guides) else None
        policy = self._policy_for(p, st, limits)
        if policy is not None:
            limits = policy.plan(st, limits, _backlog(p))
        limits, ready = self._cover(p, st, limits)
        clock = step_clock(self.device)
        t0 = clock()
        prop = None if p is None else p.get_proposal(
            ProposalRequest(st.seqs, limits, st.params, st.gens, budget, chain_only, guide))
        t1 = clock()
        drafted = max(prop.counts, default=0) if isinstance(prop, ChainProposal) else 0
        if policy is not None and isinstance(prop, ChainProposal):
            limits = policy.trim(st, prop.counts, limits)
        st.predicted = set()
        if predicting:
            prop, limits = self._predict(st, prop, limits, predicting)
        if self.forced is not None and any(st.guides) and not isinstance(prop, TreeProposal):
            prop, limits = self.forced.merge(st, prop, limits, self.device, ready)
        if isinstance(prop, TreeProposal):
            tree_step(self.target, st, cache, prop, on_step)
            return
        before = DraftLenPolicy.snapshot(st) if policy is not None else []
        chain_step(self.target, st, cache, prop, limits, on_step, self.adaptive_draft_len)
        if policy is not None:
            chains = [] if prop is None else [min(c, lim) for c, lim in
                                              zip(prop.counts, limits, strict=True)]
            catch_up = p.catch_up_s if p is not None and drafted else 0.0
            policy.observe(st, before, len(st.seqs), max(chains, default=0), drafted, t1 - t0,
                           clock() - t1, catch_up, chains)

    def _cover(self, p: Proposer | None, st: Batch,
               limits: list[int]) -> tuple[list[int], dict[int, RowChain]]:
        """Grammar-forced drafts: rows whose grammar chain fills their limit get no proposer
        drafts (limit 0; :meth:`ForcedDrafts.cover`), and those chains. Chain proposers only,
        not in :meth:`verify` (the caller's drafts)."""
        if (self.forced is None or p is None or not any(st.guides) or st.one_step
                or p.lookahead != p.max_draft_len):
            return limits, {}
        return self.forced.cover(st, limits)

    def prepare_policy(self, capacity: int) -> None:
        """Measure the draft-length policy's step-cost curve now, as far as the widest verify
        forward of ``capacity`` rows reaches (capacity x (K + 1) rows). Measured on first use
        instead, inside served steps, its forwards cost 9-10% of output tok/s at c = 8 on the
        real model (n-gram and EAGLE-3 engines against their own baseline, 2026-12-07)."""
        p = self.proposer
        if self.draft_policy is None or p is None or p.lookahead != p.max_draft_len:
            return
        self.draft_policy.ensure_cost(self.target, capacity * (p.max_draft_len + 1))

    def _policy_for(self, p: Proposer | None, st: Batch,
                    limits: list[int]) -> DraftLenPolicy | None:
        """The draft-length policy for this step: chain proposers only (a tree's budget is
        the schedule's; not in :meth:`verify`, whose drafts the caller chose), its step-cost
        curve measured as far as this step's forward reaches."""
        if (self.draft_policy is None or p is None or p.lookahead != p.max_draft_len
                or st.one_step):
            return None
        self.draft_policy.ensure_cost(self.target, len(st.seqs) * (max(limits, default=0) + 1))
        return self.draft_policy

    def _predict(self, st: Batch, prop: Proposal | None, limits: list[int],
                 rows: list[int]) -> tuple[ChainProposal | None, list[int]]:
        """Predicted Outputs: rows whose prediction matches their output draft from it
        (:mod:`specserve.runtime.proposers.prediction`); the others keep the engine's chain."""
        assert not isinstance(prop, TreeProposal), "chain_only: a chain or nothing"
        found: dict[int, list[int]] = {}
        for b in rows:
            p = st.params[b]
            lim = min(p.draft_cap(MAX_PREDICTION_DRAFT), p.max_tokens - len(st.out[b]) - 1)
            drafts = prediction_drafts(st.out[b], p.prediction, lim)
            if drafts:
                found[b] = drafts
        if not found:
            return prop, limits
        st.predicted = set(found)
        new = [len(found[b]) if b in found else lim for b, lim in enumerate(limits)]
        k_base = max(limits) if prop is not None else 0
        return overlay(prop, found, len(st.seqs), k_base, self.device), new

