"""Evaluation of the demo proposers on held-out prompts at T=0.

At temperature 0 the speculative output equals the target's greedy output, so acceptance can be
replayed exactly on that greedy sequence (teacher forcing): a chain draft proposes what it
predicts on the true prefix for as long as it is right, and a Medusa tree step from the hidden
state at position t accepts the deepest tree path whose head top-k tokens match the sequence.
``tau`` (mean emitted tokens per target forward, accepted + 1) from this replay is reported as
``tau_replay``; the figures measured by the project's reference decoder (``specserve.runtime``) are
added by :mod:`specserve.train.decoder_eval` when it is available. Per-head top-1 accuracy
follows Medusa (Cai et al. 2024, Table 1 / Fig. 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReplayStats:
    """Verify steps and tokens emitted over a replayed greedy sequence."""

    steps: int
    emitted: int

    @property
    def tau(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0


def replay_chain(draft_pred: torch.Tensor, seq: torch.Tensor, start: int, k: int) -> ReplayStats:
    """Draft-model (chain) replay. draft_pred [T]: the draft's argmax after seq[:t+1] (teacher
    forced); seq [T]: the target's greedy sequence, generated from position ``start``."""
    t, steps, emitted, end = start - 1, 0, 0, seq.numel() - 1
    ok = (draft_pred[:-1] == seq[1:]).tolist()  # ok[s]: draft right about seq[s+1]
    while t < end:
        a = 0
        while a < k and t + a < end and ok[t + a]:
            a += 1
        n = min(a + 1, end - t)
        steps, emitted, t = steps + 1, emitted + n, t + n
    return ReplayStats(steps, emitted)


def tree_accept_depth(topk: torch.Tensor, future: Sequence[int],
                      choices: Sequence[tuple[int, ...]]) -> int:
    """Deepest tree path whose tokens match ``future``. topk [heads, kmax]: head top-k token ids
    at this step; future: the next greedy tokens after the root (future[d] checked by head d)."""
    best = 0
    for path in choices:
        d = len(path)
        if d <= best or d > len(future):
            continue
        if all(int(topk[i, r]) == future[i] for i, r in enumerate(path)):
            best = d
    return best


def replay_tree(topk: torch.Tensor, seq: torch.Tensor, start: int,
                choices: Sequence[tuple[int, ...]]) -> ReplayStats:
    """Medusa tree replay. topk [T, heads, kmax]: head top-k ids from the hidden state at each
    position; seq [T]: target greedy sequence generated from ``start``. A step at last committed
    position t emits the base token seq[t+1] plus the accepted path."""
    t, steps, emitted, end = start - 1, 0, 0, seq.numel() - 1
    ids = seq.tolist()
    while t < end:
        a = tree_accept_depth(topk[t], ids[t + 2:], choices)
        n = min(a + 1, end - t)
        steps, emitted, t = steps + 1, emitted + n, t + n
    return ReplayStats(steps, emitted)


def merge(stats: Sequence[ReplayStats]) -> ReplayStats:
    """Sum of steps and tokens over sequences (tau = total emitted / total steps)."""
    return ReplayStats(sum(s.steps for s in stats), sum(s.emitted for s in stats))


def evaluate_models(target: torch.nn.Module, draft: torch.nn.Module, heads: torch.nn.Module,
                    prompts: torch.Tensor, gen_len: int,
                    choices: Sequence[tuple[int, ...]], k: int = 4) -> dict[str, object]:
    """Replay-based evaluation on prompts [n, P]: per-head top-1 accuracy, draft greedy
    agreement, and tau for the Medusa tree ``choices`` and the draft at ``k`` (T=0)."""
    from specserve.train.distill import greedy_continue
    from specserve.train.medusa import MedusaHeads, final_hidden, head_top1_accuracy, medusa_labels

    assert isinstance(heads, MedusaHeads)
    p = prompts.shape[1]
    seqs = greedy_continue(target, prompts, gen_len)  # [n, T]
    hidden = final_hidden(target, seqs)  # [n, T, H]
    acc = head_top1_accuracy(heads, hidden, medusa_labels(seqs, heads.num_heads, p))
    kmax = 1 + max(max(c) for c in choices)
    with torch.inference_mode():
        topk = heads(hidden).topk(kmax, dim=-1).indices  # [n, T, heads, kmax]
        draft_pred = draft(input_ids=seqs).logits.argmax(-1)  # [n, T]
    agree = (draft_pred[:, p - 1:-1] == seqs[:, p:]).float().mean()
    usable = [c for c in choices if len(c) <= heads.num_heads]
    tree = merge([replay_tree(topk[i], seqs[i], p, usable) for i in range(seqs.shape[0])])
    chain = merge([replay_chain(draft_pred[i], seqs[i], p, k) for i in range(seqs.shape[0])])
    return {
        "heldout_prompts": int(seqs.shape[0]), "prompt_len": p, "gen_len": gen_len,
        "temperature": 0.0,
        "medusa": {"top1_accuracy": [round(a, 4) for a in acc], "tree": "mc_sim_7b_63",
                   "tree_nodes": len(usable), "tau_replay": round(tree.tau, 4)},
        "draft": {"k": k, "greedy_agreement": round(float(agree), 4),
                  "tau_replay": round(chain.tau, 4)},
    }
