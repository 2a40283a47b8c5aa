"""Medusa head math, layout and the T=0 acceptance replay (pure, fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specserve.train.evaluate import replay_chain, replay_tree, tree_accept_depth
from specserve.train.lm import Schedule
from specserve.train.medusa import (
    HEADS_FILE,
    IGNORE,
    MedusaHeads,
    head_top1_accuracy,
    load_medusa,
    medusa_labels,
    save_medusa,
)
from specserve.train.medusa_train import train_heads

torch.set_num_threads(1)


def test_labels_are_tokens_k_plus_2_ahead() -> None:
    tokens = torch.arange(100, 110)[None]  # [1, 10]
    labels = medusa_labels(tokens, num_heads=3)
    for t in range(10):
        for k in range(3):
            want = 100 + t + k + 2 if t + k + 2 < 10 else IGNORE
            assert labels[0, t, k] == want


def test_labels_before_first_label_are_ignored() -> None:
    tokens = torch.arange(10)[None]
    labels = medusa_labels(tokens, num_heads=2, first_label=5)
    # label index t+k+2 < 5 -> ignored; t=2,k=1 -> index 5 kept
    assert labels[0, 2, 0] == IGNORE and labels[0, 2, 1] == 5 and labels[0, 3, 0] == 5


def test_fresh_heads_equal_the_base_lm_head() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(11, 8, generator=g)  # [V, H]
    heads = MedusaHeads(8, 11, num_heads=3, num_layers=2)
    heads.init_lm_heads(w)
    h = torch.randn(5, 8, generator=g)
    out = heads(h)  # [5, 3, 11]
    for k in range(3):
        torch.testing.assert_close(out[:, k], h @ w.T)


def test_layout_names_config_and_runtime_loader(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from specserve.runtime.checkpoint import load_medusa_heads

    heads = MedusaHeads(8, 11, num_heads=2, num_layers=1)
    torch.nn.init.normal_(heads.heads[0][0].linear.weight)
    save_medusa(heads, tmp_path / "m", "target")
    names = set(load_file(str(tmp_path / "m" / HEADS_FILE)))
    assert names == {"0.0.linear.weight", "0.0.linear.bias", "0.1.weight",
                     "1.0.linear.weight", "1.0.linear.bias", "1.1.weight"}
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg == {"medusa_num_heads": 2, "medusa_num_layers": 1,
                   "base_model_name_or_path": "target", "hidden_size": 8, "vocab_size": 11,
                   "medusa_fc_bias": True}   # vLLM's `medusa` method loads the biases only so
    again = load_medusa(tmp_path / "m")
    h = torch.randn(4, 8)
    torch.testing.assert_close(again(h), heads(h))
    runtime = load_medusa_heads(tmp_path / "m", 8, 11)
    torch.testing.assert_close(runtime(h).reshape(heads(h).shape), heads(h))


def test_head_training_fits_a_learnable_mapping() -> None:
    # Hidden state = one-hot of the current token; labels = tokens 2.. ahead of a fixed cycle,
    # so each head's target is a function of the hidden state: accuracy must approach 1.
    v, t = 6, 24
    tokens = (torch.arange(t) % v)[None].repeat(2, 1)  # [2, T]
    hidden = torch.nn.functional.one_hot(tokens, v).float() * 3  # [2, T, H=V]
    labels = medusa_labels(tokens, num_heads=2)
    heads = MedusaHeads(v, v, num_heads=2, num_layers=1)
    heads.init_lm_heads(torch.zeros(v, v))  # argmax ties -> always token 0 (1/6 right)
    before = head_top1_accuracy(heads, hidden, labels)
    s = Schedule(steps=150, batch_size=32, seq_len=1, lr=3e-2, warmup_steps=5, bf16=False)
    losses = train_heads(heads, hidden, labels, s, torch.Generator().manual_seed(0))
    after = head_top1_accuracy(heads, hidden, labels)
    assert losses[-1] < losses[0] / 5
    assert min(after) > 0.95 and max(before) < 0.3


def test_replay_chain_perfect_and_useless_drafts() -> None:
    seq = torch.arange(20)
    start = 5  # 15 generated tokens
    perfect = torch.arange(1, 21)  # draft_pred[s] == seq[s + 1]
    assert replay_chain(perfect, seq, start, k=4).steps == 3  # 5 + 5 + 5 tokens
    assert replay_chain(perfect, seq, start, k=4).tau == 5.0
    useless = torch.full((20,), -1)
    stats = replay_chain(useless, seq, start, k=4)
    assert stats.steps == 15 and stats.tau == 1.0


def test_replay_chain_partial_acceptance() -> None:
    seq = torch.arange(10)
    pred = torch.arange(1, 11).clone()
    pred[3] = -1  # wrong about seq[4]
    # start 2: t=1; ok[1], ok[2] true, ok[3] false -> a=2, emit 3 (t=4); then 4 accepted + 1
    stats = replay_chain(pred, seq, 2, k=4)
    assert (stats.steps, stats.emitted) == (2, 8)


def test_tree_accept_depth_follows_ranks() -> None:
    topk = torch.tensor([[7, 8], [9, 5]])  # head 0 top-2, head 1 top-2
    choices = [(0,), (1,), (0, 0), (1, 1)]
    assert tree_accept_depth(topk, [8, 5], choices) == 2  # path (1, 1)
    assert tree_accept_depth(topk, [8, 9], choices) == 1  # (1, 0) not in the tree
    assert tree_accept_depth(topk, [3, 9], choices) == 0


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_replay_tree_with_perfect_rank0_heads(depth: int) -> None:
    seq = torch.arange(40)
    t_len, heads = 40, 3
    topk = torch.zeros(t_len, heads, 1, dtype=torch.int64)
    for t in range(t_len):
        for k in range(heads):
            topk[t, k, 0] = t + k + 2
    chain = [tuple([0] * d) for d in range(1, depth + 1)]
    stats = replay_tree(topk, seq, 4, chain)
    assert stats.emitted == 36  # positions 4..39
    assert stats.steps == -(-36 // (depth + 1))
