"""The EAGLE-3 training-time-test loss, pure: step logits and the target's restricted
log-distribution in, the weighted loss and per-step KL / top-1 accuracy out (Li et al. 2025,
"EAGLE-3", arXiv:2503.01840).

Loss: the training-time test (:func:`specserve.runtime.eagle3.ttt_forward`, ``ttt_steps`` steps;
EAGLE-3 uses 7 at scale). Step j at index t predicts the target's distribution at position
t + j + 1, here soft: the target's distribution restricted to the draft vocabulary and
renormalized (= the softmax of the target's logits at the draft ids), against the head's
log-softmax, as forward KL, weighted ``step_decay ** j`` (EAGLE-3's training weights decay with
the step) and averaged over positions with t + j + 2 <= N. Prompt positions are kept: the soft
target is the target's own distribution, which is exact at every position whoever wrote the
prefix, so the prompt adds signal and no wrong labels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def step_weights(steps: int, decay: float) -> list[float]:
    return [decay ** j for j in range(steps)]


def ttt_loss(step_logits: list[torch.Tensor], target_logp: torch.Tensor,
             target_top: torch.Tensor, weights: list[float]
             ) -> tuple[torch.Tensor, list[float], list[float]]:
    """The weighted training-time-test loss and, per step, its KL and top-1 accuracy.

    step_logits: steps x [B, N, Vd] (:func:`ttt_forward`); target_logp [B, N, Vd]: the target's
    log-distribution at each position restricted to the draft vocabulary (renormalized);
    target_top [B, N]: the draft id of the target's argmax over the full vocabulary, -1 when it
    lies outside (a miss for any head). Step j at index t is scored against position t + j + 1,
    for t + j + 2 <= N only."""
    n = target_logp.shape[1]
    total = target_logp.new_zeros(())
    kls, accs, wsum = [], [], 0.0
    for j, (lg, w) in enumerate(zip(step_logits, weights, strict=True)):
        m = n - j - 1  # valid indices t = 0 .. n - j - 2
        if m <= 0:
            break
        logq = F.log_softmax(lg[:, :m].float(), dim=-1)          # [B, m, Vd]
        logp = target_logp[:, j + 1:j + 1 + m]                  # [B, m, Vd]
        kl = (logp.exp() * (logp - logq)).sum(-1).mean()
        total = total + w * kl
        wsum += w
        kls.append(float(kl.detach()))
        hit = lg[:, :m].argmax(-1) == target_top[:, j + 1:j + 1 + m]
        accs.append(float(hit.float().mean()))
    return total / max(wsum, 1e-12), kls, accs
