"""A long prefill's causal attention by query blocks (``runtime/prefill_attention.py``): equal to
SDPA with the causal mask the model builds otherwise, at any offset, block edge and head
grouping, reading no key past the last new token; then whole forwards against Hugging Face's
with it taken, and when it is taken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specserve.runtime import prefill_attention
from specserve.runtime.model import load_model

torch.set_num_threads(1)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
    """SDPA over keys 0..past+T-1, new token i seeing keys 0..past+i: [B, nh, T, D]."""
    t = q.shape[2]
    mask = torch.ones(t, past + t, dtype=torch.bool).tril_(past)[None, None]
    return F.scaled_dot_product_attention(q, k[:, :, :past + t], v[:, :, :past + t],
                                          attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize(("t", "past", "heads", "kv_heads", "block"), [
    (130, 0, 9, 3, 32),    # SmolLM2's heads; the last block short
    (128, 16, 9, 3, 32),   # a cached prefix (the chat template's first block)
    (33, 100, 4, 4, 32),   # one query past a block edge, no grouping
    (160, 40, 8, 2, 48),   # another block size
    (5, 7, 2, 1, 32),      # fewer queries than a block
])
def test_equals_sdpa_with_the_causal_mask(t: int, past: int, heads: int, kv_heads: int,
                                          block: int) -> None:
    """Within 2e-6 of SDPA (float32; seed 0). The cache slots after the last new token hold
    NaN: read, they would spread to the output."""
    g = torch.Generator().manual_seed(0)
    b, d, slots = 2, 64, past + t + 20
    q = torch.randn(b, t, heads, d, generator=g).transpose(1, 2)  # [B, nh, T, D], the model's
    k = torch.randn(b, kv_heads, slots, d, generator=g)
    v = torch.randn(b, kv_heads, slots, d, generator=g)
    k[:, :, past + t:] = float("nan")
    v[:, :, past + t:] = float("nan")
    got = prefill_attention.attend(q, k, v, past, block)
    torch.testing.assert_close(got, _reference(q, k, v, past), atol=2e-6, rtol=0)


def test_used_only_where_it_applies() -> None:
    q = torch.zeros(1, 9, prefill_attention.MIN_NEW, 64)
    with torch.no_grad():
        assert prefill_attention.usable(q)
        assert not prefill_attention.usable(q[:, :, 1:])  # fewer new tokens: SDPA
        assert not prefill_attention.usable(q.bfloat16())
    assert not prefill_attention.usable(q)  # autograd on (training): SDPA


def _llama(tmp: Path) -> Path:
    """A tiny grouped-query Llama (4 heads over 2 KV heads) that holds 512 positions."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(1)
    out = tmp / "llama"
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(str(out), safe_serialization=True)
    return out


def test_forwards_take_it_and_match_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 340-token prompt prefilled as 170 + 170 tokens (the second chunk after 170 cached
    ones, as a cached prefix or a chunked prefill runs): logits within 1e-4 of Hugging Face's,
    both chunks through the block path, on the CPU layer path (rows) and the reference one."""
    from transformers import AutoModelForCausalLM

    d = _llama(tmp_path)
    ids = torch.randint(0, 97, (1, 340), generator=torch.Generator().manual_seed(2))
    hf = AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True).eval()
    with torch.inference_mode():
        ref = hf(ids).logits.float()
    calls: list[int] = []
    real = prefill_attention.attend

    def counted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int,
                block: int = prefill_attention.BLOCK) -> torch.Tensor:
        calls.append(past)
        return real(q, k, v, past, block)

    monkeypatch.setattr(prefill_attention, "attend", counted)
    for layer_path in (True, False):
        if not layer_path:  # the reference forward (model._block), as Qwen3's q/k norms take
            from specserve.runtime import cpu_layer
            monkeypatch.setattr(cpu_layer, "usable", lambda *a: False)
        m = load_model(d)
        cache = m.new_cache(1, 360)
        calls.clear()
        with torch.inference_mode():
            h1 = m(ids[:, :170], cache)
            cache.lengths = [170]
            h2 = m(ids[:, 170:], cache)
        assert calls == [0, 0, 170, 170]  # 2 layers x 2 chunks
        torch.testing.assert_close(m.logits(torch.cat([h1, h2], dim=1)), ref, atol=1e-4,
                                   rtol=0)


def test_step_inputs_mark_only_a_causal_chain_at_one_offset(tmp_path: Path) -> None:
    """``past`` is set for a chain of new tokens at one cache length and no window; ragged rows,
    a windowed draft (keys before the window unseen), a tree and one token keep the mask."""
    m = load_model(_llama(tmp_path))
    cache = m.new_cache(2, 400)
    tokens = torch.zeros(2, 130, dtype=torch.long)
    cache.lengths = [10, 10]
    assert m.step_inputs(tokens, cache).past == 10
    assert m.step_inputs(tokens, cache, window=4).past is None
    assert m.step_inputs(tokens[:, :1], cache).past is None
    tree = torch.ones(130, 130, dtype=torch.bool).tril()
    assert m.step_inputs(tokens, cache, node_mask=tree).past is None
    cache.lengths = [10, 12]
    assert m.step_inputs(tokens, cache).past is None
