"""EAGLE-3 proposals (Li et al. 2025, "EAGLE-3"; the head: :mod:`specserve.runtime.eagle3`):
a chain of K drafts, or a static tree (EAGLE-2's candidate tree with fixed shape, Li et al.
2024; ``eagle_choices`` as in TensorRT-LLM's EagleDecodingConfig).

The head reads the target's residual stream at a few layers from the verify forward the
decoder runs anyway (``aux_layers``, captured by ``Transformer.run``; :class:`StepOutcome`
``aux``), kept as they come and fused by the head's FC only when needed (a proposal, an
export, or enough of them): a step that does not draft costs the head nothing but a slice.
Each proposal first catches up: the kept positions' fused target states paired with their
next tokens go through the head in one forward (its KV cache holds one entry per target
position); the output at the last position gives draft 1, and each further draft feeds the
head its own output with the previous draft's embedding, as vLLM's EAGLE proposer does.
Drafts are argmax at T = 0 and sampled from q (the head's distribution mapped to the target
vocabulary, zero outside the draft vocabulary) otherwise, so rejection sampling stays
lossless.

A static tree (greedy rows only; a batch with a sampled row gets the chain, as Medusa does)
grows level by level (:func:`specserve.spec.tree.tree_levels`): the top-k of the head's output
at the root fills depth 1; each depth's nodes that have children then go through the head in
one forward (each node's input feature is its parent's output, all at the same position, each
attending to the verified cache, its ancestors' slots and itself), and their top-k fill the
next depth. The decoder verifies the tree in one target forward and keeps the longest accepted
path, whose target states :meth:`Eagle3Proposer.update` takes in path order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.runtime.eagle3 import Eagle3Head
from specserve.runtime.kv_pool import Plane
from specserve.runtime.kvcache import KVCache
from specserve.runtime.model import Transformer
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers.base import (
    ChainProposal,
    ChainProposer,
    ProposalRequest,
    Restored,
    StepOutcome,
    TreeProposal,
    pad_drafts,
    sample_rows,
)
from specserve.runtime.timing import step_clock
from specserve.spec.tree import MedusaTree, TreeBuffers, TreeLevel, build_tree_buffers, tree_levels


class Eagle3Proposer(ChainProposer):
    """An EAGLE-3 head over the target's captured layers; records q for rejection sampling.
    ``choices``: a static tree (its depth is the chain length at T > 0), else a chain of
    ``max_draft_len``."""

    name = "eagle3"

    def __init__(self, head: Eagle3Head, max_draft_len: int = 4,
                 choices: Sequence[Sequence[int]] | None = None) -> None:
        self.tree = None if choices is None else MedusaTree.from_choices(choices)
        super().__init__(max_draft_len if self.tree is None else self.tree.depth)
        self.head = head
        self.aux_layers = head.cfg.aux_layer_ids  # the target layers the head reads
        self._plans: dict[int, tuple[TreeBuffers, list[TreeLevel], int]] = {}
        self.cache: KVCache | None = None
        self.pool: KVCache  # in-flight batching only (reserve)
        # per row: fused target features [n, H] of positions cache.lengths[b].. not fed yet,
        # then the target states [n, n_aux * Ht] of the positions after them, not fused yet
        self.feats: list[torch.Tensor | None] = []
        self.raw: list[list[torch.Tensor]] = []
        self.n_raw: list[int] = []  # per row: positions in raw
        # in-flight batching: per row, every fused feature so far, in position order (chunks
        # of [n, H]; what a prefix cache stores for the row)
        self.hist: list[list[torch.Tensor]] = []

    def bind(self, target: Transformer) -> None:
        """Share the target's embedding (the decoder captures :attr:`aux_layers` itself)."""
        self.head.to(device=target.device, dtype=target.dtype).decode_layout()
        self.head.bind(target.embed.weight)

    @property
    def lookahead(self) -> int:
        return self.max_draft_len if self.tree is None else self.tree.num_nodes

    def _need(self, max_len: int) -> int:
        """The head cache's length: a catch-up pads every row to the longest backlog (a
        newcomer's whole prompt, or the steps drafted with k = 0), written past each row's own
        length, so a row near ``max_len`` needs room for up to ``max_len`` more."""
        return 2 * max_len + self.lookahead + 2

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        b = len(prompts)
        if self.cache is None or self.cache.batch != b or self.cache.max_len < self._need(max_len):
            self.cache = self.head.new_cache(b, self._need(max_len))
        self.cache.lengths = [0] * b
        self.feats, self.raw, self.hist = [None] * b, [[] for _ in range(b)], []
        self.n_raw = [0] * b

    def reserve(self, capacity: int, max_len: int) -> None:
        self.pool = self.head.new_cache(capacity, self._need(max_len))
        self.cache = self.pool.view(0, 0)
        self.feats, self.raw, self.hist, self.n_raw = [], [], [], []

    def admit(self, prompts: list[list[int]], outcome: StepOutcome,
              restored: Sequence[Restored]) -> None:
        """Newcomers as the last rows; ``outcome.aux`` covers their prompts after the
        positions restored from the prefix cache, whose fused features come with them (the
        head is fed every position from 0 at its first proposal, as without a cache)."""
        assert self.cache is not None and outcome.aux is not None
        n, m, lens = self.cache.batch, len(prompts), list(self.cache.lengths)
        self.cache = self.pool.view(0, n + m)
        self.cache.lengths = lens + [0] * m
        for i, (p, r) in enumerate(zip(prompts, restored, strict=True)):
            f = r.planes[0].to(self.head.dtype) if r.length else None
            self.feats.append(f)
            self.raw.append([outcome.aux[i, :len(p) - r.length]])  # [n, n_aux * Ht]
            self.n_raw.append(len(p) - r.length)
            self.hist.append([] if f is None else [f])

    def planes(self) -> tuple[Plane, ...]:
        """The fused target features per position (the head's input)."""
        return (Plane("eagle3", (self.head.cfg.hidden_size,), self.head.dtype),)

    def export(self, row: int, positions: torch.Tensor) -> list[torch.Tensor]:
        self._fuse_pending()
        return [torch.cat(self.hist[row])[positions]]

    def evict(self, row: int) -> None:
        assert self.cache is not None
        lens, last = list(self.cache.lengths), self.cache.batch - 1
        if row != last:
            self.pool.move_row(last, row, lens[last])
            lens[row], self.feats[row] = lens[last], self.feats[last]
            self.raw[row], self.n_raw[row] = self.raw[last], self.n_raw[last]
            if self.hist:
                self.hist[row] = self.hist[last]
        self.feats.pop()
        self.raw.pop()
        self.n_raw.pop()
        if self.hist:
            self.hist.pop()
        self.cache = self.pool.view(0, last)
        self.cache.lengths = lens[:last]

    # pending target states (all rows) fused at once past this many: their memory stays
    # bounded through a long run of steps without drafts, the FC's weight read once for all
    FUSE_ROWS = 512

    def update(self, outcome: StepOutcome) -> None:
        """Keep the target states of the positions the head has not seen: the kept tokens of
        this forward (a chain: indices 0..last along T; a tree: the kept path's nodes), the
        i-th of n at position ``len(seq) - 1 - n + i``; fused later (:meth:`_fuse_pending`)."""
        assert self.cache is not None and outcome.aux is not None
        for b, seq in enumerate(outcome.seqs):
            n = outcome.last[b] + 1 if outcome.paths is None else len(outcome.paths[b])
            have = self.cache.lengths[b] + self._pending(b)
            lo = have - (len(seq) - 1 - n)  # kept tokens the head already has
            if lo < 0:
                raise RuntimeError(f"eagle3: row {b} lacks target states for positions "
                                   f"{have}..{len(seq) - 2 - n}")
            self.raw[b].append(outcome.aux[b, lo:n] if outcome.paths is None
                               else outcome.aux[b, outcome.paths[b][lo:]])  # [n - lo, ..]
            self.n_raw[b] += n - lo
        if sum(self.n_raw) > self.FUSE_ROWS:
            self._fuse_pending()

    def _pending(self, b: int) -> int:
        """Row b's positions kept and not fed to the head yet (fused or not)."""
        f = self.feats[b]
        return (0 if f is None else f.shape[0]) + self.n_raw[b]

    def backlog(self) -> int:
        """Positions the next proposal feeds the head beyond one step's kept tokens per row
        (:attr:`catch_up_s`)."""
        return sum(max(self._pending(b) - self.lookahead - 1, 0) for b in range(len(self.raw)))

    def pending_features(self, b: int) -> torch.Tensor:
        """Row b's fused features [n, H] the head is fed next (pending states fused now)."""
        self._fuse_pending()
        f = self.feats[b]
        return f if f is not None else torch.empty(
            0, self.head.cfg.hidden_size, dtype=self.head.dtype, device=self.head.device)

    def _fuse_pending(self) -> None:
        """Every row's kept target states through the head's FC in one call (its weight read
        once, not once a row or a step), onto the row's fused features."""
        rows = [torch.cat(r) if len(r) > 1 else r[0] for r in self.raw if r]
        if not rows:
            return
        fused = iter(self.head.fuse(torch.cat(rows)).split([len(x) for x in rows]))
        for b, r in enumerate(self.raw):
            if not r:
                continue
            new, buf = next(fused), self.feats[b]  # [n, H]
            self.feats[b] = new if buf is None else torch.cat([buf, new])
            if self.hist:  # in flight: the row's history too
                self.hist[b].append(new)
            self.raw[b], self.n_raw[b] = [], 0

    def _catch_up(self, seqs: list[list[int]]) -> torch.Tensor:
        """Feed every row's pending (feature, next token) pairs; the head's output at each
        row's last position [B, H]. One forward pads every row to the longest backlog, so a
        row far behind the rest (a newcomer's whole prompt beside rows one step behind) is
        first fed alone down to :meth:`_joint_cap` pending positions: at c = 8 a 300-token
        prompt padded 8 rows to 300 head positions for 307 real ones. Its seconds go to
        :attr:`catch_up_s` where some row is further behind than one step's kept tokens."""
        assert self.cache is not None
        clock = step_clock(self.head.device)
        t0, stale = clock(), self.backlog() > 0
        self._fuse_pending()
        counts = [0 if f is None else f.shape[0] for f in self.feats]
        cap = self._joint_cap(counts)
        for b, n in enumerate(counts):
            if n > cap:
                self._feed_row(b, seqs[b], n - cap)
        out = self._feed_all(seqs)
        self.catch_up_s = clock() - t0 if stale else 0.0
        return out

    @staticmethod
    def _joint_cap(counts: list[int]) -> int:
        """The backlog the joint forward pads to: twice the median's (at least 4)."""
        return max(4, 2 * sorted(counts)[len(counts) // 2])

    def _feed_row(self, b: int, seq: list[int], n: int) -> None:
        """Row ``b``'s first ``n`` pending pairs through the head in a forward of its own."""
        assert self.cache is not None
        f = self.feats[b]
        assert f is not None
        lens = list(self.cache.lengths)
        one = self.cache.view(b, b + 1)
        one.lengths = [lens[b]]
        toks = torch.tensor([seq[lens[b] + 1:lens[b] + 1 + n]], device=self.head.device)
        self.head(toks, f[None, :n], one)  # [1, n, H]: only its cache writes are kept
        lens[b] += n
        self.cache.lengths = lens
        self.feats[b] = f[n:]

    def _feed_all(self, seqs: list[list[int]]) -> torch.Tensor:
        """Every row's pending pairs in one forward, right-padded to the longest."""
        assert self.cache is not None
        dev, h = self.head.device, self.head.cfg.hidden_size
        lens = list(self.cache.lengths)
        counts = [0 if f is None else f.shape[0] for f in self.feats]
        t = max(max(counts), 1)
        feats = torch.zeros(len(seqs), t, h, dtype=self.head.dtype, device=dev)
        rows = []
        for b, (seq, f, n) in enumerate(zip(seqs, self.feats, counts, strict=True)):
            if f is not None and n:
                feats[b, :n] = f
            rows.append(seq[lens[b] + 1:lens[b] + 1 + n])
        out = self.head(pad_drafts(rows, t, dev), feats, self.cache)  # [B, T, H]
        self.cache.lengths = [x + n for x, n in zip(lens, counts, strict=True)]
        self.feats = [None] * len(seqs)
        last = torch.tensor([max(n - 1, 0) for n in counts], device=dev)
        picked: torch.Tensor = out[torch.arange(len(seqs), device=dev), last]  # [B, H]
        return picked

    def get_proposal(self, request: ProposalRequest) -> ChainProposal | TreeProposal | None:
        """The tree when one is set, every row is greedy and none caps its drafts
        (``chain_only``), else the chain."""
        if request.tree_budget == 0:
            return None  # a load-aware schedule turned speculation off at this batch size
        if self.tree is None or request.chain_only or \
                any(p.temperature > 0 for p in request.params):
            return super().get_proposal(request)
        buf, levels, topk = self._plan(request.tree_budget)
        return TreeProposal(self.tree_tokens(request.seqs, levels, topk), buf)

    def _plan(self, budget: int | None) -> tuple[TreeBuffers, list[TreeLevel], int]:
        """The tree's first ``budget`` nodes (a prefix of the (depth, path) order is a tree)
        as verify buffers, expansion levels and top-k; cached per budget."""
        assert self.tree is not None
        n = self.tree.num_nodes if budget is None else min(budget, self.tree.num_nodes)
        if n not in self._plans:
            sub = MedusaTree.from_choices(self.tree.choices[:n])
            b = build_tree_buffers(sub)
            dev = self.head.device
            b = type(b)(*(getattr(b, f).to(dev) for f in b.__dataclass_fields__))
            self._plans[n] = (b, [lv.to(dev) for lv in tree_levels(sub)], sub.max_topk())
        return self._plans[n]

    def tree_tokens(self, seqs: list[list[int]], levels: list[TreeLevel],
                    topk: int) -> torch.Tensor:
        """Every row's candidate tree [B, N+1] (node 0: the pending token), level by level."""
        assert self.cache is not None
        dev, nodes = self.head.device, sum(lv.children.numel() for lv in levels)
        ids = self.head.target_ids()  # [Vd]
        tokens = torch.zeros(len(seqs), nodes + 1, dtype=torch.long, device=dev)
        tokens[:, 0] = torch.tensor([s[-1] for s in seqs], device=dev)
        out = self._catch_up(seqs)[:, None]  # [B, 1, H]: the root's output
        for d, lv in enumerate(levels):
            if d:  # feed this depth's inner nodes: token, parent's output, one position
                feats = out[:, lv.feed_parent]  # [B, n, H]
                step = self.head.level_inputs(self.cache, d - 1, lv.first_slot, lv.visible)
                out = self.head(tokens[:, lv.nodes], feats, self.cache, step=step)
            top = self.head.draft_logits(out).topk(topk, dim=-1).indices  # [B, n, k]
            tokens[:, lv.children] = ids[top[:, lv.parent_slot, lv.ranks]]
        return tokens

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        assert self.cache is not None
        k = max(limits)
        sampled = [i for i, p in enumerate(params) if p.temperature > 0 and limits[i] > 0]
        feat = self._catch_up(seqs)  # [B, H]
        base = list(self.cache.lengths)
        ids = self.head.target_ids()  # [Vd]
        tokens, probs = [], []
        for i in range(k):
            draft = self.head.draft_logits(feat)  # [B, Vd]
            tok = ids[draft.argmax(dim=-1)]  # [B] target ids (argmax: greedy rows)
            if sampled:  # q over the target vocabulary: 0 outside the draft vocabulary
                probs.append(sample_rows(self.head.to_target(draft), tok, sampled, limits, i,
                                         params, generators))
            tokens.append(tok)
            if i < k - 1:  # the head's own output and this draft give the next one
                out = self.head(tok[:, None], feat[:, None], self.cache)  # [B, 1, H]
                self.cache.lengths = [x + 1 for x in self.cache.lengths]
                feat = out[:, 0]
        self.cache.lengths = base  # draft entries are overwritten by the next catch-up
        drafts = torch.stack(tokens, dim=1)  # [B, k]
        q_all = torch.stack(probs, dim=1) if sampled else None  # [B, k, V]
        return ChainProposal(drafts, list(limits), q_all)

    def rollback(self, seq_lens: list[int]) -> None:
        """Unused: :meth:`update` keeps the head's state (its cache holds verified positions
        only)."""
