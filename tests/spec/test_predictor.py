"""Speedup model: roofline figures, expected tokens and speedups against published/hand values.

Reference values: a worked table (E and S at c = T_draft/T(1), verify cost = T(1)),
the textbook 70B fp16 on H100 figure (140 GB / 3.35 TB/s = 41.8 ms), the roofline
ceilings, and Llama-3.1-8B's published parameter count (8,030,261,248).
"""

from __future__ import annotations

import pytest

from specserve.errors import SpecserveError
from specserve.spec.predictor import (
    GPUS,
    Acceptance,
    ModelShape,
    Proposer,
    Workload,
    acceptance_from_summary,
    expected_tokens,
    expected_tokens_from_rates,
    free_verify_tokens,
    hardware_for,
    measured_speedups,
    medusa_head_params,
    needed_step_sizes,
    predict_speedup,
    roofline_step_times,
    shape_from_hf_config,
    spec_acceptance,
    step_cost,
)

LLAMA31_8B = {
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "tie_word_embeddings": False,
}


def test_70b_fp16_h100_reads_weights_in_41_8_ms() -> None:
    cost = step_cost(Workload(ModelShape(70e9), 2.0), hardware_for(GPUS["h100-sxm"], "fp16"), 1)
    assert cost.time_s * 1e3 == pytest.approx(41.8, abs=0.05)
    assert cost.bound == "memory"
    assert cost.bytes_read == pytest.approx(140e9)


@pytest.mark.parametrize(
    ("gpu", "params", "dtype", "ms", "tok_s"),
    [("h100-sxm", 8e9, "fp8", 2.4, 419), ("h200", 8e9, "fp8", 1.67, 600),
     ("h100-sxm", 8e9, "bf16", 4.78, 209), ("h200", 8e9, "bf16", 3.33, 300),
     ("h200", 70e9, "fp8", 14.6, 69)],
)
def test_roofline_ceilings_from_peers(gpu: str, params: float, dtype: str, ms: float,
                                      tok_s: float) -> None:
    bytes_pp = {"fp8": 1.0, "bf16": 2.0}[dtype]
    work, hw = Workload(ModelShape(params), bytes_pp), hardware_for(GPUS[gpu], dtype)
    cost = step_cost(work, hw, 1)
    assert cost.time_s * 1e3 == pytest.approx(ms, rel=0.01)
    assert cost.bound == "memory" and cost.bytes_read == pytest.approx(params * bytes_pp)
    # the tokens/s ceiling the CLI reports comes from the prediction over the measured steps
    pred = predict_speedup(Acceptance(alpha=0.5), Proposer("ngram"),
                           {n: step_cost(work, hw, n).time_s for n in range(1, 18)})
    assert pred.tokens_per_s_ceiling == pytest.approx(tok_s, rel=0.01)


def test_compute_bound_point_and_tp() -> None:
    work = Workload(ModelShape(70e9), 2.0)
    hw = hardware_for(GPUS["h100-sxm"], "fp16")
    ridge = free_verify_tokens(work, hw)
    assert ridge == pytest.approx(989 / 3.35, rel=1e-6)  # 1 FLOP per weight byte per token
    assert step_cost(work, hw, 200).bound == "memory"
    assert step_cost(work, hw, 400).bound == "compute"
    assert step_cost(work, hw, 400).time_s == pytest.approx(2 * 70e9 * 400 / 989e12)
    hw2 = hardware_for(GPUS["h100-sxm"], "fp16", tp_size=2)
    assert step_cost(work, hw2, 1).time_s == pytest.approx(step_cost(work, hw, 1).time_s / 2)


def test_expected_tokens_textbook() -> None:
    assert round(expected_tokens(0.8, 5), 2) == 3.69
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0


@pytest.mark.parametrize(
    ("alpha", "e357", "s357", "best005", "best02"),
    [(0.6, (2.18, 2.38, 2.46), (1.89, 1.91, 1.82), (4, 1.92), (2, 1.40)),
     (0.7, (2.53, 2.94, 3.14), (2.20, 2.35, 2.33), (6, 2.35), (3, 1.58)),
     (0.8, (2.95, 3.69, 4.16), (2.57, 2.95, 3.08), (8, 3.09), (4, 1.87)),
     (0.9, (3.44, 4.69, 5.70), (2.99, 3.75, 4.22), (13, 4.67), (7, 2.37))],
)
def test_worked_table_of_peers(alpha: float, e357: tuple[float, ...], s357: tuple[float, ...],
                               best005: tuple[int, float], best02: tuple[int, float]) -> None:
    flat = {n: 1.0 for n in range(1, 32)}  # verifying K+1 tokens costs one step (memory-bound)
    pred = predict_speedup(Acceptance(alpha=alpha), Proposer("draft", 0.05), flat, max_k=30)
    by_k = {p.k: p for p in pred.points}
    assert tuple(round(expected_tokens(alpha, k), 2) for k in (3, 5, 7)) == e357
    assert tuple(round(by_k[k].speedup, 2) for k in (3, 5, 7)) == s357
    assert (pred.best.k, round(pred.best.speedup, 2)) == best005
    pred2 = predict_speedup(Acceptance(alpha=alpha), Proposer("draft", 0.2), flat, max_k=30)
    assert (pred2.best.k, round(pred2.best.speedup, 2)) == best02


def test_rates_reduce_to_alpha_form() -> None:
    alpha = 0.7
    rates = [alpha ** (k + 1) for k in range(6)]  # P(position k accepted) under i.i.d. alpha
    for k in range(1, 7):
        assert expected_tokens_from_rates(rates, k) == pytest.approx(expected_tokens(alpha, k))
    with pytest.raises(SpecserveError, match="exceeds"):
        expected_tokens_from_rates([0.5, 0.6], 2)
    with pytest.raises(SpecserveError, match="only 2"):
        expected_tokens_from_rates([0.5, 0.4], 3)


def test_roofline_speedup_uses_verify_cost() -> None:
    """Past the ridge point verifying K+1 tokens is no longer free, so speedup drops."""
    work = Workload(ModelShape(70e9), 2.0, batch=128)
    hw = hardware_for(GPUS["h100-sxm"], "fp16")
    times = roofline_step_times(work, hw, range(1, 18))
    pred = predict_speedup(Acceptance(alpha=0.8), Proposer("ngram"), times, batch=128)
    assert times[6] > times[1]  # 128 * 6 tokens > ridge of ~295
    assert pred.best.k < 16
    assert pred.best.speedup < expected_tokens(0.8, pred.best.k)
    assert pred.tokens_per_s_ceiling == pytest.approx(128 / times[1])


def test_tree_point_and_medusa_proposer() -> None:
    times = {1: 10e-3, 64: 12e-3}
    pred = predict_speedup(Acceptance(tau=3.0, tau_k=4), Proposer("medusa", 1e-3), times, k=4,
                           tree_nodes=63)
    assert pred.chosen is not None and pred.chosen.n_verify == 64
    assert pred.chosen.speedup == pytest.approx(3.0 * 10 / (1 + 12))


def test_llama31_8b_param_count_and_kv_bytes() -> None:
    shape = shape_from_hf_config(LLAMA31_8B)
    assert shape.params == 8_030_261_248
    work = Workload(shape, 2.0, kv_bytes_per_element=2.0)
    assert work.kv_bytes_per_token == 128 * 1024  # 128 KiB per token in BF16


def _hf_count(cfg: dict) -> int:  # type: ignore[type-arg]
    import torch
    import transformers

    torch.set_num_threads(1)
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[cfg["model_type"]]
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    model = cls[1](cls[0](**kwargs))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "extra",
    [{"model_type": "llama"}, {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
     {"model_type": "llama", "tie_word_embeddings": True, "head_dim": 24},
     {"model_type": "qwen2", "tie_word_embeddings": True},
     {"model_type": "qwen3", "head_dim": 16, "tie_word_embeddings": False}],
)
def test_param_count_matches_transformers(extra: dict) -> None:  # type: ignore[type-arg]
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 200,
           "tie_word_embeddings": False, **extra}
    assert shape_from_hf_config(cfg).params == _hf_count(cfg)


def test_medusa_heads_count_matches_layout() -> None:
    # 4 heads, hidden 64, vocab 256, one ResBlock each: tensors as testing/tiny.py writes them
    assert medusa_head_params(4, 64, 256) == 4 * (64 * 64 + 64 + 256 * 64)


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [({"model_type": "gpt2", "n_embd": 8}, "not modelled"),
     ({**LLAMA31_8B, "num_local_experts": 8}, "mixture"),
     ({k: v for k, v in LLAMA31_8B.items() if k != "hidden_size"}, "hidden_size")],
)
def test_bad_configs_name_the_problem(cfg: dict, msg: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(SpecserveError, match=msg):
        shape_from_hf_config(cfg, "m/config.json")


def test_fp8_needs_fp8_tensor_cores() -> None:
    with pytest.raises(SpecserveError, match="a100-80g"):
        hardware_for(GPUS["a100-80g"], "fp8")
    with pytest.raises(SpecserveError, match="alpha"):
        expected_tokens(1.5, 3)


def test_step_overhead_is_added_to_both_sides() -> None:
    times = {1: 2e-3, 5: 4e-3}
    plain = predict_speedup(Acceptance(tau=4.0, tau_k=4), Proposer("draft", 1e-3), times, k=4)
    with_o = predict_speedup(Acceptance(tau=4.0, tau_k=4), Proposer("draft", 1e-3), times, k=4,
                             overhead_s=1e-3)
    assert plain.best.speedup == pytest.approx(4.0 * 2 / (4 + 4))
    assert with_o.best.speedup == pytest.approx(4.0 * 3 / (4 + 4 + 1))
    with pytest.raises(SpecserveError, match="overhead"):
        predict_speedup(Acceptance(tau=2.0, tau_k=4), Proposer("ngram"), times, k=4,
                        overhead_s=-1.0)


def test_spec_acceptance_forms_and_speedups() -> None:
    block = {"per_position_acceptance": [0.5, 0.25]}
    assert spec_acceptance({"variants": {"spec": {"acceptance": block}}}, "s") == block
    assert spec_acceptance({"acceptance": block}, "s") == block
    assert spec_acceptance(block, "s") == block  # a bare AcceptanceStats.to_dict()
    with pytest.raises(SpecserveError, match="s.json: no variants.spec.acceptance"):
        spec_acceptance([block], "s.json")
    assert acceptance_from_summary({"acceptance": block}, "s").rates == (0.5, 0.25)
    for bad, msg in (({"per_position_acceptance": [0.5, "x"]}, "expected a list of numbers"),
                     ({"per_position_acceptance": [True]}, "expected a list of numbers"),
                     ({"per_position_acceptance": []}, "no per_position_acceptance"),
                     ({"per_position_acceptance": [0.2, 0.5]}, "exceeds")):
        with pytest.raises(SpecserveError, match=msg):
            acceptance_from_summary(bad, "s")
    summary = {"speedup": {"tpot_s": {"speedup": 2}, "ttft_s": {"speedup": None},
                           "p50": {"speedup": "1.5"}, "x": 1}}
    assert measured_speedups(summary) == {"tpot_s": 2.0}
    assert measured_speedups({"speedup": [1]}) == measured_speedups(None) == {}


def test_needed_step_sizes() -> None:
    assert needed_step_sizes(None, 3, None, 16) == [1]
    assert needed_step_sizes(Acceptance(alpha=0.5), None, None, 3) == [1, 2, 3, 4]
    assert needed_step_sizes(Acceptance(alpha=0.5), 6, None, 2) == [1, 2, 3, 7]
    assert needed_step_sizes(Acceptance(rates=(0.5, 0.2)), None, None, 16) == [1, 2, 3]
    assert needed_step_sizes(Acceptance(tau=2.0, tau_k=4), 4, 63, 16) == [1, 64]


def test_hf_config_that_is_not_an_object_or_has_bad_fields() -> None:
    with pytest.raises(SpecserveError, match="c.json: expected a JSON object"):
        shape_from_hf_config([1], "c.json")  # type: ignore[arg-type]
    for key in ("num_key_value_heads", "head_dim"):
        with pytest.raises(SpecserveError, match=f"c.json: missing or invalid '{key}'"):
            shape_from_hf_config({**LLAMA31_8B, key: "8"}, "c.json")
    no_kv = {k: v for k, v in LLAMA31_8B.items() if k != "num_key_value_heads"}
    assert shape_from_hf_config(no_kv).num_kv_heads == 32  # defaults to the attention heads
