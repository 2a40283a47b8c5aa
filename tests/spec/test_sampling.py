from __future__ import annotations

import pytest
import torch

from specserve.spec.sampling import logits_to_probs


def test_temperature_zero_is_one_hot_argmax() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert logits_to_probs(logits, 0.0).tolist() == [[0.0, 1.0, 0.0]]


def test_top_k_and_top_p_filter_and_normalize() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    pk = logits_to_probs(logits, 1.0, top_k=2)
    assert torch.allclose(pk, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    pp = logits_to_probs(logits, 1.0, top_p=0.8)  # 0.5 + 0.3 reaches 0.8
    assert torch.allclose(pp, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(logits_to_probs(logits, 1.0).sum(-1), torch.ones(1))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        logits_to_probs(torch.zeros(1, 3), -1.0)
    with pytest.raises(ValueError):
        logits_to_probs(torch.zeros(1, 3), 1.0, top_p=0.0)
