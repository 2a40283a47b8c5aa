"""Drafts given from outside (TensorRT-LLM's ``draft_input_ids`` / ``draft_logits``), verified in
ONE step after the full context by :meth:`SpecDecoder.verify` with an
:class:`ExternalDraftProposer`, and the opt-in per-token logits (``return_logits``) that a draft
model serves as ``generation_logits``.

- T=0: drafts right for j tokens then wrong (j = 0..K) give exactly the greedy continuation's
  first j + 1 tokens, with draft/accepted counts K/j, in one batch of ragged contexts, for two
  target forwards (prefill of ``context[:-1]``, verify of ``[context[-1], drafts]``).
- T>0, lossless: a V=8 target; N rows with seeds 0..N-1; the first emitted token must follow the
  target's p (exact, from a clean forward) and, in rows that emitted two, the second p(. | t1):
  chi-square p > 1e-3 each (deterministic seeds: a fixed check). Drafts are sampled from
  q = logits_to_probs(draft_logits) under the row's own params, or fixed (one-hot q). The first
  draft's acceptance count must match the Leviathan rate sum_x min(p, q) (one-hot: p(d1))
  within 5 sigma, which tells q-from-logits apart from one-hot q. Negative control: the
  residual-skipping verifier patched over ``specserve.runtime.step.rejection_sample`` is
  rejected (p < 1e-3) by the same test.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import Transformer, load_model
from specserve.runtime.proposers import DraftModelProposer, ExternalDraftProposer
from specserve.spec.sampling import logits_to_probs
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

K = 4
CONTEXTS = [[5, 6, 7, 8, 9, 10, 11], [20], [30, 31, 32]]


def _greedy(target: Transformer, ctx: list[int], n: int) -> list[int]:
    return SpecDecoder(target).generate([ctx], SamplingParams(max_tokens=n))[0].token_ids


def _wrong_at(g: list[int], j: int, vocab: int) -> list[int]:
    """K drafts: the greedy tokens, except draft j (when j < K) which is wrong; the drafts after
    it are right again (a verifier that kept going would accept them)."""
    d = list(g[:K])
    if j < K:
        d[j] = (g[j] + 1) % vocab
    return d


class _Forwards:
    """Counts the target's forwards and their token widths (every forward is a
    ``Transformer.run``: the instance's own is wrapped; ``remove()`` unwraps it)."""

    def __init__(self, model: Transformer) -> None:
        self.widths: list[int] = []
        self.model, run = model, model.run

        def counted(tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.widths.append(int(tokens.shape[1]))
            return run(tokens, *args, **kwargs)
        model.run = counted  # type: ignore[method-assign]
        self.handle = self

    def remove(self) -> None:
        del self.model.run


def test_greedy_accepts_the_right_prefix_plus_one(tiny_models: TinyModels) -> None:
    target = tiny_models.target
    vocab = target.cfg.vocab_size
    greedy = [_greedy(target, c, K + 1) for c in CONTEXTS]
    rows = [(b, j) for b in range(len(CONTEXTS)) for j in range(K + 1)]
    drafts = [_wrong_at(greedy[b], j, vocab) for b, j in rows]
    dec = SpecDecoder(target)
    fwd = _Forwards(target)
    try:
        out = dec.verify([CONTEXTS[b] for b, _ in rows], SamplingParams(max_tokens=K + 1),
                         ExternalDraftProposer(drafts))
    finally:
        fwd.handle.remove()
    assert fwd.widths == [max(len(c) for c in CONTEXTS) - 1, K + 1]  # prefill + ONE verify
    for (b, j), r in zip(rows, out, strict=True):
        assert r.token_ids == greedy[b][:j + 1], (b, j)
        assert (r.stats.draft_tokens, r.stats.accepted_tokens, r.stats.steps) == (K, j, 1)
        assert r.finish_reason == ("length" if j == K else "verified")


def test_one_token_context_is_one_forward(tiny_models: TinyModels) -> None:
    target = tiny_models.target
    g = _greedy(target, [20], K + 1)
    fwd = _Forwards(target)
    try:
        (r,) = SpecDecoder(target).verify(
            [[20]], SamplingParams(max_tokens=K + 1),
            ExternalDraftProposer([_wrong_at(g, 2, target.cfg.vocab_size)]))
    finally:
        fwd.handle.remove()
    assert fwd.widths == [K + 1]  # nothing to prefill: the verify forward only
    assert r.token_ids == g[:3]


def test_stop_tokens_and_max_tokens_cut_the_step(tiny_models: TinyModels) -> None:
    target = tiny_models.target
    g = _greedy(target, CONTEXTS[0], K + 1)
    dec = SpecDecoder(target)
    stop, short, none = dec.verify(
        [CONTEXTS[0]] * 3,
        [SamplingParams(max_tokens=K + 1, end_id=g[1]), SamplingParams(max_tokens=2),
         SamplingParams(max_tokens=K + 1)],
        ExternalDraftProposer([g[:K], g[:K], []]))
    assert (stop.token_ids, stop.finish_reason) == (g[:1], "stop")
    assert (short.token_ids, short.finish_reason) == (g[:2], "length")
    assert (short.stats.draft_tokens, short.stats.accepted_tokens) == (1, 1)  # max_tokens - 1
    assert (none.token_ids, none.stats.draft_tokens) == (g[:1], 0)  # no drafts: one token


def test_generate_proposes_nothing_and_own_proposer_is_untouched(
        tiny_models: TinyModels) -> None:
    """In a plain generate the external drafts would be misaligned (the prefill has sampled a
    token already): the proposer proposes nothing. verify() with it leaves the decoder's own
    proposer to its own generate calls."""
    target = tiny_models.target
    g = _greedy(target, CONTEXTS[0], 8)
    (plain,) = SpecDecoder(target, ExternalDraftProposer([g[:K]])).generate(
        [CONTEXTS[0]], SamplingParams(max_tokens=8))
    assert plain.token_ids == g and plain.stats.draft_tokens == 0
    dec = SpecDecoder(target, DraftModelProposer(tiny_models.target_copy, max_draft_len=K))
    (v,) = dec.verify([CONTEXTS[0]], SamplingParams(max_tokens=K + 1),
                      ExternalDraftProposer([_wrong_at(g, 2, target.cfg.vocab_size)]))
    assert v.token_ids == g[:3]
    (own,) = dec.generate([CONTEXTS[0]], SamplingParams(max_tokens=8))
    assert own.token_ids == g and own.stats.accepted_tokens == own.stats.draft_tokens > 0


def test_bad_drafts_are_one_line_errors(tiny_models: TinyModels) -> None:
    target, v = tiny_models.target, tiny_models.target.cfg.vocab_size
    dec = SpecDecoder(target)
    with pytest.raises(ValueError, match=f"draft token id {v} outside the vocab"):
        dec.verify([[1, 2]], SamplingParams(max_tokens=3), ExternalDraftProposer([[1, v]]))
    with pytest.raises(ValueError, match=rf"draft_logits \(2, 7\) must be \[2, {v}\]"):
        dec.verify([[1, 2]], SamplingParams(max_tokens=3),
                   ExternalDraftProposer([[1, 2]], [torch.zeros(2, 7)]))
    with pytest.raises(ValueError, match=r"must be \[2, V\]"):
        ExternalDraftProposer([[1, 2]], [torch.zeros(3, v)])
    with pytest.raises(ValueError, match="exceed max_draft_len 1"):
        ExternalDraftProposer([[1, 2]], max_draft_len=1)


# --- per-token logits (generation_logits) -----------------------------------------------------

def _direct_logits(target: Transformer, ctx: list[int], tokens: list[int]) -> torch.Tensor:
    """The target's logits [T, V] predicting each of ``tokens`` after ``ctx``: one clean
    forward over ctx + tokens[:-1]."""
    seq = ctx + tokens[:-1]
    cache = target.new_cache(1, len(seq) + 1)
    with torch.inference_mode():
        h = target(torch.tensor([seq]), cache)
        return target.logits(h[0, len(ctx) - 1:])


@pytest.mark.parametrize("mode", ["plain", "draft", "chain", "tree"])
def test_return_logits_are_the_logits_of_each_token(tiny_models: TinyModels, mode: str) -> None:
    """Plain decoding, chain steps (a draft model accepting everything; scripted chains with
    rejections) and tree steps (scripted Medusa-like trees, accepted paths of several nodes)."""
    from tests.runtime.test_proposer_protocol import (
        CHAIN_SCRIPT,
        TREE_SCRIPT,
        ScriptedChain,
        ScriptedTree,
    )

    target = tiny_models.target
    params = SamplingParams(max_tokens=9)
    refs = [_greedy(target, c, 9) for c in CONTEXTS[:2]]
    prop = {"plain": None,
            "draft": DraftModelProposer(tiny_models.target_copy, max_draft_len=K),
            "chain": ScriptedChain(refs, CHAIN_SCRIPT),
            "tree": ScriptedTree(refs, TREE_SCRIPT)}[mode]
    dec = SpecDecoder(target, prop)
    a, b = dec.generate(CONTEXTS[:2], params, return_logits=[True, False])
    assert b.logits is None and b.token_ids == refs[1]
    assert a.logits is not None and a.logits.shape == (9, target.cfg.vocab_size)
    assert a.token_ids == refs[0] and a.logits.argmax(-1).tolist() == a.token_ids
    torch.testing.assert_close(a.logits, _direct_logits(target, CONTEXTS[0], a.token_ids),
                               rtol=1e-4, atol=1e-4)
    if mode != "plain":
        assert a.stats.accepted_tokens > 0  # the speculative path really ran
    if mode in ("plain", "draft"):
        (default,) = dec.generate(CONTEXTS[:1], params)
        assert default.logits is None and default.token_ids == a.token_ids


def test_verify_returns_logits_of_the_emitted_tokens(tiny_models: TinyModels) -> None:
    target = tiny_models.target
    g = _greedy(target, CONTEXTS[2], K + 1)
    drafts = [_wrong_at(g, 2, target.cfg.vocab_size)]
    (r,) = SpecDecoder(target).verify([CONTEXTS[2]], SamplingParams(max_tokens=K + 1),
                                      ExternalDraftProposer(drafts), return_logits=True)
    assert r.logits is not None and r.logits.shape[0] == 3 == len(r.token_ids)
    torch.testing.assert_close(r.logits, _direct_logits(target, CONTEXTS[2], r.token_ids),
                               rtol=1e-4, atol=1e-4)


# --- T > 0: lossless --------------------------------------------------------------------------

V, N, PROMPT, K2 = 8, 3000, [1, 2, 3], 2
PARAMS: dict[str, dict[str, Any]] = {
    "T1": {"temperature": 1.0}, "filtered": {"temperature": 2.0, "top_k": 5, "top_p": 0.95}}


@pytest.fixture(scope="module")
def v8_target(tmp_path_factory: pytest.TempPathFactory) -> Transformer:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, initializer_range=0.6,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("v8") / "target"
    LlamaForCausalLM(cfg).eval().save_pretrained(str(out), safe_serialization=True)
    return load_model(Path(out))


def _logits(target: Transformer, seqs: list[list[int]]) -> torch.Tensor:
    """The target's next-token logits [len(seqs), V] (a clean forward)."""
    cache = target.new_cache(len(seqs), len(seqs[0]) + 1)
    with torch.inference_mode():
        return target.logits(target(torch.tensor(seqs), cache)[:, -1])


def _p(target: Transformer, seqs: list[list[int]], sp: dict[str, Any]) -> torch.Tensor:
    """Exact next-token probs [len(seqs), V] under the sampling params."""
    return logits_to_probs(_logits(target, seqs), **sp).double()


def _chi2_p(obs: torch.Tensor, exp: torch.Tensor) -> float:
    """Chi-square p-value; cells expecting < 5 pooled into one."""
    from scipy.stats import chisquare

    obs, exp = obs.flatten().double(), exp.flatten().double()
    keep = exp >= 5
    o = torch.cat([obs[keep], obs[~keep].sum()[None]])
    e = torch.cat([exp[keep], exp[~keep].sum()[None]])
    if e[-1] < 5:
        o, e = o[:-1], e[:-1]
    e = e * o.sum() / e.sum()
    return float(chisquare(o.numpy(), e.numpy()).pvalue)


def _run(target: Transformer, sp: dict[str, Any], with_logits: bool
         ) -> tuple[list[list[int]], list[list[int]], torch.Tensor | None]:
    """N rows verifying K2 drafts each: (outputs, drafts, q [K2, V] or None)."""
    g = torch.Generator().manual_seed(123)
    if with_logits:  # drafts sampled from q = logits_to_probs(draft_logits) under the same params
        # a draft close to the target (noisy target logits): sum min(p, q) is far above the
        # one-hot rate sum p q, so the acceptance count shows which q was used
        top = int(_logits(target, [PROMPT])[0].argmax())
        near = torch.cat([_logits(target, [PROMPT]), _logits(target, [PROMPT + [top]])])
        draft_logits = near + torch.randn(K2, V, generator=g) * 0.7
        q = logits_to_probs(draft_logits, **sp)
        drafts = [[int(torch.multinomial(q[i], 1, generator=g)) for i in range(K2)]
                  for _ in range(N)]
        prop = ExternalDraftProposer(drafts, [draft_logits] * N)
    else:  # fixed drafts (as n-gram lookups would be): one-hot q; the 2nd likeliest tokens
        q = None
        d1 = int(_p(target, [PROMPT], sp)[0].argsort()[-2])
        d2 = int(_p(target, [PROMPT + [d1]], sp)[0].argsort()[-2])
        drafts = [[d1, d2]] * N
        prop = ExternalDraftProposer(drafts)
    params = [SamplingParams(max_tokens=K2 + 1, seed=s, **sp) for s in range(N)]
    res = SpecDecoder(target).verify([PROMPT] * N, params, prop)
    for r in res:
        assert r.stats.draft_tokens == K2 and 1 <= len(r.token_ids) <= K2 + 1
    return [r.token_ids for r in res], drafts, q


def _check_lossless(target: Transformer, sp: dict[str, Any], outs: list[list[int]]
                    ) -> tuple[float, float]:
    """p-values: first token vs p1; second token vs p(. | t1) in rows that emitted two."""
    p1 = _p(target, [PROMPT], sp)[0]
    p2 = _p(target, [PROMPT + [a] for a in range(V)], sp)  # [V, V]
    first = torch.tensor([o[0] for o in outs])
    pv1 = _chi2_p(torch.bincount(first, minlength=V), p1 * N)
    two = [o for o in outs if len(o) >= 2]
    obs = torch.zeros(V, V)
    for o in two:
        obs[o[0], o[1]] += 1
    n_a = obs.sum(1, keepdim=True).double()
    assert len(two) > N // 20  # enough rows reach the second position
    return pv1, _chi2_p(obs, n_a * p2)


@pytest.mark.parametrize("with_logits", [True, False], ids=["q_from_logits", "one_hot_q"])
@pytest.mark.parametrize("sp_name", list(PARAMS))
def test_verify_is_lossless_at_temperature(v8_target: Transformer, sp_name: str,
                                           with_logits: bool) -> None:
    sp = PARAMS[sp_name]
    outs, drafts, q = _run(v8_target, sp, with_logits)
    pv1, pv2 = _check_lossless(v8_target, sp, outs)
    assert pv1 > 1e-3 and pv2 > 1e-3, (pv1, pv2)
    # The first draft's acceptance rate: sum_x min(p, q) (Leviathan), one-hot q: p(d1).
    p1 = _p(v8_target, [PROMPT], sp)[0]
    rate = float(torch.minimum(p1, q[0].double()).sum()) if q is not None \
        else float(p1[drafts[0][0]])
    accepted = sum(o[0] == d[0] for o, d in zip(outs, drafts, strict=True))
    sigma = math.sqrt(N * rate * (1 - rate))
    assert abs(accepted - N * rate) < 5 * sigma, (accepted, N * rate, sigma)


def test_negative_control_is_rejected(v8_target: Transformer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual-skipping verifier over the step module's global ``rejection_sample``
    (the name the chain step calls): the first-token test rejects it."""
    import specserve.runtime.step as step
    from tests.helpers.negative_control import skip_residual_sample

    monkeypatch.setattr(step, "rejection_sample", skip_residual_sample)
    sp = PARAMS["T1"]
    outs, _, _ = _run(v8_target, sp, with_logits=False)
    pv1, _ = _check_lossless(v8_target, sp, outs)
    assert pv1 < 1e-3, pv1
