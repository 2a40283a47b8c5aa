"""One speculative step, executed (steps 2-4 of :mod:`specserve.runtime.decoder`'s loop): the
target's verify forward over a proposal, the verification the proposal's kind asks for, and the
bookkeeping of what was kept; and the prefill before the first step (:func:`prefill_step`: the
prompts' forward, each row's first token sampled from it, or in a verify call nothing sampled).

- chain (:func:`chain_step`): ``[pending, drafts]`` under the causal mask; greedy equality at
  temperature 0, Leviathan et al. 2023 / Chen et al. 2023 rejection sampling otherwise (Medusa's
  lossy typical acceptance only where the proposal asks for it), each sampled row with its own
  drafts and generator so that its output does not depend on the rest of the batch;
- tree (:func:`tree_step`): the candidate tree's nodes under the tree mask at depth positions
  (Cai et al. 2024, Medusa), the longest accepted root-to-leaf path, gathered into place in the
  cache.

Then, per row: the kept tokens' K/V (the cache length advanced), stop conditions (``min_tokens``
bans stop ids at early positions), structured output (each verified position masked by the
row's grammar; the matcher rolled back past the rejected drafts), logits kept when asked, stats
and the stream. The proposer is rolled back with a :class:`StepOutcome`. The decoder plans a
step (draft limits, the schedule's budget, Predicted Outputs); this module runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specserve.runtime.batch import Batch
from specserve.runtime.grammar import GuidedStep
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Forward, Transformer
from specserve.runtime.proposers import ChainProposal, StepOutcome, TreeProposal
from specserve.spec.grammar import mask_logits
from specserve.spec.sampling import logits_to_probs, sample
from specserve.spec.tree import tree_greedy_verify
from specserve.spec.verify import greedy_verify, rejection_sample, typical_acceptance

__all__ = ["OnStep", "ban_stops", "capture", "chain_step", "deliver", "kmax", "pick",
           "prefill_step", "tree_step"]

OnStep = Callable[[int, list[int]], None]


def capture(st: Batch) -> tuple[int, ...]:
    """The target layers the call's proposer reads (EAGLE-3), () for none."""
    return () if st.prop is None else st.prop.aux_layers


def pick(st: Batch, logits: torch.Tensor) -> list[int]:
    """One token per row from logits [B, V]: argmax, or sampled with the row's params."""
    tok = [int(t) for t in logits.argmax(dim=-1).tolist()]  # [B]
    for b in st.active():
        if st.params[b].temperature > 0:
            tok[b] = pick_row(st, b, logits[b:b + 1])[0]
    return tok


def pick_row(st: Batch, b: int, logits: torch.Tensor) -> list[int]:
    """Sample row b's token from logits [1, V] with its params and generator."""
    p = st.params[b]
    probs = logits_to_probs(logits, p.temperature, p.top_k, p.top_p)  # [1, V]
    return [int(sample(probs, st.gens[b])[0])]


def ban_stops(st: Batch, logits: torch.Tensor, depth: list[int]) -> None:
    """Forbid stop tokens at positions that would come before ``min_tokens`` (in place)."""
    for b in st.active():
        p, done = st.params[b], len(st.out[b])
        if p.min_tokens > done and st.stop[b]:
            ids = list(st.stop[b])
            for j, d in enumerate(depth):
                if done + d < p.min_tokens:
                    logits[b, j, ids] = float("-inf")


def deliver(st: Batch, b: int, new: list[int], on_step: OnStep | None) -> None:
    """Stream row b's new tokens (none: no call)."""
    if new and on_step is not None:
        on_step(b, new)


def prefill_step(target: Transformer, st: Batch, cache: KVCache, on_step: OnStep | None,
                 sample: bool = True, fed: int | Sequence[int] = 0) -> Forward:
    """Run the prompts (right-padded) and sample each sequence's first token; the prompts'
    hidden states [B, P, H]. ``sample`` False (the decoder's ``verify``): run all but each prompt's
    last token (which stays pending) and sample nothing; no forward when that is nothing
    (hidden states [B, 1, H] of zeros then). ``fed``: the first tokens of every prompt are
    in the cache already (a chunked prefill's earlier chunks, or a prefix restored from the
    prefix cache; per row when a list): only the rest is run, and hidden states are those
    of the rest. The captured layers (EAGLE-3) come with them."""
    dev, n = target.device, len(st.seqs)
    feds = [fed] * n if isinstance(fed, int) else list(fed)
    end = 0 if sample else 1
    rows = [s[f:len(s) - end] for s, f in zip(st.seqs, feds, strict=True)]
    lens = [len(s) for s in rows]
    layers = capture(st)
    if max(lens) == 0:
        cache.lengths = [f + x for f, x in zip(feds, lens, strict=True)]
        h = target.cfg.hidden_size
        zeros = torch.zeros(n, 1, h, dtype=target.dtype, device=dev)
        return Forward(zeros, zeros.repeat(1, 1, len(layers)) if layers else None)
    cache.lengths = feds
    tokens = torch.tensor([s + [0] * (max(lens) - len(s)) for s in rows], device=dev)
    fwd = target.run(tokens, cache, capture=layers)
    hidden = fwd.hidden  # [B, P, H]
    cache.lengths = [f + x for f, x in zip(feds, lens, strict=True)]
    if not sample:
        return fwd
    last = hidden[torch.arange(n, device=dev), torch.tensor(lens, device=dev) - 1]  # [B, H]
    logits = target.logits(last)[:, None]  # [B, 1, V]
    ban_stops(st, logits, [0])
    allowed = GuidedStep.first(st.guides, st.active(), logits.shape[-1], dev)
    if allowed is not None:  # structured output: the grammar's tokens only
        logits = mask_logits(logits, allowed)  # [B, 1, V]
    first = pick(st, logits[:, 0])
    for b in range(n):
        new = st.emit(b, [first[b]])
        st.record(b, logits[b], new)
        guide = st.guides[b]
        if guide is not None and new:
            guide.accept(new[0])
        deliver(st, b, new, on_step)
    return fwd


def chain_step(target: Transformer, st: Batch, cache: KVCache, prop: ChainProposal | None,
               limits: list[int], on_step: OnStep | None, adaptive: bool = False) -> None:
    """Steps 2-4 for a chain of drafts (none, or K = 0: a plain decoding step); ``limits``: row
    b verifies at most ``limits[b]`` of its drafts. ``adaptive``: grow row b's ``st.k`` by 2
    after a step that accepted all its drafts, shrink it by 1 (at least 1) after a rejection."""
    act, dev, n = st.active(), target.device, len(st.seqs)
    counts, k = [0] * n, 0
    if prop is not None:
        counts = [min(c, lim) for c, lim in zip(prop.counts, limits, strict=True)]
    # structured output: cut each guided row's drafts where they leave its grammar
    guided = GuidedStep.plan(st.guides, None if prop is None else prop.tokens, counts, act,
                             target.cfg.vocab_size, dev)
    if prop is not None:
        k = max(counts)
    pending = torch.tensor([[s[-1]] for s in st.seqs], device=dev)  # [B, 1]
    drafts = pending[:, :0] if prop is None else prop.tokens[:, :k].to(dev)  # [B, k]
    tokens = torch.cat([pending, drafts], dim=1) if k else pending  # [B, k+1]
    fwd = target.run(tokens, cache, capture=capture(st))  # 2. verify forward
    hidden = fwd.hidden  # [B, k+1, H]
    logits = target.logits(hidden)  # [B, k+1, V]
    ban_stops(st, logits, list(range(k + 1)))
    if guided is not None:  # the constrained target at every verified position
        logits = mask_logits(logits, guided.allowed)  # [B, k+1, V]
    if k == 0:  # 3. verify (or just sample)
        emitted = [[t] for t in pick(st, logits[:, 0])]
    else:
        assert prop is not None
        q = prop.probs[:, :k] if prop.probs is not None else None
        if guided is not None and q is not None:
            q = guided.mask_q(q)  # [B, k, V] the cut drafts' q over the grammar's tokens
        emitted = verify_chain(st, drafts, q, logits, counts, prop.acceptance == "typical")
    last = [0] * n
    for b in act:  # 4. keep, stop, stats, stream
        toks = emitted[b][:counts[b] + 1]
        cache.lengths[b] += len(toks)
        last[b] = len(toks) - 1
        new = st.emit(b, toks)
        st.record(b, logits[b], new)  # token j was chosen from the logits at position j
        guide = st.guides[b]
        if guide is not None:  # roll back the rejected drafts, take the last token
            guide.settle(counts[b], len(toks) - 1, toks[-1])
        st.stats[b].observe(counts[b], len(toks) - 1, num_emitted=len(new))
        foreign = range(counts[b]) if b in st.predicted else st.forced_at.get(b, ())
        st.stats[b].observe_foreign(foreign, counts[b], len(toks) - 1)  # not the proposer's
        if b in st.predicted:
            st.pred[b][0] += min(len(toks) - 1, len(new))
        st.count_forced(b, min(len(toks) - 1, len(new)))
        deliver(st, b, new, on_step)
        if adaptive and counts[b]:
            grow = len(toks) - 1 == counts[b]
            st.k[b] = min(st.k[b] + 2, kmax(st)) if grow else max(st.k[b] - 1, 1)
    if st.prop is not None:
        st.prop.update(StepOutcome(hidden, last, last, st.seqs, aux=fwd.aux))


def kmax(st: Batch) -> int:
    """The call's proposer's longest chain (0 without one)."""
    return 0 if st.prop is None else st.prop.max_draft_len


def verify_chain(st: Batch, drafts: torch.Tensor, q: torch.Tensor | None,
                 logits: torch.Tensor, counts: list[int], typical: bool) -> list[list[int]]:
    """Emitted tokens per row. drafts [B, K], q [B, K, V] | None, logits [B, K+1, V];
    row b has ``counts[b]`` real drafts. Greedy rows are verified together (padding drafts
    are cut afterwards); a sampled row uses only its own drafts and generator, so its output
    does not depend on the rest of the batch. ``typical``: Medusa's LOSSY typical acceptance
    instead of rejection sampling for sampled rows."""
    out: list[list[int]] = [[] for _ in st.seqs]
    act = st.active()
    greedy = [b for b in act if st.params[b].temperature == 0]
    if greedy:
        if len(greedy) == len(st.seqs):  # every row greedy: no copy of the logits
            res = greedy_verify(drafts, logits)
        else:
            idx = torch.tensor(greedy, device=drafts.device)
            res = greedy_verify(drafts[idx], logits[idx])
        toks, nums = res.tokens.tolist(), res.num_emitted.tolist()
        for i, b in enumerate(greedy):
            out[b] = toks[i][:nums[i]]
    for b in act:
        p, c = st.params[b], counts[b]
        if p.temperature == 0:
            continue
        if c == 0:  # exactly the plain sampling path
            out[b] = pick_row(st, b, logits[b:b + 1, 0])
            continue
        probs = logits_to_probs(logits[b:b + 1, :c + 1], p.temperature, p.top_k, p.top_p)
        d = drafts[b:b + 1, :c]  # [1, c]
        if typical:
            r = typical_acceptance(d, probs, st.gens[b])
        else:
            r = rejection_sample(d, None if q is None else q[b:b + 1, :c], probs, st.gens[b])
        out[b] = r.emitted(0)
    return out


def tree_step(target: Transformer, st: Batch, cache: KVCache, prop: TreeProposal,
               on_step: OnStep | None) -> None:
    """Steps 2-4 for a candidate tree (greedy; longest accepted root-to-leaf path)."""
    n, buf, tree_tokens = len(st.seqs), prop.buffers, prop.tokens  # [B, N+1]
    fwd = target.run(tree_tokens, cache, None, buf.position_ids, buf.attn_mask,
                          capture=capture(st))
    hidden = fwd.hidden  # [B, N+1, H]
    logits = target.logits(hidden)  # [B, N+1, V]
    depths = buf.position_ids.tolist()
    ban_stops(st, logits, depths)
    allowed = GuidedStep.tree(st.guides, tree_tokens, buf.parents.tolist(), st.active(),
                              logits.shape[-1], target.device)
    if allowed is not None:  # structured output: each node's grammar set [B, N+1, V]
        logits = mask_logits(logits, allowed)
    res = tree_greedy_verify(tree_tokens, logits, buf)
    toks, nums, paths = res.tokens.tolist(), res.num_emitted.tolist(), \
        res.accepted_nodes.tolist()
    heads, ranks = buf.head_index.tolist(), buf.topk_rank.tolist()
    nodes, depth = len(depths) - 1, max(depths)
    last, accepted, kept = [0] * n, [0] * n, [[0] for _ in range(n)]
    for b in st.active():
        keep = min(nums[b], st.params[b].max_tokens - len(st.out[b]))  # not past max_tokens
        path = kept[b] = paths[b][:keep]
        last[b], accepted[b] = path[-1], len(path) - 1
        cache.keep_nodes(b, path)
        cache.lengths[b] += len(path)
        new = st.emit(b, toks[b][:keep])
        st.record(b, logits[b, path[:len(new)]], new)  # token i: node path[i]'s logits
        guide = st.guides[b]
        if guide is not None:  # the kept path and its bonus token
            for t in new:
                guide.accept(t)
        st.stats[b].observe(nodes, len(path) - 1, num_emitted=len(new),
                            positions_drafted=depth,
                            nodes=[(heads[j], ranks[j]) for j in path[1:]])
        deliver(st, b, new, on_step)
    assert st.prop is not None
    st.prop.update(StepOutcome(hidden, last, accepted, st.seqs, kept, aux=fwd.aux))
