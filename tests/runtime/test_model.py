"""Our Llama-family forward against Hugging Face, per-row cache lengths, and tree attention."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.runtime.model import load_model
from specserve.spec.tree import MedusaTree, build_tree_buffers
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)


def _hf_logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    with torch.inference_mode():
        return hf(ids).logits.float()


def _ours_logits(model_dir: Path, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Prefill ids[:, :split], then feed the rest as a second chunk through the cache."""
    m = load_model(model_dir)
    b, t = ids.shape
    cache = m.new_cache(b, t + 4)
    with torch.inference_mode():
        h1 = m(ids[:, :split], cache, torch.zeros(b, dtype=torch.long), torch.arange(split), None)
        cache.lengths = [split] * b
        h2 = m(ids[:, split:], cache, torch.full((b,), split), torch.arange(t - split), None)
    return m.logits(torch.cat([h1, h2], dim=1))


def test_llama_logits_match_hf(tiny_ckpt) -> None:  # type: ignore[no-untyped-def]
    ids = torch.randint(0, 260, (2, 13), generator=torch.Generator().manual_seed(0))
    ref = _hf_logits(tiny_ckpt.target, ids)
    assert torch.allclose(_ours_logits(tiny_ckpt.target, ids, 9), ref, atol=1e-4)


def _save_hf(tmp: Path, arch: str, **kw: object) -> Path:
    import transformers

    cfg_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForCausalLM")
    cfg = cfg_cls(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=128,
                  **kw)
    torch.manual_seed(1)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # random non-zero biases and norms so they matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    out = tmp / arch.lower()
    model.save_pretrained(str(out), safe_serialization=True)
    return out


@pytest.mark.parametrize(("arch", "kw"), [
    ("Qwen2", {"tie_word_embeddings": True, "rope_theta": 1e6, "rms_norm_eps": 1e-5}),
    ("Mistral", {"rope_theta": 5e5}),
    ("Llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
               "attention_bias": True}),
])
def test_other_families_match_hf(tmp_path: Path, arch: str, kw: dict[str, object]) -> None:
    d = _save_hf(tmp_path, arch, **kw)
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(_ours_logits(d, ids, 30), _hf_logits(d, ids), atol=1e-4)


def test_rows_with_different_lengths_match_single_rows(tiny_models: TinyModels) -> None:
    m = tiny_models.target
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 260, (n,), generator=g) for n in (5, 9, 2)]
    new = torch.randint(0, 260, (3, 3), generator=g)
    cache = m.new_cache(3, 20)
    with torch.inference_mode():
        padded = torch.zeros(3, 9, dtype=torch.long)
        for i, p in enumerate(prompts):
            padded[i, :len(p)] = p
        m(padded, cache, torch.zeros(3, dtype=torch.long), torch.arange(9), None)
        cache.lengths = [5, 9, 2]
        batched = m.logits(m(new, cache, torch.tensor([5, 9, 2]), torch.arange(3), None))
        for i, p in enumerate(prompts):
            full = torch.cat([p, new[i]])[None]
            c1 = m.new_cache(1, 20)
            ref = m.logits(m(full, c1, torch.zeros(1, dtype=torch.long),
                             torch.arange(full.shape[1]), None))[:, -3:]
            assert torch.allclose(batched[i], ref[0], atol=1e-5)


def test_tree_forward_equals_each_path_forward(tiny_models: TinyModels) -> None:
    m = tiny_models.target
    tree = MedusaTree.from_choices([[0], [1], [0, 0], [1, 0], [1, 1], [0, 0, 0]])
    buf = build_tree_buffers(tree)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 260, (1, 6), generator=g)
    nodes = torch.randint(0, 260, (1, tree.num_nodes + 1), generator=g)
    with torch.inference_mode():
        cache = m.new_cache(1, 32)
        m(prompt, cache, torch.zeros(1, dtype=torch.long), torch.arange(6), None)
        cache.lengths = [6]
        tree_logits = m.logits(m(nodes, cache, torch.tensor([6]), buf.position_ids,
                                 buf.attn_mask))[0]
        for i in range(tree.num_nodes + 1):
            path = [j for j in range(i + 1) if bool(buf.attn_mask[i, j])]
            seq = torch.cat([prompt[0], nodes[0, path]])[None]
            c = m.new_cache(1, 32)
            ref = m.logits(m(seq, c, torch.zeros(1, dtype=torch.long),
                             torch.arange(seq.shape[1]), None))[0, -1]
            assert torch.allclose(tree_logits[i], ref, atol=1e-5), i


def _three_steps(m, prompt, one, nodes, tree) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Logits of a prefill, a 1-token decode and a tree step (2 rows)."""
    cache = m.new_cache(2, 32)
    with torch.inference_mode():
        steps = [m.logits(m(prompt, cache))]
        cache.lengths = [7, 7]
        steps.append(m.logits(m(one, cache)))
        cache.lengths = [8, 8]
        steps.append(m.logits(m(nodes, cache, None, tree.position_ids, tree.attn_mask)))
    return steps


def test_prepacked_weights_give_the_same_logits(tiny_ckpt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``decode_layout`` prepacks CPU linears for oneDNN: bf16 weights themselves, and in fp32 a
    copy for multi-row inputs. Outputs must match ``F.linear`` on the plain weights: bit for bit
    in bf16, within float32 rounding in fp32 (different kernels); bf16 close to HF's forward.
    fp32 as without the few-row kernel (test_cpu_linear_kernel.py checks that one)."""
    from specserve.runtime import cpu_linear
    from specserve.runtime.cpu_linear import can_prepack

    monkeypatch.setattr(cpu_linear, "_loaded", [None])

    if not can_prepack(torch.bfloat16):
        pytest.skip("this torch build has no oneDNN bf16")
    tree = build_tree_buffers(MedusaTree.from_choices([[0], [1], [0, 0], [1, 0]]))
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randint(0, 260, (2, n), generator=g) for n in (7, 1, 5)]

    plain32 = load_model(tiny_ckpt.target)  # tiny weights: column-major only (below the minimum)
    assert plain32.lm_head.multi_row is None and plain32.lm_head.weight.stride(0) == 1
    dual32 = load_model(tiny_ckpt.target).decode_layout(multi_row_min=0)
    assert dual32.lm_head.multi_row is not None
    for a, b in zip(_three_steps(dual32, *inputs, tree), _three_steps(plain32, *inputs, tree),
                    strict=True):
        assert torch.allclose(a, b, atol=1e-5)

    packed = load_model(tiny_ckpt.target, dtype=torch.bfloat16)
    assert sum(p.is_mkldnn for p in packed.parameters()) == 4 * packed.cfg.num_layers + 1
    plain = dual32.to(torch.bfloat16)  # .to() drops the prepacked forms
    plain.inv_freq = plain.inv_freq.float()
    assert plain.lm_head.multi_row is None and not any(p.is_mkldnn for p in plain.parameters())
    out = _three_steps(packed, *inputs, tree)
    for a, b in zip(out, _three_steps(plain, *inputs, tree), strict=True):
        assert torch.equal(a, b)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt.target), local_files_only=True,
                                              dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        ref = hf(inputs[0]).logits.float()
    assert (out[0] - ref).abs().max() < 0.1 * ref.abs().max()
