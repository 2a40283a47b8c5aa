"""Temperature 1, seeded: tokens generated with speculation follow target-only sampling.

A tiny-vocab (V=8) target and an independent random draft with peaked distributions (so many
drafts are rejected); a random EAGLE-3 head over 6 of the 8 ids (q sampled, peaked); also
random Medusa heads (their top-1 chain with one-hot q, the lossless Medusa mode at T>0).
N rows of one prompt, each with its own seed, generate 4 tokens: the first comes from the
prefill, tokens 2-3 are drafted (K=2) and verified by rejection sampling, token 4 is a bonus or
recovered token. The exact target probabilities of (t1, t2) and of t3 are
enumerated with Hugging Face's model; a chi-square test must not reject them at p < 1e-3
(deterministic seeds: this is a fixed, reproducible check). The same test is shown to have the
power to reject the draft's own distribution.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head
from specserve.runtime.medusa import MedusaHeads
from specserve.runtime.model import Transformer, load_model
from specserve.runtime.proposers import DraftModelProposer, MedusaProposer, Proposer
from specserve.runtime.proposers.eagle3 import Eagle3Proposer
from specserve.spec.tree import MedusaTree
from tests.helpers.stats import chi2_p

torch.set_num_threads(1)
V, N, PROMPT = 8, 2000, [1, 2, 3]


def _tiny(out: Path, seed: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, initializer_range=0.6,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(out), safe_serialization=True)
    return out


def _exact(model_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t1, t2) [V, V] and P(t3) [V] under pure sampling from the model."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    with torch.inference_mode():
        p1 = hf(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)  # [V]
        pre2 = torch.tensor([PROMPT + [a] for a in range(V)])
        p2 = hf(pre2).logits[:, -1].softmax(-1)  # [V, V]
        pre3 = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = hf(pre3).logits[:, -1].softmax(-1).view(V, V, V)
    joint12 = p1[:, None] * p2
    return joint12.double(), (joint12[..., None] * p3).sum((0, 1)).double()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vocab8")
    return _tiny(root / "target", 0), _tiny(root / "draft", 1)


def _proposer(kind: str, draft_dir: Path, target: Transformer | None = None) -> Proposer:
    if kind == "draft":
        return DraftModelProposer(load_model(draft_dir), max_draft_len=2)
    if kind == "eagle3":  # a random head over 6 of the 8 ids: q is 0 on the other two
        assert target is not None
        torch.manual_seed(6)
        head = Eagle3Head(Eagle3Config.for_target(target.cfg, 6))
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0.0, 0.5)
            head.d2t.copy_(torch.tensor([0, 1, 3, 4, 6, 7]) - torch.arange(6))
            head.lm_head.weight.mul_(6.0)  # peaked q, unlike the target's p: many rejections
        return Eagle3Proposer(head, max_draft_len=2)
    torch.manual_seed(5)  # random heads: one-hot q on their top-1 chain, often rejected
    heads = MedusaHeads(num_heads=2, num_layers=1, hidden=16, vocab=V)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0.0, 0.5)
    return MedusaProposer(heads, MedusaTree.from_choices([[0], [0, 0]]))


@pytest.mark.parametrize("kind", ["draft", "medusa", "eagle3"])
def test_speculation_matches_target_sampling(models: tuple[Path, Path], kind: str) -> None:
    target_dir, draft_dir = models
    target = load_model(target_dir)
    dec = SpecDecoder(target, _proposer(kind, draft_dir, target))
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s) for s in range(N)]
    res = dec.generate([PROMPT] * N, params)
    toks = torch.tensor([r.token_ids for r in res])  # [N, 4]
    rejected = sum(r.stats.draft_tokens - r.stats.accepted_tokens for r in res)
    assert rejected > N // 4  # the proposals really differ: many rejections happen
    joint, p3 = _exact(target_dir)
    c12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V).double()
    c3 = torch.bincount(toks[:, 2], minlength=V).double()
    assert chi2_p(c12, joint) > 1e-3
    assert chi2_p(c3, p3) > 1e-3
    # Power: the draft's own distribution of (t1, t2) is rejected by the same test.
    d_joint, _ = _exact(draft_dir)
    assert chi2_p((d_joint * N).round(), joint) < 1e-3


def test_a_draft_length_that_changes_between_steps_is_lossless(models: tuple[Path, Path]
                                                               ) -> None:
    """Load-aware schedule 1:2,N+1:1 over 2N rows, half of which stop after 2 tokens: the first
    verify step runs 2N rows (K = 1), the second N rows (K = 2), so the measured rows' tokens
    2-3 come from steps of different K. Same chi-square bound (p > 1e-3, seeds 0..2N-1) on the
    N rows of 5 tokens."""
    from specserve.spec.schedule import DraftSchedule

    target_dir, draft_dir = models
    sched = DraftSchedule(((1, 2), (N + 1, 1)))
    dec = SpecDecoder(load_model(target_dir), _proposer("draft", draft_dir), schedule=sched)
    params = [SamplingParams(max_tokens=5 if s % 2 else 2, temperature=1.0, seed=s)
              for s in range(2 * N)]
    res = dec.generate([PROMPT] * (2 * N), params)
    long = [r for r, p in zip(res, params, strict=True) if p.max_tokens == 5]
    first = [r.stats.per_position_drafted for r in res if len(r.token_ids) == 2]
    assert all(d == [] for d in first)  # short rows: no drafts (1 token left after the prefill)
    k2 = sum(len(r.stats.per_position_drafted) > 1 and r.stats.per_position_drafted[1] > 0
             for r in long)
    assert N // 10 < k2 < N  # K = 2 at step 2 for many rows, K = 1 at step 1 for all
    toks = torch.tensor([r.token_ids[:3] for r in long])  # [N, 3]
    joint, p3 = _exact(target_dir)
    c12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V).double()
    c3 = torch.bincount(toks[:, 2], minlength=V).double()
    assert chi2_p(c12, joint) > 1e-3
    assert chi2_p(c3, p3) > 1e-3
