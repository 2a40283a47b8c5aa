"""EAGLE-3 heads (specserve.runtime.eagle3, proposers/eagle3.py): the training-time test equals
the cached inference path step by step; the portable directory round-trips and bad heads are
refused in one line; speculation with a head is lossless (greedy equality with plain decoding
and with HF generate(), batch 1 and 4; the T = 1 chi-square lives in test_distribution.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head, ttt_forward
from specserve.runtime.eagle3_dir import load_eagle3, save_eagle3
from specserve.runtime.model import Transformer
from specserve.runtime.proposers.base import (
    ChainProposal,
    ProposalRequest,
    StepOutcome,
    TreeProposal,
)
from specserve.runtime.proposers.eagle3 import Eagle3Proposer
from specserve.spec.tree import MedusaTree
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39],
           [7, 100, 7, 100]]
# a static tree: ranks 0-2 at depth 1, two branches below, a depth-4 spine
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0]]


def random_head(target: Transformer, seed: int = 0, draft_vocab: int | None = None,
                scale: float = 0.3) -> Eagle3Head:
    """A random head for ``target`` over a random draft vocabulary of ``draft_vocab`` ids (half
    the target's by default; so d2t is not all zero)."""
    v = target.cfg.vocab_size
    dv = draft_vocab or v // 2
    head = Eagle3Head(Eagle3Config.for_target(target.cfg, dv))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        ids = torch.randperm(v, generator=g)[:dv].sort().values  # the draft vocabulary
        head.d2t.copy_(ids - torch.arange(dv))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head


def _aux(target: Transformer, head: Eagle3Head, tokens: list[int]) -> torch.Tensor:
    cache = target.new_cache(1, 64)
    with torch.inference_mode():
        aux = target.run(torch.tensor([tokens]), cache, capture=head.cfg.aux_layer_ids).aux
    assert aux is not None
    return aux  # [1, N, n*H]


def test_training_time_test_equals_the_cached_inference_path(tiny_models: TinyModels) -> None:
    target = tiny_models.target
    head = random_head(target)
    head.bind(target.embed.weight)
    toks = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    aux = _aux(target, head, toks)
    n, steps = len(toks), 3
    with torch.inference_mode():
        ttt = ttt_forward(head, aux, torch.tensor([toks]), steps)  # steps x [1, N, Vd]
        for t in range(n - steps - 1):  # inference: step 0 over 0..t, then own features
            cache = head.new_cache(1, 64)
            out = head(torch.tensor([toks[1:t + 2]]), head.fuse(aux[:, :t + 1]), cache)
            cache.lengths = [t + 1]
            feat = out[:, -1:]
            for j in range(steps):
                want = ttt[j][0, t]
                got = head.draft_logits(feat)[0, 0]
                assert torch.allclose(got, want, atol=1e-4), (t, j)
                feat = head(torch.tensor([[toks[t + j + 2]]]), feat, cache)
                cache.lengths = [cache.lengths[0] + 1]


def test_the_portable_directory_round_trips(tiny_models: TinyModels, tmp_path: Path) -> None:
    target = tiny_models.target
    head = random_head(target, seed=1)
    d = save_eagle3(head, tmp_path / "eagle3")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(
        head.cfg.aux_layer_ids)
    from safetensors import safe_open
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
            "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight"} <= names
    back = load_eagle3(d, target.cfg)
    for (k, a), (k2, b) in zip(head.state_dict().items(), back.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b), k


def test_a_head_over_the_whole_vocabulary_has_no_maps(tiny_models: TinyModels,
                                                      tmp_path: Path) -> None:
    """vLLM 0.32 refuses d2t when draft_vocab_size == vocab_size: none is written, and the
    identity map is read back."""
    target = tiny_models.target
    v = target.cfg.vocab_size
    head = random_head(target, seed=5, draft_vocab=v)
    with torch.no_grad():
        head.d2t.zero_()
    d = save_eagle3(head, tmp_path / "full")
    from safetensors import safe_open
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert "d2t" not in set(f.keys()) and "t2d" not in set(f.keys())
    back = load_eagle3(d, target.cfg)
    assert torch.equal(back.target_ids(), torch.arange(v))


def _write_bad(tmp_path: Path, target: Transformer, edit_cfg: dict | None = None,
               drop: str | None = None) -> Path:
    d = save_eagle3(random_head(target), tmp_path / "bad")
    if edit_cfg:
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(edit_cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if drop:
        from safetensors.torch import load_file, save_file
        sd = load_file(str(d / "model.safetensors"))
        del sd[drop]
        save_file(sd, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("edit,drop,match", [
    ({"architectures": ["LlamaForCausalLMEagle"]}, None, "EAGLE-1/2 checkpoint"),
    ({"hidden_size": 32, "target_hidden_size": 32}, None, "hidden size 32"),
    ({"vocab_size": 999}, None, "vocabularies must match"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}}, None, r"ids \[9\]"),
    ({"eagle_config": {}}, None, "eagle_aux_hidden_state_layer_ids"),
    (None, "d2t", "missing d2t"),
])
def test_a_head_that_does_not_fit_is_refused_in_one_line(
        tiny_models: TinyModels, tmp_path: Path, edit: dict | None, drop: str | None,
        match: str) -> None:
    d = _write_bad(tmp_path, tiny_models.target, edit, drop)
    with pytest.raises(SpecserveError, match=match) as e:
        load_eagle3(d, tiny_models.target.cfg)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculation_equals_plain_decoding_and_hf(tiny_models: TinyModels,
                                                         batch: int) -> None:
    from transformers import AutoModelForCausalLM

    prompts = PROMPTS[:batch]
    params = SamplingParams(max_tokens=20)
    plain = SpecDecoder(tiny_models.target).generate(prompts, params)
    for scale in (0.3, 0.05):  # two random heads
        head = random_head(tiny_models.target_copy, seed=2, scale=scale)
        dec = SpecDecoder(tiny_models.target_copy, Eagle3Proposer(head, max_draft_len=3))
        got = dec.generate(prompts, params)
        assert [r.token_ids for r in got] == [r.token_ids for r in plain]
        assert sum(r.stats.draft_tokens for r in got) > 0
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_models.ckpt.target),
                                              local_files_only=True).eval()
    with torch.inference_mode():
        for p, r in zip(prompts, plain, strict=True):
            ids = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
            assert ids[0, len(p):].tolist() == got[prompts.index(p)].token_ids == r.token_ids


def test_each_first_draft_is_the_heads_prediction_from_the_target_states(
        tiny_models: TinyModels) -> None:
    """The proposer's bookkeeping (which target states, which next tokens, which positions):
    at every step, row b's first draft equals the step-0 prediction of :func:`ttt_forward`
    over its final sequence at the position before its pending token."""
    target = tiny_models.target_copy
    head = random_head(target, seed=3, scale=0.3)
    prop = Eagle3Proposer(head, max_draft_len=3)
    dec = SpecDecoder(target, prop)
    calls: list[tuple[list[int], list[int], list[int]]] = []
    inner = prop.propose

    def recording(seqs, limits, params, gens):  # type: ignore[no-untyped-def]
        out = inner(seqs, limits, params, gens)
        calls.append(([len(s) for s in seqs], list(limits), out.tokens[:, 0].tolist()))
        return out

    prop.propose = recording  # type: ignore[method-assign]
    prompts = PROMPTS[:3]
    res = dec.generate(prompts, SamplingParams(max_tokens=16))
    ids = head.target_ids()
    checked = 0
    for b, (p, r) in enumerate(zip(prompts, res, strict=True)):
        seq = p + r.token_ids
        aux = _aux(target, head, seq[:-1])
        with torch.inference_mode():
            step0 = ttt_forward(head, aux, torch.tensor([seq[:-1]]), 1)[0][0]  # [N, Vd]
        for lens, limits, first in calls:
            if limits[b] > 0:
                assert first[b] == int(ids[step0[lens[b] - 2].argmax()]), (b, lens[b])
                checked += 1
    assert checked >= 10



def test_the_heads_fc_runs_at_most_once_a_step_and_never_without_drafts(
        tiny_models: TinyModels) -> None:
    """The FC that fuses the captured target states reads its weight at most once a step
    whatever the batch (one ``fuse`` call for every row's pending states, not one per row),
    and not at all while no step drafts (``num_draft_tokens = 0``): the states wait."""
    target = tiny_models.target_copy
    head = random_head(target, seed=3, scale=0.3)
    calls: list[int] = []
    inner = head.fuse

    def counting(aux: torch.Tensor) -> torch.Tensor:
        calls.append(aux.shape[0])
        return inner(aux)

    head.fuse = counting  # type: ignore[method-assign]
    dec = SpecDecoder(target, Eagle3Proposer(head, max_draft_len=3))
    res = dec.generate(PROMPTS[:4], SamplingParams(max_tokens=12))
    steps = max(r.stats.steps for r in res)
    assert 1 <= len(calls) <= steps, (steps, calls)
    calls.clear()
    dec.generate(PROMPTS[:4], SamplingParams(max_tokens=12, num_draft_tokens=0))
    assert calls == []


def test_a_qwen3_target_with_its_own_head_dim_decodes_losslessly(
        tiny_models: TinyModels, tmp_path: Path) -> None:
    """Qwen3 (q/k norms, head_dim 16 != hidden 48 / 4 heads), the family most public EAGLE-3
    heads are trained for: the head takes the target's head_dim; greedy equals plain."""
    from specserve.runtime.model import load_model
    from tests.helpers.tiny import make_qwen3

    target = load_model(make_qwen3(tmp_path / "qwen3", tiny_models.ckpt.tokenizer))
    head = random_head(target, seed=6, scale=0.2)
    assert head.cfg.head_dim == 16 and head.cfg.hidden_size == 48
    params = SamplingParams(max_tokens=16)
    plain = SpecDecoder(target).generate(PROMPTS[:2], params)
    got = SpecDecoder(target, Eagle3Proposer(head, max_draft_len=3)).generate(PROMPTS[:2], params)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    assert sum(r.stats.draft_tokens for r in got) > 0


@pytest.mark.parametrize("batch", [1, 4])
def test_a_static_tree_equals_plain_decoding(tiny_models: TinyModels, batch: int) -> None:
    """Greedy decoding with the tree keeps plain decoding's tokens (batch 1 and 4, rows at
    different lengths) and accepts more than one draft per step somewhere."""
    prompts = PROMPTS[:batch]
    params = SamplingParams(max_tokens=20)
    plain = SpecDecoder(tiny_models.target).generate(prompts, params)
    for scale in (0.3, 0.05):
        head = random_head(tiny_models.target_copy, seed=2, scale=scale)
        got = SpecDecoder(tiny_models.target_copy, Eagle3Proposer(head, choices=TREE)).generate(
            prompts, params)
        assert [r.token_ids for r in got] == [r.token_ids for r in plain]
        assert sum(r.stats.draft_tokens for r in got) == sum(r.stats.steps for r in got) * len(TREE)


@pytest.mark.parametrize("batch", [1, 3])  # one offset for the batch (views, spine levels
def test_each_tree_node_is_the_heads_ranked_draft_after_its_path(  # unmasked) / per-row ones
        tiny_models: TinyModels, batch: int) -> None:
    """The tree's levels (which feature, position, cache slots and mask each node gets): node
    p = [r1, .., rd] holds rank rd of the head's distribution after the drafts of its ancestors,
    as the training-time test computes it over the context followed by those drafts."""
    target = tiny_models.target_copy
    head = random_head(target, seed=3, scale=0.3)
    prop = Eagle3Proposer(head, choices=TREE)
    calls: list[tuple[list[list[int]], list[list[int]]]] = []
    inner = prop.tree_tokens

    def recording(seqs, levels, topk):  # type: ignore[no-untyped-def]
        out = inner(seqs, levels, topk)
        calls.append(([list(s) for s in seqs], out.tolist()))
        return out

    prop.tree_tokens = recording  # type: ignore[method-assign]
    SpecDecoder(target, prop).generate(PROMPTS[:batch], SamplingParams(max_tokens=12))
    tree, ids, checked = MedusaTree.from_choices(TREE), head.target_ids(), 0
    index = {p: i + 1 for i, p in enumerate(tree.choices)}
    for seqs, tokens in calls[:4]:
        for seq, toks in zip(seqs, tokens, strict=True):
            for path in tree.choices:
                drafts = [toks[index[path[:d]]] for d in range(1, len(path))]
                ext = seq + drafts
                with torch.inference_mode():
                    step = ttt_forward(head, _aux(target, head, ext), torch.tensor([ext]),
                                       len(path))[len(path) - 1][0, len(seq) - 2]  # [Vd]
                want = step.topk(path[-1] + 1).values[-1]
                got = step[(ids == toks[index[path]]).nonzero()[0, 0]]
                assert abs(float(got - want)) < 1e-4, (seq, path)
                checked += 1
    assert checked == 4 * batch * len(TREE)


def test_a_tree_proposer_gives_sampled_batches_the_chain(tiny_models: TinyModels) -> None:
    """Trees are verified greedily; a batch with a sampled row gets the lossless chain (q =
    the head's probabilities) of the tree's depth, and a schedule's budget cuts the tree."""
    target = tiny_models.target_copy
    prop = Eagle3Proposer(random_head(target, seed=5), choices=TREE)
    greedy, hot = SamplingParams(max_tokens=8), SamplingParams(max_tokens=8, temperature=1.0)
    g = [torch.Generator().manual_seed(0)]
    assert prop.max_draft_len == 4 and prop.lookahead == len(TREE)
    with torch.inference_mode():  # the proposer's state: after a 3-token generation
        out = SpecDecoder(target, prop).generate([PROMPTS[0]], SamplingParams(max_tokens=3))
        seqs = [list(PROMPTS[0]) + out[0].token_ids]
        tree = prop.get_proposal(ProposalRequest(seqs, [4], [greedy], g))
        chain = prop.get_proposal(ProposalRequest(seqs, [4], [hot], g))
        cut = prop.get_proposal(ProposalRequest(seqs, [4], [greedy], g, tree_budget=4))
    assert isinstance(tree, TreeProposal) and tree.tokens.shape == (1, len(TREE) + 1)
    assert isinstance(chain, ChainProposal) and chain.probs is not None
    assert chain.tokens.shape == (1, 4)
    assert isinstance(cut, TreeProposal) and cut.tokens.shape == (1, 5)


def test_after_a_tree_step_the_head_gets_the_kept_paths_states_in_order(
        tiny_models: TinyModels) -> None:
    """A tree step keeps nodes [0, 2, 5] (root, then two accepted drafts): the head's pending
    features are the fused target states of exactly those nodes, in path order."""
    target = tiny_models.target_copy
    head = random_head(target, seed=6)
    prop = Eagle3Proposer(head, choices=TREE)
    prop.bind(target)
    prompt, width = PROMPTS[0], len(head.cfg.aux_layer_ids) * target.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    prop.start([prompt], 64)
    with torch.inference_mode():
        prefill = torch.randn(1, len(prompt), width, generator=g)
        prop.update(StepOutcome(torch.zeros(1, len(prompt), 1), [len(prompt) - 1], [0],
                                [prompt + [9]], aux=prefill))
        assert torch.equal(prop.pending_features(0), head.fuse(prefill[0]))
        assert prop.cache is not None
        prop.cache.lengths, prop.feats = [len(prompt)], [None]  # as after a catch-up
        aux = torch.randn(1, len(TREE) + 1, width, generator=g)
        prop.update(StepOutcome(torch.zeros(1, len(TREE) + 1, 1), [5], [2],
                                [prompt + [9, 40, 41, 42]], paths=[[0, 2, 5]], aux=aux))
        assert torch.equal(prop.pending_features(0), head.fuse(aux[0, [0, 2, 5]]))


def test_a_backlog_is_reported_and_its_catch_up_timed_apart(tiny_models: TinyModels) -> None:
    """After a prefill the head is a prompt behind: ``backlog`` counts what the next proposal
    feeds beyond one step's kept tokens, that proposal's catch-up seconds go to
    ``catch_up_s``, and the next step, one step behind, has neither."""
    target = tiny_models.target_copy
    head = random_head(target, seed=7)
    prop = Eagle3Proposer(head, max_draft_len=2)
    prop.bind(target)
    prompt, width = PROMPTS[2], len(head.cfg.aux_layer_ids) * target.cfg.hidden_size
    g = [torch.Generator().manual_seed(0)]
    prop.start([prompt], 64)
    with torch.inference_mode():
        aux = torch.randn(1, len(prompt), width, generator=g[0])
        prop.update(StepOutcome(torch.zeros(1, len(prompt), 1), [len(prompt) - 1], [0],
                                [prompt + [9]], aux=aux))
        assert prop.backlog() == len(prompt) - prop.lookahead - 1
        prop.propose([prompt + [9]], [2], [SamplingParams()], g)
        assert prop.backlog() == 0 and prop.catch_up_s > 0
        step = torch.randn(1, 3, width, generator=g[0])  # a verify of 2 drafts, one kept
        prop.update(StepOutcome(torch.zeros(1, 3, 1), [1], [1], [prompt + [9, 4, 5]], aux=step))
        assert prop.backlog() == 0
        prop.propose([prompt + [9, 4, 5]], [2], [SamplingParams()], g)
        assert prop.catch_up_s == 0.0


def test_a_long_newcomer_beside_a_long_row_fits_the_head_cache(tiny_models: TinyModels) -> None:
    """The head's catch-up pads every row to the newcomer's whole prompt: a row near max_len
    beside a 40-token newcomer overflowed the head's cache (in flight, c = 16 on the real
    model); outputs stay those of each request alone."""
    from specserve.runtime.scheduler import Scheduler

    def proposer() -> Eagle3Proposer:
        return Eagle3Proposer(random_head(tiny_models.target, seed=4, scale=0.05),
                              max_draft_len=4)

    sch = Scheduler(SpecDecoder(tiny_models.target, proposer()), 2, max_len=64)
    long = sch.submit([5] * 4, SamplingParams(max_tokens=58))
    for _ in range(40):
        sch.step()
    late = sch.submit(list(range(10, 50)), SamplingParams(max_tokens=4))
    sch.run_until_idle()
    alone = SpecDecoder(tiny_models.target, proposer())
    for h, (p, n) in ((long, ([5] * 4, 58)), (late, (list(range(10, 50)), 4))):
        assert h.result is not None
        assert h.result.token_ids == alone.generate([p], SamplingParams(max_tokens=n))[0].token_ids


def test_a_newcomers_backlog_does_not_pad_the_running_rows(tiny_models: TinyModels) -> None:
    """In flight, three rows one step behind and a newcomer with a 40-token prompt: the next
    proposal feeds the head at most 1.5x the pending positions (one padded forward fed 4 x 40
    for 43), and every request's tokens are its own alone."""
    from specserve.runtime.scheduler import Scheduler

    m = tiny_models.target
    head = random_head(m, seed=4, scale=0.05)
    prop = Eagle3Proposer(head, max_draft_len=3)
    sch = Scheduler(SpecDecoder(m, prop), 4, max_len=96)
    prompts = [[5, 6, 7], [20, 21, 22], [30, 31], [(7 * i) % 90 + 3 for i in range(40)]]
    p = SamplingParams(max_tokens=12)
    handles = [sch.submit(x, p) for x in prompts[:3]]
    for _ in range(3):
        sch.step()
    fed: list[tuple[int, int]] = []
    forward = head.forward

    def counted(tokens: torch.Tensor, *a: object, **kw: object) -> torch.Tensor:
        fed.append((tokens.shape[0], tokens.shape[1]))  # [B, T] of every head forward
        return forward(tokens, *a, **kw)  # type: ignore[arg-type]

    handles.append(sch.submit(prompts[3], p))
    head.forward = counted  # type: ignore[method-assign]
    try:
        sch.step()  # the newcomer joins (its prompt the head's backlog) and every row drafts
    finally:
        del head.forward
    catch_up = [b * t for b, t in fed if t > 1]
    assert catch_up and sum(catch_up) <= 1.5 * (len(prompts[3]) + 3 * 2), fed
    sch.run_until_idle()
    alone = SpecDecoder(m, Eagle3Proposer(head, max_draft_len=3))
    assert [h.result.token_ids for h in handles if h.result] == [
        alone.generate([x], p)[0].token_ids for x in prompts]
