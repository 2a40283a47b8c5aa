"""Qwen3 (dense) in the reference decoder against transformers' own ``Qwen3ForCausalLM``.

Random tiny checkpoints saved by transformers (``tests.helpers.tiny.make_qwen3``: head_dim 16 with
hidden 48 / 4 heads, GQA 4:2, noisy q_norm/k_norm): logits within 1e-4 of HF's forward with the
prompt prefilled in two chunks; greedy output equal to HF ``generate()`` for plain decoding, a
smaller Qwen3 draft, the target as its own draft, n-gram lookup and random Medusa heads; the tree
forward and the oneDNN/CPU layouts; a torch engine (the Triton model's loading path); ``specserve
predict``'s parameter count; and the one-line refusals of families we do not run.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.checkpoint import load_target_config
from specserve.runtime.decoder import SpecDecoder
from specserve.runtime.loader import build_decoder
from specserve.runtime.model import load_model
from specserve.runtime.params import SamplingParams
from specserve.spec.tree import MedusaTree, build_tree_buffers
from tests.helpers.tiny import TinyCheckpoint, make_medusa_heads, make_qwen3
from tests.runtime.test_model import _hf_logits, _ours_logits, _three_steps

torch.set_num_threads(1)

NEW_TOKENS = 16
TEXTS = ["def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n    print(i",
         "import os\nimport sys\n\nimport os\nimport"]


@dataclass(frozen=True)
class Qwen3Set:
    target: Path
    draft: Path  # a smaller Qwen3 on the same tokenizer (1 layer, hidden 32, head_dim 8)
    medusa: Path
    prompts: list[list[int]]


@pytest.fixture(scope="module")
def qwen3(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Qwen3Set:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("qwen3")
    target = make_qwen3(root / "target", tiny_ckpt.tokenizer, seed=3)
    draft = make_qwen3(root / "draft", tiny_ckpt.tokenizer, hidden_size=32, layers=1, heads=2,
                       kv_heads=1, head_dim=8, seed=4)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    medusa = make_medusa_heads(root / "medusa", 48, vocab, num_heads=3, seed=5)
    tok = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
    return Qwen3Set(target, draft, medusa, [list(tok(t)["input_ids"]) for t in TEXTS])


def _hf_generate(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def hf_greedy(qwen3: Qwen3Set) -> list[list[int]]:
    return _hf_generate(qwen3.target, qwen3.prompts)


@pytest.mark.parametrize("kw", [
    {},
    {"attention_bias": True},  # q/k/v/o biases (Qwen3Config allows them)
    {"tie_word_embeddings": True, "rope_theta": 1e6, "rms_norm_eps": 1e-5},  # as Qwen3-0.6B
])
def test_logits_match_hf(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                         kw: dict[str, object]) -> None:
    d = make_qwen3(tmp_path / "q", tiny_ckpt.tokenizer, seed=6, **kw)
    cfg = load_model(d).cfg
    assert cfg.qk_norm and cfg.head_dim == 16 != cfg.hidden_size // cfg.num_heads
    ids = torch.randint(0, cfg.vocab_size, (2, 29), generator=torch.Generator().manual_seed(7))
    ours, ref = _ours_logits(d, ids, 17), _hf_logits(d, ids)
    assert (ours - ref).abs().max() < 1e-4


@pytest.mark.parametrize("mode", ["plain", "draft", "self_draft", "ngram", "medusa"])
def test_greedy_equals_hf_generate(qwen3: Qwen3Set, hf_greedy: list[list[int]],
                                   mode: str) -> None:
    kw: dict[str, object] = {
        "plain": {}, "draft": {"draft_dir": qwen3.draft}, "self_draft": {"draft_dir": qwen3.target},
        "ngram": {"ngram": True}, "medusa": {"medusa_dir": qwen3.medusa}}[mode]
    dec = build_decoder(qwen3.target, max_draft_len=4, **kw)  # type: ignore[arg-type]
    res = dec.generate(qwen3.prompts, SamplingParams(max_tokens=NEW_TOKENS))  # one batch
    assert [r.token_ids for r in res] == hf_greedy
    drafted = sum(r.stats.draft_tokens for r in res)
    assert (drafted > 0) == (mode != "plain"), drafted
    if mode == "self_draft":  # the target as its own draft: every draft token is accepted
        assert all(r.stats.accepted_tokens == r.stats.draft_tokens for r in res)


def test_tree_forward_equals_each_path(qwen3: Qwen3Set) -> None:
    m = load_model(qwen3.target).decode_layout(multi_row_min=0)
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    buf = build_tree_buffers(tree)
    prompt = torch.tensor([qwen3.prompts[0]])
    nodes = torch.randint(0, m.cfg.vocab_size, (1, tree.num_nodes + 1),
                          generator=torch.Generator().manual_seed(8))
    n = prompt.shape[1]
    with torch.inference_mode():
        cache = m.new_cache(1, 64)
        m(prompt, cache)
        cache.lengths = [n]
        got = m.logits(m(nodes, cache, torch.tensor([n]), buf.position_ids, buf.attn_mask))[0]
        for i in range(tree.num_nodes + 1):
            path = [j for j in range(i + 1) if bool(buf.attn_mask[i, j])]
            seq = torch.cat([prompt[0], nodes[0, path]])[None]
            ref = m.logits(m(seq, m.new_cache(1, 64)))[0, -1]
            assert torch.allclose(got[i], ref, atol=1e-5), i


def test_cpu_layouts_give_the_same_logits(qwen3: Qwen3Set, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32: the prepacked multi-row copies within float32 rounding of the plain weights; bf16:
    prepacked weights bit for bit equal to F.linear on plain bf16 weights. fp32 as without the
    few-row kernel (test_cpu_linear_kernel.py checks that one)."""
    from specserve.runtime import cpu_linear
    from specserve.runtime.cpu_linear import can_prepack

    monkeypatch.setattr(cpu_linear, "_loaded", [None])

    tree = build_tree_buffers(MedusaTree.from_choices([[0], [1], [0, 0]]))
    g = torch.Generator().manual_seed(9)
    inputs = [torch.randint(0, 200, (2, n), generator=g) for n in (7, 1, 4)]
    plain32 = load_model(qwen3.target)
    dual32 = load_model(qwen3.target).decode_layout(multi_row_min=0)
    assert dual32.layers[0].attn.qkv.multi_row is not None  # type: ignore[union-attr]
    for a, b in zip(_three_steps(dual32, *inputs, tree), _three_steps(plain32, *inputs, tree),
                    strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    if not can_prepack(torch.bfloat16):
        pytest.skip("this torch build has no oneDNN bf16")
    packed = load_model(qwen3.target, dtype=torch.bfloat16)
    assert packed.layers[0].attn.qkv.weight.is_mkldnn  # type: ignore[union-attr]
    plain = load_model(qwen3.target).to(torch.bfloat16)
    plain.inv_freq = plain.inv_freq.float()
    for a, b in zip(_three_steps(packed, *inputs, tree), _three_steps(plain, *inputs, tree),
                    strict=True):
        assert torch.equal(a, b)


def test_torch_engine_serves_like_hf(qwen3: Qwen3Set, hf_greedy: list[list[int]],
                                     tmp_path: Path) -> None:
    """``specserve build --backend torch`` then :func:`specserve.runtime.engine.load_engine`, the
    loader of the Triton model (``serving/engine.py: load_decoder``)."""
    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig
    from specserve.runtime.engine import load_engine

    eng = tmp_path / "eng"
    build_engine(BuildConfig(model=str(qwen3.target), out=str(eng), spec_mode="draft",
                             draft=str(qwen3.draft), backend="torch", dtype="float32",
                             max_draft_len=3))
    loaded = load_engine(eng)
    assert loaded.decoder.spec_mode == "draft"
    res = loaded.decoder.generate(qwen3.prompts[:2], SamplingParams(max_tokens=NEW_TOKENS))
    assert [r.token_ids for r in res] == hf_greedy[:2]


@pytest.mark.parametrize("tied", [False, True])
def test_predict_param_count_equals_transformers(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                                 tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    from specserve.predict import PredictConfig, predict

    d = make_qwen3(tmp_path / "q", tiny_ckpt.tokenizer, tie_word_embeddings=tied,
                   attention_bias=not tied)
    hf = AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True)
    want = sum(p.numel() for p in hf.parameters())
    assert predict(PredictConfig(config=str(d)))["model"]["params"] == want


def _edited(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        cfg.pop(key)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8},
     "model_type 'qwen3_moe' not supported"),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]},
     "model_type 'mixtral' not supported"),
    ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]},
     "model_type 'gemma2' not supported"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
      "layer_types": None}, r"sliding-window attention \(sliding_window 8\) on layers 1..1 of 2, "
     "mixed with full attention, is not supported"),
    ({"use_sliding_window": True, "sliding_window": 8,
      "layer_types": ["sliding_attention", "full_attention"]}, "layers 0..0 of 2, mixed"),
    ({"layer_types": ["full_attention", "sliding_attention"]},  # transformers cannot run it
     "on layers 1..1 of 2, mixed"),
    ({"layer_types": ["full_attention", "linear_attention"]},
     r"layer_types \['linear_attention'\] not supported"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0,
      "layer_types": None}, "layers 0..1 of 2, on every layer"),
])
def test_unsupported_families_are_one_line(qwen3: Qwen3Set, tmp_path: Path,
                                           changes: dict[str, object], message: str) -> None:
    from specserve.build.validate import validate_target

    d = _edited(qwen3.target, tmp_path / "m", **changes)
    arch = f"architecture '{changes.get('architectures', [''])[0]}' is not supported"  # type: ignore[index]
    for check, want in ((load_target_config, message), (load_model, message),
                        (validate_target, arch if "architectures" in changes else message)):
        with pytest.raises(SpecserveError, match=want) as err:
            check(d)
        assert "\n" not in str(err.value) and str(err.value).startswith(str(d / "config.json"))


# --- every family the README lists, every method, against HF generate() ----------------------

FAMILIES = {
    "Llama": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "Mistral": {"rope_theta": 5e5},
    "Qwen2": {"tie_word_embeddings": True, "rope_theta": 1e6},
    "Qwen3": {"head_dim": 16, "rms_norm_eps": 1e-5},
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_every_family_every_method_equals_hf_generate(tmp_path: Path, arch: str) -> None:
    """The torch column of the README's family table: plain, draft (the model as its own draft),
    n-gram and random Medusa heads give HF's greedy tokens, 3 prompts in one batch."""
    from specserve.runtime.checkpoint import load_medusa_heads
    from specserve.runtime.proposers import DraftModelProposer, MedusaProposer, NgramProposer
    from tests.runtime.test_model import _save_hf

    # hidden 32, vocab 97, GQA 4:1; no EOS id: HF generates all NEW_TOKENS as we do
    d = _save_hf(tmp_path, arch, eos_token_id=None, **FAMILIES[arch])
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 11, 8)]
    prompts[2] = prompts[2][:4] * 2  # a repeat for n-gram lookup to find
    want = _hf_generate(d, prompts)
    heads = load_medusa_heads(make_medusa_heads(tmp_path / "heads", 32, 97, num_heads=3), 32, 97)
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    target = load_model(d)
    for proposer in (None, DraftModelProposer(load_model(d), 3), NgramProposer(3),
                     MedusaProposer(heads, tree)):
        res = SpecDecoder(target, proposer).generate(prompts,
                                                     SamplingParams(max_tokens=NEW_TOKENS))
        assert [r.token_ids for r in res] == want, (arch, type(proposer).__name__)
        assert (sum(r.stats.draft_tokens for r in res) > 0) == (proposer is not None)
