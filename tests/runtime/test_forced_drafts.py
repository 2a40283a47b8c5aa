"""Grammar-forced drafts merged with the engine's proposer (:mod:`specserve.runtime.forced_drafts`).

- Greedy, in one in-flight batch with unguided rows, plain decoding, n-gram, EAGLE-3 chain, a
  random draft model and the target as its own draft (grammar-aware drafting): every guided row
  with forced drafts equals plain guided decoding token for token (and the unguided rows plain
  decoding), is valid under a schema with a 29-character key, and the accepted forced drafts
  reach the request's result.
- Forced drafts are proposed and accepted: forced alone takes fewer than a third of plain
  constrained decoding's target steps; with only the tokens the grammar allows alone (no
  jump-forward, no proposer) every draft is accepted (the constrained target is one-hot there);
  no step drafts more than ``MAX_FORCED_DRAFT`` (the decoder's cache lookahead).
- The merge by hand: a proposer draft that differs at a forced position ends its chain, as does
  one the grammar cuts; jump-forward tokens follow where the grammar forces a string.
- T = 1 chi-square (vocab 8 with a two-character token "fa", N = 2000 seeded rows, p > 1e-3; the
  harness of test_grammar.py) for an EBNF grammar with a forced token ("c" after "a"), a forced
  string ("fa": tokens "f" or "fa", the jump token "fa") and a forced "a" after "f": P(t1, t2)
  and P(t3, t4) against the constrained target enumerated with Hugging Face's model and fresh
  matchers, for forced drafts alone, with an EAGLE-3 chain (sampled q) and a fixed peaked q;
  negative controls fail the same test: no residual after a rejection, and the jump token
  verified against a spread q instead of its one-hot q (a one-hot q is no fault: verifying
  any draft against one-hot q is lossless).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import specserve.runtime.forced_drafts as fd
import specserve.runtime.step as step_module
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.forced_drafts import FORCED, JUMP, OWN, ForcedDrafts, merge_row
from specserve.runtime.grammar import CompiledGuide, Guide, GuideCompiler
from specserve.runtime.model import load_model
from specserve.runtime.scheduler import Scheduler
from tests.helpers.negative_control import skip_residual_sample
from tests.helpers.stats import chi2_p
from tests.runtime.conftest import TinyModels, json_guide
from tests.runtime.test_distribution import PROMPT, N, V, _tiny
from tests.runtime.test_distribution import _proposer as _v8_proposer
from tests.runtime.test_grammar import _FixedQ, constrained_next
from tests.runtime.test_scheduler import PROMPTS, _proposer

torch.set_num_threads(1)

KEY = "the_identifier_of_this_record"  # 29 characters: longer than one step's forced drafts
SCHEMA = {"type": "object",
          "properties": {KEY: {"type": "string", "pattern": "^[a-z]{1,6}$"},
                         "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": [KEY, "ok", "n"]}
MAX = 64


@pytest.fixture(scope="module")
def guide(tiny_models: TinyModels, tok: Any) -> CompiledGuide:
    compiled: CompiledGuide = json_guide(tiny_models, tok, SCHEMA)
    return compiled


def _params(tok: Any, guide: CompiledGuide) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, end_id=tok.eos_token_id, guide=guide)


def _valid(tok: Any, ids: list[int]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(tok.decode(ids)), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.mark.parametrize("kind", ["none", "ngram", "eagle3", "draft_random", "draft_same"])
def test_greedy_outputs_equal_plain_guided_decoding(tiny_models: TinyModels, tok: Any,
                                                    guide: CompiledGuide, kind: str) -> None:
    plain = SpecDecoder(tiny_models.target)
    want_g = [plain.generate([p], _params(tok, guide))[0].token_ids for p in PROMPTS[:4]]
    want_u = [plain.generate([p], SamplingParams(max_tokens=12))[0].token_ids
              for p in PROMPTS[:4]]
    dec = SpecDecoder(tiny_models.target, _proposer(kind, tiny_models), forced=ForcedDrafts())
    sch = Scheduler(dec, 4, 96)
    hs = [(sch.submit(p, _params(tok, guide)), sch.submit(p, SamplingParams(max_tokens=12)))
          for p in PROMPTS[:4]]
    sch.run_until_idle()
    for (g, u), wg, wu in zip(hs, want_g, want_u, strict=True):
        assert g.result is not None and u.result is not None
        assert g.result.token_ids == wg and _valid(tok, wg)
        assert u.result.token_ids == wu and u.result.accepted_forced_tokens == 0
        assert g.result.accepted_forced_tokens >= len(KEY) // 2


def test_forced_drafts_are_accepted_and_save_target_steps(tiny_models: TinyModels, tok: Any,
                                                          guide: CompiledGuide) -> None:
    p = _params(tok, guide)
    plain = SpecDecoder(tiny_models.target).generate([PROMPTS[0]], p)[0]
    alone = SpecDecoder(tiny_models.target, forced=ForcedDrafts()).generate([PROMPTS[0]], p)[0]
    sure = SpecDecoder(tiny_models.target, forced=ForcedDrafts(jump=False)).generate(
        [PROMPTS[0]], p)[0]
    assert alone.token_ids == plain.token_ids == sure.token_ids
    assert alone.accepted_forced_tokens > len(KEY)
    assert 3 * alone.stats.steps < plain.stats.steps
    # the grammar's only token: the constrained target is one-hot on it, always accepted
    assert sure.stats.draft_tokens > len(KEY)
    assert sure.stats.accepted_tokens == sure.stats.draft_tokens == sure.accepted_forced_tokens
    for r in (alone, sure):  # within the decoder's cache lookahead
        assert len(r.stats.per_position_drafted) <= fd.MAX_FORCED_DRAFT


# vocab 8 with one two-character token: "f" and "fa" both start the forced string "fa"
V8_PIECES = ["a", "b", "c", "d", "e", "f", "fa", "$"]
STOP = 7
# t1 in a-e; t2: "c" forced after a-c, a-b after d-e; t3: "f" or "fa" (jump token "fa");
# t4: "a" forced after "f", a-e after "fa"
EBNF = 'root ::= ([a-c] "c" | [d-e] [ab]) "fa" [a-e]+'


def _v8_guide() -> CompiledGuide:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(V8_PIECES, xgr.VocabType.RAW, stop_token_ids=[STOP])
    return GuideCompiler.from_info(info, V).compile(Guide("ebnf_grammar", EBNF))


def test_the_merge_rules_by_hand() -> None:
    g = _v8_guide()
    a, b, c, d, f, fa = 0, 1, 2, 3, 5, 6
    # after "a": "c" forced, then the jump token "fa"; the proposer's "d" differs: chain over
    row = merge_row(g.matcher([STOP]), [a, d, f], 8)
    assert (row.tokens, row.kinds) == ([a, c, fa], [OWN, FORCED, JUMP])
    row = merge_row(g.matcher([STOP]), [d, b, f, a], 8)  # its own, and "a" forced after "f"
    assert (row.tokens, row.kinds) == ([d, b, f, a], [OWN, OWN, OWN, FORCED])
    # "c" after "d" is cut: nothing is forced there, the chain ends; "e" after "d, a" is cut:
    # the jump token "fa" follows
    assert merge_row(g.matcher([STOP]), [d, c, f], 8).tokens == [d]
    row = merge_row(g.matcher([STOP]), [d, a, 4, a], 8)
    assert (row.tokens, row.kinds) == ([d, a, fa], [OWN, OWN, JUMP])
    assert merge_row(g.matcher([STOP]), [], 8, jump=False).tokens == []  # t1: 5 allowed
    assert merge_row(g.matcher([STOP]), [a], 2).tokens == [a, c]  # the limit
    assert merge_row(g.matcher([STOP]), [d, a, f], 8, jump=False).tokens == [d, a, f, a]


def _exact(target_dir: Path, guide: CompiledGuide) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t1, t2) [V, V] and P(t3, t4) [V, V] of sampling from the target masked by the grammar."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True).eval()

    def dist(prefix: list[int]) -> torch.Tensor:
        return constrained_next(hf, guide, prefix)

    def support(p: torch.Tensor) -> list[int]:
        return [int(t) for t in p.nonzero().flatten()]

    p1 = dist([])
    j12, j34 = torch.zeros(V, V, dtype=torch.float64), torch.zeros(V, V, dtype=torch.float64)
    for t1 in support(p1):
        p2 = dist([t1])
        j12[t1] = p1[t1] * p2
        for t2 in support(p2):
            p3 = dist([t1, t2])
            for t3 in support(p3):
                j34[t3] += j12[t1, t2] * p3[t3] * dist([t1, t2, t3])
    return j12, j34


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vocab8_forced")
    _tiny(root / "draft", 1)
    return _tiny(root / "target", 11)  # t1 spread over a-e; t3 "f" 0.48, "fa" 0.52


def _chi2(target_dir: Path, kind: str) -> float:
    guide = _v8_guide()
    target = load_model(target_dir)
    prop: Any = (None if kind == "none" else _FixedQ() if kind == "fixed_q" else
                 _v8_proposer(kind, target_dir.parent / "draft", target))
    dec = SpecDecoder(target, prop, forced=ForcedDrafts())
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s, end_id=STOP, guide=guide)
              for s in range(N)]
    res = dec.generate([PROMPT] * N, params)
    assert sum(r.accepted_forced_tokens for r in res) > N // 2  # forced drafts were verified
    toks = torch.tensor([r.token_ids[:4] for r in res])  # [N, 4] (no stop before t5)
    j12, j34 = _exact(target_dir, guide)
    c12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V).double()
    c34 = torch.bincount(toks[:, 2] * V + toks[:, 3], minlength=V * V).double()
    return min(chi2_p(c12, j12), chi2_p(c34, j34))


@pytest.mark.parametrize("kind", ["none", "eagle3", "fixed_q"])
def test_forced_drafts_follow_the_constrained_distribution(vocab8: Path, kind: str) -> None:
    assert _chi2(vocab8, kind) > 1e-3


def test_the_negative_control_fails_the_same_test(vocab8: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_module, "rejection_sample", skip_residual_sample)
    assert _chi2(vocab8, "fixed_q") < 1e-3


def test_a_jump_token_verified_against_a_spread_q_fails(
        vocab8: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power against a wrong q on a grammar draft: the jump token "fa" (the target may also
    take "f" there) verified against a q spread over the vocabulary (the step renormalizes it
    over "f" and "fa") instead of its one-hot q is over-accepted."""
    def spread(q: torch.Tensor, chain: fd.RowChain) -> None:
        q[len(chain.tokens):] = 0
        for j in chain.grammar_positions:
            q[j] = 1.0 / V if chain.kinds[j] == JUMP else 0.0
            if chain.kinds[j] != JUMP:
                q[j, chain.tokens[j]] = 1.0

    monkeypatch.setattr(fd, "_one_hot_grammar_q", spread)
    assert _chi2(vocab8, "fixed_q") < 1e-3
