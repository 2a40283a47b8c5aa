"""Log-probabilities under speculation (:mod:`specserve.spec.logprobs`).

- Greedy, 32 requests per method (draft model, n-gram, Medusa tree, EAGLE-3 chain and tree),
  run through the in-flight batcher: every token's log-probability and its top-5 alternatives
  equal plain decoding's within 1e-4 (float32), tokens equal.
- Sampled (T = 0.8) with speculation: each emitted token's log-probability equals
  log_softmax(logits / T) of a fresh teacher-forced target forward over prompt + output
  (within 1e-4): the numbers come from the verify forward, right for every position.
- T = 1 chi-square (vocab 8, N = 2000 seeded rows, p > 1e-3, the harness of
  test_distribution.py): logprob-carrying requests with speculation still follow the target's
  distribution, and their reported log-probability of the first token is Hugging Face's; the
  draft's own distribution (negative control) is rejected by the same test.
- ``top_logprobs`` above the limit is one error for that request; the batch goes on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import Transformer, load_model
from specserve.runtime.params import MAX_TOP_LOGPROBS
from specserve.runtime.scheduler import Scheduler
from tests.helpers.stats import chi2_p as _chi2_p
from tests.runtime.conftest import TinyModels
from tests.runtime.test_distribution import PROMPT, N, V, _exact, _tiny
from tests.runtime.test_distribution import _proposer as _v8_proposer
from tests.runtime.test_scheduler import _proposer

torch.set_num_threads(1)

KINDS = ["draft_same", "draft_random", "ngram", "medusa", "eagle3", "eagle3_tree"]
TOP = 5


def _prompts(n: int = 32) -> list[list[int]]:
    g = torch.Generator().manual_seed(31)
    out = []
    for i in range(n):
        base = torch.randint(3, 200, (2 + i % 5,), generator=g).tolist()
        out.append(base * (1 + i % 3))  # some repetition: n-gram drafts get accepted
    return out


def _params(temperature: float = 0.0, seed: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=temperature, seed=seed, logprobs=True,
                          top_logprobs=TOP)


def _batched(m: TinyModels, kind: str, prompts: list[list[int]],
             params: list[SamplingParams]) -> list:
    sch = Scheduler(SpecDecoder(m.target, _proposer(kind, m)), capacity=8, max_len=64)
    handles = [sch.submit(p, q) for p, q in zip(prompts, params, strict=True)]
    sch.run_until_idle()
    return [h.result for h in handles]


@pytest.fixture(scope="module")
def plain(tiny_models: TinyModels) -> list:
    return SpecDecoder(tiny_models.target).generate(_prompts(), _params())


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_logprobs_equal_plain_decoding(tiny_models: TinyModels, plain: list,
                                              kind: str) -> None:
    got = _batched(tiny_models, kind, _prompts(), [_params()] * 32)
    assert sum(r.stats.draft_tokens for r in got) > 0  # speculation really happened
    if kind == "draft_same":  # and emitted accepted drafts (their logits: verify positions)
        assert sum(r.stats.accepted_tokens for r in got) > 100
    for g, w in zip(got, plain, strict=True):
        assert g.token_ids == w.token_ids
        assert len(g.logprobs) == len(g.token_ids) == len(g.top_logprobs)
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)
        for a, b in zip(g.top_logprobs, w.top_logprobs, strict=True):
            assert len(a) == TOP and [t for t, _ in a] == [t for t, _ in b]
            assert torch.allclose(torch.tensor([v for _, v in a]),
                                  torch.tensor([v for _, v in b]), atol=1e-4)
        # greedy: the emitted token is the most likely one
        assert [t[0][0] for t in g.top_logprobs] == g.token_ids
        assert g.cum_logprob == pytest.approx(sum(g.logprobs))


def _teacher_forced(target: Transformer, prompt: list[int], out: list[int],
                    temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each output token, from one forward over prompt + output."""
    seq = prompt + out
    cache = target.new_cache(1, len(seq) + 2)
    cache.lengths = [0]
    with torch.inference_mode():
        logits = target.logits(target(torch.tensor([seq]), cache))[0].float()  # [L, V]
    lp = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, dim=-1)
    return lp.gather(1, torch.tensor(out)[:, None])[:, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_logprobs_are_the_targets_at_every_position(tiny_models: TinyModels,
                                                           kind: str) -> None:
    prompts = _prompts(8)
    got = _batched(tiny_models, kind, prompts, [_params(0.8, s) for s in range(8)])
    for p, r in zip(prompts, got, strict=True):
        want = _teacher_forced(tiny_models.target, p, r.token_ids, 0.8)
        assert torch.allclose(torch.tensor(r.logprobs), want, atol=1e-4)


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vocab8_logprobs")
    return _tiny(root / "target", 0), _tiny(root / "draft", 1)


@pytest.mark.parametrize("kind", ["draft", "medusa", "eagle3"])
def test_logprob_requests_keep_the_target_distribution(vocab8: tuple[Path, Path],
                                                       kind: str) -> None:
    target_dir, draft_dir = vocab8
    target = load_model(target_dir)
    dec = SpecDecoder(target, _v8_proposer(kind, draft_dir, target))
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s, logprobs=True,
                             top_logprobs=2) for s in range(N)]
    res = dec.generate([PROMPT] * N, params)
    toks = torch.tensor([r.token_ids for r in res])  # [N, 4]
    assert sum(r.stats.draft_tokens - r.stats.accepted_tokens for r in res) > N // 4
    joint, p3 = _exact(target_dir)
    c12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V).double()
    assert _chi2_p(c12, joint) > 1e-3
    assert _chi2_p(torch.bincount(toks[:, 2], minlength=V).double(), p3) > 1e-3
    d_joint, _ = _exact(draft_dir)  # negative control: the draft's distribution is rejected
    assert _chi2_p((d_joint * N).round(), joint) < 1e-3
    p1 = joint.sum(1)  # P(t1): the reported first-token log-probability is the model's
    lp1 = torch.tensor([r.logprobs[0] for r in res], dtype=torch.float64)
    assert torch.allclose(lp1.exp(), p1[toks[:, 0]], atol=1e-4)


def test_top_logprobs_above_the_limit_fail_that_request_only(tiny_models: TinyModels) -> None:
    sch = Scheduler(SpecDecoder(tiny_models.target, _proposer("ngram", tiny_models)), 4, 64)
    good = sch.submit([5, 6, 7], _params())
    with pytest.raises(SpecserveError, match=f"top_logprobs must be in \\[0, {MAX_TOP_LOGPROBS}"):
        sch.submit([5, 6, 7], SamplingParams(logprobs=True, top_logprobs=MAX_TOP_LOGPROBS + 1))
    with pytest.raises(SpecserveError, match="top_logprobs needs logprobs"):
        sch.submit([5, 6, 7], SamplingParams(top_logprobs=2))
    sch.run_until_idle()
    assert good.result is not None and len(good.result.logprobs) == 10


def test_no_logprobs_unless_asked(tiny_models: TinyModels) -> None:
    r = SpecDecoder(tiny_models.target).generate([[5, 6, 7]], SamplingParams(max_tokens=3))[0]
    assert r.logprobs is None and r.top_logprobs is None
