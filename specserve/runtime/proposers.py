"""Draft proposers behind one small interface (as transformers' ``CandidateGenerator``).

- :class:`DraftModelProposer`: a smaller causal LM with its own static KV cache proposes K tokens
  autoregressively and records their distributions q (Leviathan et al. 2023; Chen et al. 2023);
  optionally it ends a chain early at a draft it is unsure of (``min_confidence``, as HF's
  ``assistant_confidence_threshold``).
- :class:`NgramProposer`: prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"): find a
  recent earlier occurrence of the last n tokens (n = 3..1) and propose what followed; q is
  one-hot.
- :class:`OracleProposer`: proposes a known continuation (for benchmarks that isolate the
  machinery from acceptance).
- :class:`MedusaProposer`: Medusa heads and a candidate tree (Cai et al. 2024); the decoder calls
  it with the target's last hidden states (tree verify at T=0, top-1 chain at T>0).

A chain proposer sees each sequence as ``prompt + generated`` whose last token is not yet in the
target's cache; it returns up to K drafts that follow it. After verification the decoder calls
:meth:`ChainProposer.rollback` with the new sequence lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.runtime.medusa import MedusaHeads
from specserve.runtime.model import KVCache, Transformer
from specserve.runtime.params import SamplingParams
from specserve.spec.sampling import logits_to_probs, sample
from specserve.spec.tree import MedusaTree, build_tree_buffers, build_tree_tokens


@dataclass(frozen=True)
class ChainProposal:
    """Drafts for one step: ``tokens [B, K]`` int64 (0 after ``counts[b]``), the number of real
    drafts per row, and ``probs [B, K, V]`` (q of sampled drafts) or None for one-hot q."""

    tokens: torch.Tensor
    counts: list[int]
    probs: torch.Tensor | None


class Proposer:
    """Base of all proposers; ``name`` is the spec mode ("draft", "ngram", "medusa", ...)."""

    name = "none"


class ChainProposer(Proposer):
    """Proposes a chain of up to ``max_draft_len`` tokens per sequence."""

    def __init__(self, max_draft_len: int) -> None:
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.max_draft_len = max_draft_len

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        """Called once per ``generate`` with the prompts and the longest sequence possible."""

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        """Up to ``limits[b]`` drafts for sequence b (0: none needed; it may be finished).
        Randomness for row b comes only from ``generators[b]`` and depends only on that row."""
        raise NotImplementedError

    def rollback(self, seq_lens: list[int]) -> None:
        """The sequences are now ``seq_lens`` long (last token still unverified)."""


def _pad(rows: list[list[int]], k: int, device: torch.device | str) -> torch.Tensor:
    return torch.tensor([r + [0] * (k - len(r)) for r in rows], dtype=torch.long,
                        device=device).view(len(rows), k)


def ngram_lookup(seq: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed an earlier match of the last n tokens (longest n first).

    Among matches of one n, the most recent one that is followed by ``k`` tokens wins (a match
    right before the end, as in a run of one repeated token, is followed by fewer); failing that,
    the one followed by the most tokens.
    """
    size = len(seq)
    for n in range(max_n, min_n - 1, -1):
        if size <= n:
            continue
        suffix = seq[-n:]
        last = suffix[-1]
        best: list[int] = []
        for i in range(size - 2, n - 2, -1):  # i = end index of a candidate match
            if seq[i] == last and seq[i - n + 1:i + 1] == suffix:
                cont = seq[i + 1:i + 1 + k]
                if len(cont) == k:
                    return cont
                if len(cont) > len(best):
                    best = cont
        if best:
            return best
    return []


class NgramProposer(ChainProposer):
    """Prompt lookup: no model, one-hot q."""

    name = "ngram"

    def __init__(self, max_draft_len: int = 4, max_n: int = 3, min_n: int = 1,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(max_draft_len)
        self.max_n, self.min_n, self.device = max_n, min_n, device

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        drafts = [ngram_lookup(s, n, self.max_n, self.min_n) if n > 0 else []
                  for s, n in zip(seqs, limits, strict=True)]
        return ChainProposal(_pad(drafts, max(limits), self.device), [len(d) for d in drafts],
                             None)


class OracleProposer(ChainProposer):
    """Proposes the next tokens of known reference sequences (prompt + continuation) while the
    sequence still follows its reference; nothing after a divergence."""

    name = "oracle"

    def __init__(self, references: list[list[int]], max_draft_len: int = 4,
                 device: torch.device | str = "cpu") -> None:
        super().__init__(max_draft_len)
        self.references, self.device = references, device

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        drafts = []
        for seq, ref, k in zip(seqs, self.references, limits, strict=True):
            n = len(seq)
            drafts.append(ref[n:n + k] if ref[:n] == seq else [])
        return ChainProposal(_pad(drafts, max(limits), self.device), [len(d) for d in drafts],
                             None)


class DraftModelProposer(ChainProposer):
    """A draft LM with its own static cache; records q for lossless rejection sampling."""

    name = "draft"
    # > 0: end a row's chain at a draft whose draft probability is below this (HF's
    # assistant_confidence_threshold); lossless, fewer wasted draft forwards for a large K.
    min_confidence = 0.0

    def __init__(self, model: Transformer, max_draft_len: int = 4) -> None:
        super().__init__(max_draft_len)
        self.model = model.decode_layout()  # it runs one-token forwards: gemv-friendly weights
        self.cache: KVCache | None = None
        self._fed: list[int] = []

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        b = len(prompts)
        need = max_len + self.max_draft_len + 2
        if self.cache is None or self.cache.batch != b or self.cache.max_len < need:
            self.cache = self.model.new_cache(b, need)
        self.cache.lengths = [0] * b
        # The last prompt token is fed by the first propose (with the first generated token).
        self._feed([p[:-1] if len(p) > 1 else [] for p in prompts])

    def _feed(self, rows: list[list[int]]) -> torch.Tensor | None:
        """Feed per-row token lists; last hidden state per row [B, H] (None if all empty)."""
        assert self.cache is not None
        t = max(len(r) for r in rows)
        if t == 0:
            return None
        dev = self.model.device
        tokens = _pad(rows, t, dev)  # [B, T]
        lens = self.cache.lengths
        hidden = self.model(tokens, self.cache)  # [B, T, H]
        self.cache.lengths = [n + len(r) for n, r in zip(lens, rows, strict=True)]
        out: torch.Tensor
        if all(len(r) == t for r in rows):  # every row ends at T-1: a view, no gather
            out = hidden[:, -1]
        else:
            last = torch.tensor([max(len(r) - 1, 0) for r in rows], device=dev)
            out = hidden[torch.arange(len(rows), device=dev), last]
        return out

    def propose(self, seqs: list[list[int]], limits: list[int], params: list[SamplingParams],
                generators: list[torch.Generator]) -> ChainProposal:
        assert self.cache is not None
        k = max(limits)
        sampled = [i for i, p in enumerate(params) if p.temperature > 0 and limits[i] > 0]
        # 1. catch up: feed what the draft has not seen (the pending token, maybe one more)
        hidden = self._feed([s[n:] for s, n in zip(seqs, self.cache.lengths, strict=True)])
        assert hidden is not None
        tokens, probs, counts = [], [], list(limits)
        for i in range(k):
            logits = self.model.logits(hidden)  # [B, V]
            tok = logits.argmax(dim=-1)  # [B]
            if sampled:
                q = torch.zeros_like(logits)
                for b in sampled:
                    if i >= counts[b]:  # beyond this row's limit or stop: no randomness
                        continue
                    p = params[b]
                    q[b] = logits_to_probs(logits[b], p.temperature, p.top_k, p.top_p)
                    tok[b] = sample(q[b:b + 1], generators[b])[0]
                probs.append(q)
            tokens.append(tok)
            if self.min_confidence > 0 and self._stop_unsure(logits, tok, i, counts):
                break
            if i < k - 1:  # 2. feed each draft to get the next one's distribution
                hidden = self._feed_one(tok)
        drafts = torch.stack(tokens, dim=1)  # [B, k']
        q_all = torch.stack(probs, dim=1) if sampled else None  # [B, k', V]
        return ChainProposal(drafts, counts, q_all)

    def _stop_unsure(self, logits: torch.Tensor, tok: torch.Tensor, i: int,
                     counts: list[int]) -> bool:
        """End row b's chain at draft i when the draft gives it probability < min_confidence
        (HF's ``assistant_confidence_threshold``); True when every chain has ended.
        logits [B, V], tok [B]; ``counts`` is updated in place."""
        conf = torch.softmax(logits, dim=-1).gather(1, tok[:, None])[:, 0].tolist()  # [B]
        for b, c in enumerate(conf):
            if i < counts[b] and c < self.min_confidence:
                counts[b] = i + 1
        return all(c <= i + 1 for c in counts)

    def _feed_one(self, tok: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        hidden = self.model(tok[:, None], self.cache)  # [B, 1, H]
        self.cache.lengths = [n + 1 for n in self.cache.lengths]
        out: torch.Tensor = hidden[:, 0]
        return out

    def rollback(self, seq_lens: list[int]) -> None:
        assert self.cache is not None
        self.cache.lengths = [min(n, s - 1) for n, s in
                              zip(self.cache.lengths, seq_lens, strict=True)]


class MedusaProposer(Proposer):
    """Medusa heads plus a candidate tree. ``acceptance`` is "greedy" (tree verify at T=0; the
    heads' top-1 chain with lossless one-hot rejection sampling at T>0) or the LOSSY "typical"
    (Medusa's typical acceptance on the top-1 chain at T>0; never the default)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, tree: MedusaTree, acceptance: str = "greedy") -> None:
        if acceptance not in ("greedy", "typical"):
            raise ValueError(f"acceptance must be 'greedy' or 'typical', got {acceptance!r}")
        self.heads, self.acceptance = heads, acceptance
        self.tree = MedusaTree.from_choices(tree.choices, heads.num_heads)
        self.buffers = build_tree_buffers(self.tree)
        self.topk = self.tree.max_topk()
        self.max_draft_len = self.tree.depth  # chain length at T>0

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> MedusaProposer:
        """Move the heads (and cast them to the target's dtype) and the tree buffers."""
        self.heads.to(device=device, dtype=dtype)
        b = self.buffers
        self.buffers = type(b)(*(getattr(b, f).to(device) for f in b.__dataclass_fields__))
        return self

    def tree_tokens(self, root: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """root [B] pending tokens, hidden [B, H] -> candidate tokens [B, N+1] (root first)."""
        logits = self.heads(hidden)  # [B, num_heads, V]
        topk = logits.topk(self.topk, dim=-1).indices  # [B, num_heads, k]
        return build_tree_tokens(root, topk, self.buffers)

    def chain(self, hidden: torch.Tensor, limits: list[int]) -> ChainProposal:
        """The heads' top-1 tokens as a chain of up to ``limits[b]`` drafts (one-hot q)."""
        drafts = self.heads(hidden)[:, :max(limits)].argmax(dim=-1)  # [B, k]
        return ChainProposal(drafts, list(limits), None)
