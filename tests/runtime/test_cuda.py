"""The reference decoder on a CUDA device (marked ``gpu``; deselected by default, run with
``pytest -m gpu`` on a machine with a GPU): greedy speculation equals plain greedy decoding there
too, for a draft, n-gram and Medusa proposer, batch 2, float32 and bfloat16; and sampling at
temperature 1 is seeded (same seed, same tokens)."""

from __future__ import annotations

import pytest
import torch

from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.loader import build_decoder
from tests.helpers.tiny import TinyCheckpoint

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [30, 31, 32, 33]]


@pytest.fixture(scope="module")
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec", ["draft", "ngram", "medusa"])
def test_greedy_speculation_equals_plain_on_cuda(cuda: None, tiny_ckpt: TinyCheckpoint,
                                                 spec: str, dtype: str) -> None:
    kw = {"draft": {"draft_dir": tiny_ckpt.target}, "ngram": {"ngram": True},
          "medusa": {"medusa_dir": tiny_ckpt.medusa}}[spec]
    params = SamplingParams(max_tokens=24)
    dec = build_decoder(tiny_ckpt.target, dtype=dtype, device="cuda", **kw)
    assert dec.target.device.type == "cuda"
    plain = SpecDecoder(dec.target)
    ref = [plain.generate([p], params)[0].token_ids for p in PROMPTS]
    out = [r.token_ids for r in dec.generate(PROMPTS, params)]
    if dtype == "float32":
        assert out == ref
    else:  # bf16: a K+1-token forward may round a near-tie differently; the start must agree
        assert all(o[:4] == r[:4] for o, r in zip(out, ref, strict=True))


def test_sampling_is_seeded_on_cuda(cuda: None, tiny_ckpt: TinyCheckpoint) -> None:
    dec = build_decoder(tiny_ckpt.target, draft_dir=tiny_ckpt.draft, device="cuda")
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3)
    a = dec.generate(PROMPTS, params)
    b = dec.generate(PROMPTS, params)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
