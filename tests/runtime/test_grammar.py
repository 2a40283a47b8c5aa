"""Structured output under speculation (:mod:`specserve.runtime.grammar`,
:mod:`specserve.spec.grammar`).

- The masking math: xgrammar's bitmask layout (bit j of word w = token 32 w + j), masked logits,
  the draft's q renormalized over the allowed set.
- Greedy, every method (draft model same/random, n-gram, EAGLE-3 chain; Medusa and EAGLE-3
  trees, every node masked by the grammar set after its path; Predicted Outputs), in one
  in-flight batch with unguided rows: each guided row equals plain guided decoding (no
  proposer) token for token, is valid JSON under the schema and ends with the stop token; each
  unguided row equals plain decoding. The draft model drafts inside the grammar
  (``DraftGuide``): the target as its own draft keeps >= 3 of its 4 drafts per step and has
  >= 90% of them accepted.
- Sampled (T = 1): 20 answers per chain method (default run) and 200 per method (``slow``)
  under the schema, 100% valid.
- T = 1 chi-square (vocab 8, N = 2000 seeded rows, p > 1e-3; the harness of
  test_distribution.py) for an EBNF grammar whose allowed set depends on the prefix: tokens 1-3
  follow the *constrained* target distribution (enumerated with Hugging Face's model and fresh
  xgrammar matchers), for a draft model and an EAGLE-3 chain (sampled q, masked and
  renormalized; a fixed peaked q that the grammar cuts often) and Medusa's chain (one-hot q,
  ``slow``); two negative controls fail the same test: tests/helpers/negative_control.py (no
  residual after a rejection) and the draft's q left unmasked.
- Trees: an oracle tree accepts deep under the grammar (the bonus from a deep node's masked
  logits; the off-grammar branch never accepted).
- Bad guides (malformed schema, regex, EBNF; a grammar no token can start) are one line each;
  min_tokens and a missing stop token are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import specserve.runtime.step as step_module
from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.grammar import CompiledGuide, Guide, GuideCompiler
from specserve.runtime.model import load_model
from specserve.runtime.proposers import DraftModelProposer
from specserve.runtime.scheduler import Scheduler
from specserve.spec.grammar import bitmask_to_allowed, mask_logits, mask_probs
from tests.helpers.negative_control import skip_residual_sample
from tests.helpers.stats import chi2_p as _chi2_p
from tests.runtime.conftest import TinyModels, json_guide
from tests.runtime.test_distribution import PROMPT, N, V, _tiny
from tests.runtime.test_distribution import _proposer as _v8_proposer
from tests.runtime.test_scheduler import PROMPTS, TREE, _proposer

torch.set_num_threads(1)

# (not maxLength: xgrammar 0.2.8's bounded-length string rule admits raw control characters,
# which strict JSON forbids; a pattern keeps the answer short and strict)
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                         "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "ok", "n"]}
KINDS = ["draft_same", "draft_random", "ngram", "eagle3", "medusa", "eagle3_tree", "prediction"]
CHAINS = ["draft_random", "ngram", "eagle3"]
MAX = 64


def test_the_bitmask_layout_and_the_masking_math() -> None:
    words = torch.tensor([[0b101, 0], [-1, 1]], dtype=torch.int32)  # [2, W=2]
    allowed = bitmask_to_allowed(words, 34)  # [2, 34]
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert allowed[1].nonzero().flatten().tolist() == [*range(32), 32]  # bit 31 of -1 too
    logits = torch.arange(4.0)[None]  # [1, V=4]
    keep = torch.tensor([[True, False, True, False]])
    assert mask_logits(logits, keep).tolist() == [[0.0, float("-inf"), 2.0, float("-inf")]]
    q = torch.tensor([[0.1, 0.4, 0.3, 0.2]])
    assert torch.allclose(mask_probs(q, keep), torch.tensor([[0.25, 0.0, 0.75, 0.0]]))
    assert mask_probs(q, torch.zeros_like(keep)).sum() == 0  # no mass left: zeros, not NaN


@pytest.fixture(scope="module")
def guide(tiny_models: TinyModels, tok: Any) -> CompiledGuide:
    compiled: CompiledGuide = json_guide(tiny_models, tok, SCHEMA)
    return compiled


def _valid(tok: Any, ids: list[int]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(tok.decode(ids)), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _spec(m: TinyModels, kind: str) -> SpecDecoder:
    return SpecDecoder(m.target, _proposer("ngram" if kind == "prediction" else kind, m))


def _guided(tok: Any, guide: CompiledGuide, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, end_id=tok.eos_token_id, guide=guide, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_guided_rows_equal_plain_guided_decoding(tiny_models: TinyModels, tok: Any,
                                                        guide: CompiledGuide, kind: str) -> None:
    plain = SpecDecoder(tiny_models.target)
    want_g = [plain.generate([p], _guided(tok, guide))[0].token_ids for p in PROMPTS]
    want_u = [plain.generate([p], SamplingParams(max_tokens=12))[0].token_ids for p in PROMPTS]
    sch = Scheduler(_spec(tiny_models, kind), 4, 96)
    hs = []
    for i, p in enumerate(PROMPTS):  # guided and unguided rows in one batch
        pred = tuple(want_g[i][:8]) + tuple(want_g[(i + 1) % len(PROMPTS)])
        extra = {"prediction": pred} if kind == "prediction" else {}
        hs.append((sch.submit(p, _guided(tok, guide, **extra)),
                   sch.submit(p, SamplingParams(max_tokens=12))))
    sch.run_until_idle()
    drafted = 0
    for (g, u), wg, wu in zip(hs, want_g, want_u, strict=True):
        assert g.result is not None and u.result is not None
        assert g.result.token_ids == wg and g.result.finish_reason == "stop"
        assert _valid(tok, g.result.token_ids)
        assert u.result.token_ids == wu
        drafted += g.result.stats.draft_tokens
        if kind == "draft_same":  # the target as its own draft, drafting inside the grammar
            st = g.result.stats  # (unguided drafting: ~0 drafts survive the cut per step)
            assert st.draft_tokens >= 3 * st.steps and st.accepted_tokens >= 0.9 * st.draft_tokens
        if kind in ("medusa", "eagle3_tree"):  # every guided step verified the whole tree
            assert g.result.stats.draft_tokens == TREE.num_nodes * g.result.stats.steps
    assert drafted > 0  # guided rows really were speculative


class _NotInFlight:
    """What the test proposers here share: no target binding, no per-call state, not in flight."""

    aux_layers: tuple[int, ...] = ()  # no target layers read

    def slots(self) -> None:
        """Not served in flight (test proposers of whole generate calls)."""
        return None

    def bind(self, target: Any) -> None:
        pass

    def start(self, prompts: list[list[int]], max_len: int) -> None:
        pass

    def update(self, outcome: Any) -> None:
        pass


class _OracleTree(_NotInFlight):
    """A test tree proposer: along the branch [1], [1, 0], [1, 0, 0] of ``TREE`` it proposes
    the reference continuation (so tree steps accept several nodes and the bonus comes from a
    deep node's logits); every other node gets a token next to the reference's (mostly
    outside the grammar)."""

    name, max_draft_len, lookahead = "oracle_tree", TREE.depth, TREE.num_nodes

    def __init__(self, references: list[list[int]], vocab: int) -> None:
        from specserve.spec.tree import build_tree_buffers

        self.refs, self.vocab, self.buffers = references, vocab, build_tree_buffers(TREE)

    def get_proposal(self, request: Any) -> Any:
        from specserve.runtime.proposers import TreeProposal

        rows = []
        for seq, ref in zip(request.seqs, self.refs, strict=True):
            n, row = len(seq), [seq[-1]]
            for path in TREE.choices:
                want = ref[n + len(path) - 1] if n + len(path) - 1 < len(ref) else 0
                on = ref[:n] == seq and path[0] == 1 and not any(path[1:])
                row.append(want if on else (want + 1) % self.vocab)
            rows.append(row)
        return TreeProposal(torch.tensor(rows), self.buffers)


def test_a_tree_that_follows_the_grammar_is_accepted_deep(tiny_models: TinyModels, tok: Any,
                                                          guide: CompiledGuide) -> None:
    """Tree steps that accept several nodes: the bonus comes from a deep node's masked logits,
    the other branch's nodes (outside the grammar) are never accepted."""
    plain = SpecDecoder(tiny_models.target)
    want = [plain.generate([p], _guided(tok, guide))[0].token_ids for p in PROMPTS]
    refs = [p + w for p, w in zip(PROMPTS, want, strict=True)]
    dec = SpecDecoder(tiny_models.target, _OracleTree(refs, tiny_models.target.cfg.vocab_size))
    res = dec.generate(PROMPTS, [_guided(tok, guide) for _ in PROMPTS])
    assert [r.token_ids for r in res] == want
    assert all(_valid(tok, r.token_ids) for r in res)
    assert sum(r.stats.accepted_tokens for r in res) > 2 * sum(r.stats.steps for r in res)


def _sampled_validity(m: TinyModels, tok: Any, guide: CompiledGuide, kind: str,
                      n: int) -> None:
    dec = _spec(m, kind)
    params = [_guided(tok, guide, temperature=1.0, seed=s) for s in range(n)]
    res = dec.generate([PROMPTS[s % len(PROMPTS)] for s in range(n)], params)
    bad = [tok.decode(r.token_ids) for r in res if not _valid(tok, r.token_ids)]
    assert not bad, bad[:3]
    assert all(r.finish_reason == "stop" for r in res)


@pytest.mark.parametrize("kind", CHAINS)
def test_sampled_answers_are_valid_json(tiny_models: TinyModels, tok: Any,
                                        guide: CompiledGuide, kind: str) -> None:
    _sampled_validity(tiny_models, tok, guide, kind, 20)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS[:-1])
def test_200_sampled_answers_per_method_are_valid_json(tiny_models: TinyModels, tok: Any,
                                                       guide: CompiledGuide, kind: str) -> None:
    _sampled_validity(tiny_models, tok, guide, kind, 200)


# vocab 8: tokens 0-6 are "a".."g", 7 is the stop token "$"; the allowed set depends on the
# prefix (t1 in a-e; t2 in a-d after a, c-g after b, a-b after c-e; t3 any letter, no stop)
EBNF = 'root ::= ("a" [a-d] | "b" [c-g] | [c-e] [ab]) [a-g]+'
STOP = 7


def _v8_guide() -> CompiledGuide:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(list("abcdefg$"), xgr.VocabType.RAW, stop_token_ids=[STOP])
    return GuideCompiler.from_info(info, V).compile(Guide("ebnf_grammar", EBNF))


def constrained_next(hf: Any, guide: CompiledGuide, prefix: list[int]) -> torch.Tensor:
    """[V] the target's next-token distribution after PROMPT + ``prefix``, masked by the
    grammar (the exact reference of the chi-square tests)."""
    m = guide.matcher([STOP])
    for t in prefix:
        m.accept(t)
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT + prefix])).logits[0, -1]
    return mask_logits(logits, m.allowed()).softmax(-1).double()


def _exact_constrained(target_dir: Path, guide: CompiledGuide
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """P(t1, t2) [V, V] and P(t3) [V] of sampling from the target masked by the grammar."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), local_files_only=True).eval()

    def dist(prefix: list[int]) -> torch.Tensor:
        return constrained_next(hf, guide, prefix)

    p1 = dist([])
    joint = torch.zeros(V, V, dtype=torch.float64)
    p3 = torch.zeros(V, dtype=torch.float64)
    for a in p1.nonzero().flatten().tolist():
        p2 = dist([a])
        joint[a] = p1[a] * p2
        for b in p2.nonzero().flatten().tolist():
            p3 += joint[a, b] * dist([a, b])
    return joint, p3


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vocab8_grammar")
    _tiny(root / "draft", 1)
    return _tiny(root / "target", 0)


def _chi2_both(target_dir: Path, kind: str) -> float:
    guide = _v8_guide()
    target = load_model(target_dir)
    prop: Any = (_FixedQ() if kind == "fixed_q" else
                 DraftModelProposer(load_model(target_dir.parent / "draft"), max_draft_len=2)
                 if kind == "draft" else _v8_proposer(kind, target_dir.parent / "draft", target))
    dec = SpecDecoder(target, prop)
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=s, end_id=STOP, guide=guide)
              for s in range(N)]
    res = dec.generate([PROMPT] * N, params)
    drafted = sum(r.stats.draft_tokens for r in res)
    rejected = drafted - sum(r.stats.accepted_tokens for r in res)
    assert drafted > N // 4 and rejected > N // 10  # drafts survive the cut, many rejected
    toks = torch.tensor([r.token_ids[:3] for r in res])  # [N, 3] (no stop before t4)
    joint, p3 = _exact_constrained(target_dir, guide)
    c12 = torch.bincount(toks[:, 0] * V + toks[:, 1], minlength=V * V).double()
    c3 = torch.bincount(toks[:, 2], minlength=V).double()
    return min(_chi2_p(c12, joint), _chi2_p(c3, p3))


# q of _FixedQ: peaked on "a" and "g", so the grammar often cuts (g after a, c-e) and the cut
# drafts' renormalized q differs from q inside the allowed set
FIXED_Q = torch.tensor([0.45, 0.05, 0.05, 0.05, 0.05, 0.05, 0.25, 0.05])


class _FixedQ(_NotInFlight):
    """A test chain proposer: 2 drafts per step, each drawn from FIXED_Q with the row's own
    generator (q reported as probs), whatever the context."""

    name, max_draft_len, lookahead = "fixed_q", 2, 2

    def get_proposal(self, request: Any) -> Any:
        from specserve.runtime.proposers import ChainProposal

        b = len(request.seqs)
        toks = torch.zeros(b, 2, dtype=torch.long)
        for i, g in enumerate(request.generators):
            if request.limits[i]:
                toks[i] = torch.multinomial(FIXED_Q, 2, replacement=True, generator=g)
        probs = FIXED_Q.expand(b, 2, V).clone()  # [B, 2, V]
        return ChainProposal(toks, [min(2, k) for k in request.limits], probs)


@pytest.mark.parametrize("kind", ["draft", "eagle3", "fixed_q",
                                  pytest.param("medusa", marks=pytest.mark.slow)])
def test_guided_requests_follow_the_constrained_distribution(vocab8: Path, kind: str) -> None:
    assert _chi2_both(vocab8, kind) > 1e-3


def test_the_negative_control_fails_the_same_test(vocab8: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """EAGLE-3's chain: most of its drafts pass the grammar, so many rejections reach the
    residual step (p ~ 1e-97 here; the draft model's fewer surviving drafts give 3e-3)."""
    monkeypatch.setattr(step_module, "rejection_sample", skip_residual_sample)
    assert _chi2_both(vocab8, "eagle3") < 1e-3


def test_an_unmasked_draft_q_fails_the_same_test(vocab8: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Power against the fault the renormalization guards: cut drafts verified against the
    draft's unmasked q over-accept (p ~ 1e-76 here, 0.57 with the masked q)."""
    from specserve.runtime.grammar import GuidedStep

    monkeypatch.setattr(GuidedStep, "mask_q", lambda self, q: q)
    assert _chi2_both(vocab8, "fixed_q") < 1e-3


@pytest.mark.parametrize(("kind", "text", "msg"), [
    ("json_schema", "{bad", "the JSON schema is not JSON"),
    ("json_schema", '{"type": "nonsense"}', r'\(json_schema\): Unsupported type "nonsense"'),
    ("regex", "(ab", r"\(regex\): Regex parsing error at position 4"),
    ("ebnf_grammar", "root ::= ", r"\(ebnf_grammar\): EBNF parser error at line 1"),
    ("yaml", "a: 1", "guided_decoding_guide_type must be one of"),
    ("regex", "", "guided_decoding_guide is empty"),
])
def test_bad_guides_are_one_line(tiny_models: TinyModels, tok: Any, kind: str, text: str,
                                 msg: str) -> None:
    comp = GuideCompiler(tok, tiny_models.target.cfg.vocab_size, [tok.eos_token_id])
    with pytest.raises(SpecserveError, match=msg) as e:
        comp.compile(Guide(kind, text))
    assert "\n" not in str(e.value) and "/project/" not in str(e.value)


def test_a_grammar_the_vocabulary_cannot_express_is_refused() -> None:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(list("abcdefg$"), xgr.VocabType.RAW, stop_token_ids=[STOP])
    with pytest.raises(SpecserveError, match="no token of the model's vocabulary can start"):
        GuideCompiler.from_info(info, V).compile(Guide("regex", "zz"))


def test_min_tokens_and_no_stop_token_are_refused(tok: Any, guide: CompiledGuide) -> None:
    with pytest.raises(SpecserveError, match="min_tokens cannot be combined"):
        SamplingParams(max_tokens=8, min_tokens=2, end_id=tok.eos_token_id,
                       guide=guide).validate()
    with pytest.raises(SpecserveError, match="needs a stop token"):
        SamplingParams(max_tokens=8, guide=guide).validate()
