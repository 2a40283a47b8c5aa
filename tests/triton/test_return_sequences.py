"""``num_return_sequences`` > 1 through the reference ``tensorrt_llm`` model's serving loop
(``specserve/serving/loop.py`` ``fan_out`` / ``SequenceGroup``).

TensorRT-LLM's contract (tensorrtllm_backend ``tensorrt_llm/1/model.py`` ``convert_response`` @
c2e65b8): each response holds ONE sequence's tokens and ``sequence_index`` [1, 1]; the request's
final flag goes with the response that ends the last sequence. Each sequence is independent: its
own scheduler row, proposer state, generator (seed + i) and finish reason.

- greedy and seeded: sequence i equals the prompt run alone (seed + i), with its own finish
  reason, for speculative decoders (draft model, n-gram) next to another request;
- sampled: the second tokens (each the first of a verify step) of choices 0 and 1 of N = 240
  requests
  (seeds 2j, draft-model speculation, T = 0.7) against the exact product distribution p2 x p2
  (p2 the target's marginal of the second token, enumerated; 4 x 4 cells of about equal
  mass): chi-square must not reject at
  p < 1e-3; the negative control, choice 1 replaced by a copy of choice 0 (what choices sharing
  one generator give), must be rejected at p < 1e-3;
- ``num_return_sequences`` above 16, with ``draft_input_ids``, or on a non-decoupled model: one
  error line for that request, its neighbour served.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import load_model
from specserve.runtime.params import expand_n
from specserve.runtime.proposers import DraftModelProposer, NgramProposer
from specserve.serving.request import EngineLimits
from tests.helpers.serving import serve_requests
from tests.helpers.tiny import TinyCheckpoint
from tests.serving.test_loop import Recorder

torch.set_num_threads(1)

PROMPT = [5, 6, 7, 8, 9, 10, 11]
OTHER = [30, 31, 32]
CHI2_ALPHA = 1e-3
N_CHI2 = 240  # requests of n = 2 (seeds 0, 2, 4, ...: no seed shared between two choices)


@cache
def _decoder(target: str, draft: str, kind: str) -> SpecDecoder:
    model = load_model(target)
    if kind == "draft":
        return SpecDecoder(model, DraftModelProposer(load_model(draft), max_draft_len=3))
    return SpecDecoder(model, NgramProposer(max_draft_len=3))


def decoder(ckpt: TinyCheckpoint, kind: str) -> SpecDecoder:
    return _decoder(str(ckpt.target), str(ckpt.draft), kind)


def limits(d: SpecDecoder) -> EngineLimits:
    return EngineLimits(vocab_size=d.target.cfg.vocab_size, max_draft_len=4, eos=None)


def inputs(prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, np.ndarray[Any, Any]]:
    arrays = {"input_ids": np.array([prompt], dtype=np.int32),
              "request_output_len": np.array([[max_tokens]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]])}
    arrays.update({k: np.array([[v]]) for k, v in extra.items()})
    return arrays


def serve(d: SpecDecoder, reqs: list[dict[str, np.ndarray[Any, Any]]], decoupled: bool = True,
          capacity: int = 4) -> list[Recorder]:
    """Each request admitted as llm.py's execute() does, then the loop run to its end."""
    return serve_requests(d, reqs, limits(d), lambda ids: "x" * len(ids), capacity=capacity,
                          max_pending=4096, decoupled=decoupled)


def by_sequence(rec: Recorder, n: int) -> list[list[int]]:
    """Each sequence's tokens, from the responses' ``sequence_index``."""
    seqs: list[list[int]] = [[] for _ in range(n)]
    for arrays, error, _ in rec.got:
        assert error is None, error
        if arrays is None:
            continue
        assert arrays["sequence_index"].shape == (1, 1)
        seqs[int(arrays["sequence_index"][0, 0])] += [int(t) for t in
                                                      arrays["output_ids"].reshape(-1)]
    return seqs


@pytest.mark.parametrize("kind", ["draft", "ngram"])
@pytest.mark.parametrize("streaming", [False, True])
def test_each_sequence_equals_the_prompt_run_alone(tiny_ckpt: TinyCheckpoint, kind: str,
                                                   streaming: bool) -> None:
    """n = 3 at T = 1 (seed 40) and greedy, next to another request: sequence i is the prompt
    run alone with seed 40 + i; one final flag, on the last response."""
    d = decoder(tiny_ckpt, kind)
    sampled = inputs(PROMPT, 12, num_return_sequences=3, temperature=1.0, seed=40,
                     end_id=7, streaming=streaming)
    greedy = inputs(PROMPT, 10, num_return_sequences=2, streaming=streaming)
    rec_s, rec_o, rec_g = serve(d, [sampled, inputs(OTHER, 6), greedy])
    base = SamplingParams(max_tokens=12, temperature=1.0, seed=40, end_id=7)
    got = by_sequence(rec_s, 3)
    for seq, p in zip(got, expand_n(base, 3), strict=True):
        assert seq == list(d.generate([PROMPT], [p])[0].token_ids)
    assert len({tuple(s) for s in got}) > 1  # independent: they differ
    plain = list(d.generate([PROMPT], [SamplingParams(max_tokens=10)])[0].token_ids)
    assert by_sequence(rec_g, 2) == [plain, plain]
    for rec in (rec_s, rec_g):
        assert [f for _, _, f in rec.got].count(True) == 1 and rec.got[-1][2]
    assert rec_o.finals and "sequence_index" not in (rec_o.finals[0][0] or {})


def test_each_sequence_has_its_own_finish(tiny_ckpt: TinyCheckpoint) -> None:
    """A stop id that ends some sequences early: each sequence's length is that of the
    sequence run alone (one ending does not end the others)."""
    d = decoder(tiny_ckpt, "draft")
    base = SamplingParams(max_tokens=16, temperature=1.0, seed=3)
    alone = [list(d.generate([PROMPT], [p])[0].token_ids) for p in expand_n(base, 6)]
    stop = next(t for t in alone[0][2:] if any(t not in a for a in alone))  # ends some only
    (rec,) = serve(d, [inputs(PROMPT, 16, num_return_sequences=6, temperature=1.0, seed=3,
                              end_id=stop)])
    want = [a[:a.index(stop)] if stop in a else a for a in alone]
    assert by_sequence(rec, 6) == want
    assert len({len(w) for w in want}) > 1


def _second_token_marginal(d: SpecDecoder, temperature: float) -> torch.Tensor:
    """p2 [V]: the target's exact distribution of the second generated token at
    ``temperature`` (sum over the first), from two forwards."""
    from specserve.spec.sampling import logits_to_probs

    target = d.target
    v = target.cfg.vocab_size

    def last_logits(seqs: torch.Tensor) -> torch.Tensor:  # [B, L] -> [B, V]
        cache = target.new_cache(seqs.shape[0], seqs.shape[1] + 2)
        cache.lengths = [0] * seqs.shape[0]
        return target.logits(target(seqs, cache))[:, -1].float()

    with torch.inference_mode():
        p1 = logits_to_probs(last_logits(torch.tensor([PROMPT]))[0], temperature)  # [V]
        both = torch.cat([torch.tensor([PROMPT] * v), torch.arange(v)[:, None]], 1)  # [V, L+1]
        p2_given = logits_to_probs(last_logits(both), temperature)  # [V, V]
    return (p1.unsqueeze(1) * p2_given).sum(0)  # [V]


def _chi2_pairs(pairs: list[tuple[int, int]], p: torch.Tensor, groups: int = 4) -> float:
    """p-value of the pairs against p x p, the vocabulary binned into ``groups`` groups of
    about equal mass (tokens sorted by p; the tiny random target is nearly flat): every
    expected cell count is about N / 16 = 15 at N = 240."""
    from scipy.stats import chisquare

    order = torch.argsort(p, descending=True)
    before = torch.cumsum(p[order], 0) - p[order]  # [V] mass of the tokens ahead of each
    group = torch.empty_like(order)
    group[order] = torch.clamp((before * groups).long(), max=groups - 1)
    mass = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, p.double())
    obs = np.zeros((groups, groups))
    for a, b in pairs:
        obs[int(group[a]), int(group[b])] += 1
    exp = np.outer(mass.numpy(), mass.numpy()) / float(mass.sum()) ** 2 * len(pairs)
    assert exp.min() >= 5, exp.min()
    return float(chisquare(obs.reshape(-1), exp.reshape(-1)).pvalue)


def test_sampled_choices_are_independent_draws_of_the_target(tiny_ckpt: TinyCheckpoint
                                                            ) -> None:
    d = decoder(tiny_ckpt, "draft")
    temp = 0.7
    reqs = [inputs(PROMPT, 4, num_return_sequences=2, temperature=temp, seed=2 * j,
                   return_perf_metrics=True) for j in range(N_CHI2)]
    recs = serve(d, reqs, capacity=8)
    seqs = [by_sequence(r, 2) for r in recs]
    pairs = [(s[0][1], s[1][1]) for s in seqs]
    p2 = _second_token_marginal(d, temp)
    assert _chi2_pairs(pairs, p2) > CHI2_ALPHA
    # negative control: choice 1 a copy of choice 0 (choices sharing one generator) is caught
    assert _chi2_pairs([(a, a) for a, _ in pairs], p2) < CHI2_ALPHA
    assert all(len(c) == 4 for s in seqs for c in s)
    drafted = [int(a["total_draft_tokens"][0, 0]) for r in recs for a, _, _ in r.got
               if a is not None and "total_draft_tokens" in a]
    assert len(drafted) == 2 * N_CHI2 and sum(drafted) > 0  # the second tokens were verified


@pytest.mark.parametrize(("extra", "decoupled", "message"), [
    ({"num_return_sequences": 17}, True,
     r"n \(num_return_sequences\) must be in \[1, 16\], got 17"),
    ({"num_return_sequences": 0}, True, r"must be in \[1, 16\], got 0"),
    ({"num_return_sequences": 2}, False, "num_return_sequences > 1 needs a decoupled model"),
    ({"num_return_sequences": 2, "draft_input_ids": 5}, True,
     "'num_return_sequences' > 1 cannot be combined with 'draft_input_ids'"),
])
def test_bad_n_is_one_error_and_the_neighbour_is_served(tiny_ckpt: TinyCheckpoint,
                                                        extra: dict[str, Any], decoupled: bool,
                                                        message: str) -> None:
    import re

    d = decoder(tiny_ckpt, "ngram")
    bad = inputs(PROMPT, 4, **extra)
    if "draft_input_ids" in extra:
        bad["draft_input_ids"] = np.array([[5, 6]], dtype=np.int32)
    rec_bad, rec_ok = serve(d, [bad, inputs(OTHER, 4)], decoupled=decoupled)
    assert len(rec_bad.got) == 1
    arrays, error, final = rec_bad.got[0]
    assert arrays is None and final and error is not None and re.search(message, error), error
    assert "\n" not in error
    assert rec_ok.finals and rec_ok.finals[0][1] is None
