"""Predicted Outputs (:mod:`specserve.runtime.proposers.prediction`).

- The lookup: the longest output suffix found in the prediction, nearest occurrence, what
  follows it; nothing on a miss.
- Greedy, every method and plain (no proposer), in one in-flight batch: a row with a prediction
  (the plain output with a small edit, or garbage) equals plain decoding; with a good
  prediction most tokens come from it (``accepted_prediction_tokens``), and
  accepted + rejected = the prediction's length.
- T = 1 chi-square (vocab 8, N = 2000 seeded rows, p > 1e-3; the harness of
  test_distribution.py): prediction requests follow the target's distribution; the negative
  control, the broken verifier of tests/helpers/negative_control.py (no residual after a
  rejection), fails the same test.
- Bad input (a prediction longer than the context, ids outside the vocab) fails that request
  only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specserve.runtime.step as step_module
from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import load_model
from specserve.runtime.proposers import DraftModelProposer
from specserve.runtime.proposers.prediction import prediction_drafts
from specserve.runtime.scheduler import Scheduler
from tests.helpers.negative_control import skip_residual_sample
from tests.helpers.stats import chi2_p as _chi2_p
from tests.runtime.conftest import TinyModels
from tests.runtime.test_distribution import PROMPT, N, V, _exact, _tiny
from tests.runtime.test_scheduler import PROMPTS, _proposer

torch.set_num_threads(1)

KINDS = ["none", "draft_random", "ngram", "medusa", "eagle3", "eagle3_tree"]
MAX = 24


def test_the_lookup_follows_the_longest_nearest_match() -> None:
    pred = [1, 2, 3, 4, 5, 1, 2, 9, 9]
    assert prediction_drafts([], pred, 3) == [1, 2, 3]
    assert prediction_drafts([1, 2], pred, 2) == [3, 4]       # short output: a prefix match
    assert prediction_drafts([2], pred, 2) == []              # short and not a prefix: miss
    assert prediction_drafts([7, 1, 2], pred, 2, min_match=2) == [3, 4]  # nearest "1 2"
    assert prediction_drafts([3, 4, 5, 1, 2], pred, 3) == [9, 9]  # longest suffix "5 1 2"
    assert prediction_drafts([7, 7, 1, 2], pred, 3) == []     # only 2 tokens match: a miss
    assert prediction_drafts([8, 8], pred, 3, min_match=1) == []  # miss
    assert prediction_drafts([9], pred, 3, min_match=1) == [9]    # only what follows
    assert prediction_drafts([1], pred, 0) == []


def _plain(m: TinyModels) -> list[list[int]]:
    dec = SpecDecoder(m.target)
    return [dec.generate([p], SamplingParams(max_tokens=MAX))[0].token_ids for p in PROMPTS]


def _edited(out: list[int], vocab: int) -> tuple[int, ...]:
    """The output with a small edit: one token changed, one inserted after it."""
    e = list(out)
    e[10] = (e[10] + 1) % vocab
    e.insert(11, (e[11] + 3) % vocab)
    return tuple(e)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_prediction_rows_equal_plain_decoding(tiny_models: TinyModels, kind: str) -> None:
    plain = _plain(tiny_models)
    vocab = tiny_models.target.cfg.vocab_size
    g = torch.Generator().manual_seed(3)
    preds: list[tuple[int, ...]] = []
    for i, out in enumerate(plain):  # good, garbage, none, in turn
        if i % 3 == 0:
            preds.append(_edited(out, vocab))
        elif i % 3 == 1:
            preds.append(tuple(torch.randint(0, vocab, (20,), generator=g).tolist()))
        else:
            preds.append(())
    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer(kind, tiny_models)), 4, 64)
    hs = [sch.submit(p, SamplingParams(max_tokens=MAX, prediction=q))
          for p, q in zip(PROMPTS, preds, strict=True)]
    sch.run_until_idle()
    for h, want, pred in zip(hs, plain, preds, strict=True):
        r = h.result
        assert r is not None and r.token_ids == want
        if not pred:
            assert r.accepted_prediction_tokens is None
            continue
        assert r.accepted_prediction_tokens + r.rejected_prediction_tokens == len(pred)
    good = [hs[i].result for i in range(0, len(PROMPTS), 3)]
    for r in good:  # most of the output came from the prediction, in few steps
        assert r.accepted_prediction_tokens >= MAX // 3
        assert r.stats.steps <= MAX // 2  # plain decoding: MAX - 1 steps


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vocab8_prediction")
    _tiny(root / "draft", 1)
    return _tiny(root / "target", 0)


def _counts(target_dir: Path, with_draft: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    target = load_model(target_dir)
    dec = SpecDecoder(target)
    # the greedy continuation (likely tokens: accepted often, and when rejected a broken
    # verifier shows), then every id once (whatever t1 is, something follows it)
    greedy = dec.generate([PROMPT], SamplingParams(max_tokens=5))[0].token_ids
    pred = (*greedy, 0, 1, 2, 3, 4, 5, 6, 7)
    if with_draft:  # the engine's draft model drafts too: its sampled q, one-hot on predictions
        dec = SpecDecoder(target, DraftModelProposer(load_model(target_dir.parent / "draft"),
                                                     max_draft_len=2))
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s, prediction=pred)
              for s in range(N)]
    res = dec.generate([PROMPT] * N, params)
    rejected = sum(r.stats.draft_tokens - r.stats.accepted_tokens for r in res)
    assert rejected > N // 4 and sum(r.accepted_prediction_tokens for r in res) > N // 40
    toks = torch.tensor([r.token_ids for r in res])  # [N, 4]
    return (torch.bincount(toks[:, 1] * V + toks[:, 2], minlength=V * V).double(),
            torch.bincount(toks[:, 3], minlength=V).double())


def _exact23(target_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t2, t3) [V, V] and P(t4) [V] under plain sampling (enumerated with HF)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True).eval()
    joint12, _ = _exact(target_dir)  # P(t1, t2)
    with torch.inference_mode():
        pre = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])
        p3 = hf(pre).logits[:, -1].softmax(-1).view(V, V, V).double()  # P(t3 | t1, t2)
        pre4 = torch.tensor([PROMPT + [a, b, c] for a in range(V) for b in range(V)
                             for c in range(V)])
        p4 = hf(pre4).logits[:, -1].softmax(-1).view(V, V, V, V).double()
    j123 = joint12[..., None] * p3  # [V, V, V]
    return j123.sum(0), (j123[..., None] * p4).sum((0, 1, 2))


@pytest.mark.parametrize("with_draft", [False, True])
def test_prediction_requests_keep_the_target_distribution(vocab8: Path,
                                                          with_draft: bool) -> None:
    c23, c4 = _counts(vocab8, with_draft)
    j23, p4 = _exact23(vocab8)
    assert _chi2_p(c23, j23) > 1e-3
    assert _chi2_p(c4, p4) > 1e-3


def test_the_negative_control_fails_the_same_test(vocab8: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_module, "rejection_sample", skip_residual_sample)
    c23, c4 = _counts(vocab8)
    j23, p4 = _exact23(vocab8)
    assert min(_chi2_p(c23, j23), _chi2_p(c4, p4)) < 1e-3


def test_bad_predictions_fail_that_request_only(tiny_models: TinyModels) -> None:
    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer("ngram", tiny_models)), 4, 32)
    good = sch.submit(PROMPTS[0], SamplingParams(max_tokens=8, prediction=(1, 2, 3)))
    with pytest.raises(SpecserveError, match="prediction has 33 tokens, more than the context "
                                             "length 32"):
        sch.submit(PROMPTS[1], SamplingParams(max_tokens=4, prediction=(1,) * 33))
    with pytest.raises(SpecserveError, match="prediction: token id -1 outside the vocab"):
        sch.submit(PROMPTS[1], SamplingParams(max_tokens=4, prediction=(1, -1)))
    sch.run_until_idle()
    assert good.result is not None and len(good.result.token_ids) == 8


def test_the_policy_counts_the_proposers_drafts_not_the_predictions(
        tiny_models: TinyModels) -> None:
    """A prediction equal to the answer supplies nearly every draft, all accepted: the
    draft-length policy's acceptance counts only the proposer's own verdicts (a poor proposer
    must not look good on a prediction's drafts), and the engine-wide counts equal the rows'."""
    from specserve.runtime.draft_policy import DraftLenPolicy
    from specserve.runtime.proposers import NgramProposer
    from tests.runtime.test_draft_policy import FLAT

    class Undecayed(DraftLenPolicy):
        DECAY = 1.0  # the engine-wide counts are plain sums

    want = _plain(tiny_models)[:2]
    policy = Undecayed(FLAT)
    dec = SpecDecoder(tiny_models.target, NgramProposer(max_draft_len=4), draft_policy=policy)
    res = [dec.generate([p], SamplingParams(max_tokens=MAX, prediction=tuple(w)))[0]
           for p, w in zip(PROMPTS[:2], want, strict=True)]
    assert [r.token_ids for r in res] == want
    own = [r.stats.own_verdicts() for r in res]
    from_prediction = sum(r.accepted_prediction_tokens or 0 for r in res)
    assert from_prediction > 20
    assert sum(r.stats.accepted_tokens for r in res) == sum(a for a, _ in own) + from_prediction
    assert (policy.acc, policy.rej) == (2.0 + sum(a for a, _ in own),
                                        2.0 + sum(r for _, r in own))
