"""Temperature 1 on the real model: tokens sampled with the trained EAGLE-3 head follow the
target's own sampling distribution (Leviathan/Chen rejection sampling), by the chi-square
harness of ``tests/runtime/test_distribution.py`` scaled to a 49,152-token vocabulary.

Top-k 8 keeps each position's support to 8 tokens, so the exact distribution of the first two
sampled tokens (64 cells) and of the third (up to 512 paths) is enumerated with transformers'
own forward. N rows of one short prompt, seeds 0..N-1, generate 3 tokens: the first from the
prefill, the next two drafted (K = 2) and verified. The test must not reject at p < 1e-3 (fixed
seeds: a reproducible check), and the same test rejects the negative control: the same run with
a verifier that samples from p instead of the residual after a rejection
(``tests/helpers/negative_control.py``). Needs ``make train-real``'s head
(``SPECSERVE_REAL_DRAFTS``, default checkpoints/smollm2-drafts).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.stats import chi2_p

pytestmark = pytest.mark.real_model

N, TOP_K = 2000, 8
PROMPT_TEXT = "The three most useful things to pack for a trip are"


def _topk_probs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids [.., k] and their renormalised probabilities [.., k] at temperature 1."""
    vals, ids = logits.float().topk(TOP_K, dim=-1)
    return ids, vals.softmax(-1)


def _exact(model: Path, prompt: list[int]) -> tuple[dict[tuple[int, int], float],
                                                    dict[int, float]]:
    """P(t1, t2) and P(t3) under top-k 8 sampling from transformers' own forward."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    joint: dict[tuple[int, int], float] = {}
    p3: dict[int, float] = {}
    with torch.inference_mode():
        ids1, pr1 = _topk_probs(hf(torch.tensor([prompt])).logits[0, -1])
        pre2 = torch.tensor([prompt + [int(a)] for a in ids1])
        ids2, pr2 = _topk_probs(hf(pre2).logits[:, -1])  # [k, k]
        pre3 = torch.tensor([prompt + [int(a), int(b)] for i, a in enumerate(ids1)
                             for b in ids2[i]])
        ids3, pr3 = _topk_probs(hf(pre3).logits[:, -1])  # [k*k, k]
    for i, a in enumerate(ids1.tolist()):
        for j, b in enumerate(ids2[i].tolist()):
            pab = float(pr1[i] * pr2[i, j])
            joint[(a, b)] = pab
            for c, pc in zip(ids3[i * TOP_K + j].tolist(), pr3[i * TOP_K + j].tolist(),
                             strict=True):
                p3[c] = p3.get(c, 0.0) + pab * pc
    return joint, p3


def _as_tensors(counts: dict[object, int], probs: dict[object, float]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    assert set(counts) <= set(probs), "a sampled token outside the exact support"
    keys = list(probs)
    return (torch.tensor([float(counts.get(k, 0)) for k in keys], dtype=torch.float64),
            torch.tensor([probs[k] for k in keys], dtype=torch.float64))


def _run(model: Path, head: Path, prompt: list[int]) -> tuple[list[list[int]], int, int]:
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams

    dec = build_decoder(model, eagle3_dir=head, max_draft_len=2)
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=TOP_K, seed=s)
              for s in range(N)]
    res = dec.generate([prompt] * N, params)
    rejected = sum(r.stats.draft_tokens - r.stats.accepted_tokens for r in res)
    accepted = sum(r.stats.accepted_tokens for r in res)
    return [list(r.token_ids) for r in res], accepted, rejected


def _p_values(toks: list[list[int]], joint: dict[tuple[int, int], float],
              p3: dict[int, float]) -> tuple[float, float]:
    from collections import Counter

    c12, e12 = _as_tensors(Counter((t[0], t[1]) for t in toks), joint)  # type: ignore[arg-type]
    c3, e3 = _as_tensors(Counter(t[2] for t in toks), p3)  # type: ignore[arg-type]
    return chi2_p(c12, e12), chi2_p(c3, e3)


def test_eagle3_sampling_follows_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    import specserve.runtime.step as step
    from tests.helpers.negative_control import skip_residual_sample

    model = Path(os.environ.get("SPECSERVE_REAL_MODEL", "checkpoints/smollm2"))
    head = Path(os.environ.get("SPECSERVE_REAL_DRAFTS", "checkpoints/smollm2-drafts")) / "eagle3"
    if not (model / "config.json").is_file():
        pytest.fail(f"{model} missing: run `make real-model` first")
    if not (head / "config.json").is_file():
        pytest.skip(f"{head} missing: run `make train-real` first")
    torch.set_num_threads(int(os.environ.get("SPECSERVE_TEST_THREADS", "2")))
    prompt = list(AutoTokenizer.from_pretrained(str(model))(PROMPT_TEXT)["input_ids"])
    joint, p3 = _exact(model, prompt)
    toks, accepted, rejected = _run(model, head, prompt)
    assert rejected > N // 20 and accepted > N // 20  # both outcomes really happen
    p12, p3v = _p_values(toks, joint, p3)
    monkeypatch.setattr(step, "rejection_sample", skip_residual_sample)  # the broken verifier
    bad12, bad3 = _p_values(_run(model, head, prompt)[0], joint, p3)
    print(f"chi-square p: (t1, t2) {p12:.3g}, t3 {p3v:.3g}; drafts accepted {accepted}, "
          f"rejected {rejected}; negative control (t1, t2) {bad12:.3g}, t3 {bad3:.3g}")
    assert p12 > 1e-3 and p3v > 1e-3
    assert min(bad12, bad3) < 1e-3  # the harness has the power to see a broken verifier
