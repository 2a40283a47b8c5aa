"""The ``specserve predict`` flow as a library call (:mod:`specserve.predict`), without the CLI:
option/field agreement, the frozen config, summary inputs, step overhead, the measured path with a
fake timer (and once for real on the tiny checkpoint), and bad input as SpecserveError."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import specserve.predict as flow
from specserve.cli.predict import command
from specserve.errors import SpecserveError
from specserve.predict import (
    PredictConfig,
    acceptance_from,
    config_path,
    model_shape,
    predict,
    step_overhead_s,
)


def _summary(tmp_path: Path, **extra: Any) -> Path:
    data: dict[str, Any] = {"variants": {"spec": {"acceptance": {
        "per_position_acceptance": [0.6, 0.4, 0.2, 0.1], "tau_server": 2.3}}},
        "speedup": {"tpot_s": {"speedup": 1.7}, "ttft_s": {"speedup": None}}}
    data.update(extra)
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(data))
    return p


def test_config_fields_match_cli_options() -> None:
    """One field per option, same name and default: the command passes its options straight in."""
    defaults = dict(command.make_context("predict", []).params)  # every option, unset
    assert defaults.pop("fmt") == "text"
    assert defaults == dataclasses.asdict(PredictConfig())


def test_roofline_report_70b_h100() -> None:
    r = predict(PredictConfig(params=70e9))
    assert r["decode"]["t1_ms"] == pytest.approx(41.8, abs=0.05)
    assert r["decode"]["bound"] == "memory"
    assert r["hardware"]["step_times"] == "roofline" and r["hardware"]["gpu"] == "h100-sxm"
    assert r["step_ms"] == {"1": pytest.approx(r["decode"]["t1_ms"])}
    assert r["speculation"] is None and "measured_speedup" not in r


def test_summary_flow_and_tree_depth_leave_the_config_unchanged(tmp_path: Path) -> None:
    cfg = PredictConfig(params=7e9, summary=str(_summary(tmp_path)), tree_nodes=63)
    r = predict(cfg)
    chosen = r["speculation"]["chosen"]
    assert (chosen["k"], chosen["n_verify"]) == (4, 64)  # depth = len(rates), verify 63 + 1
    assert chosen["tau"] == pytest.approx(2.3)
    assert sorted(r["step_ms"], key=int) == ["1", "64"]
    assert r["measured_speedup"] == {"tpot_s": 1.7}
    assert cfg.draft_len is None  # the tree depth is derived, not written back


def test_draft_roofline_cost_from_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
        "vocab_size": 128256, "tie_word_embeddings": True}))
    shape, src = model_shape(None, str(tmp_path))
    assert src == str(tmp_path / "config.json") and config_path(str(tmp_path)) == Path(src)
    r = predict(PredictConfig(params=70e9, proposer="draft", draft_config=str(tmp_path),
                              alpha=0.8, draft_len=5))
    spec = r["speculation"]
    assert spec["propose_cost"].startswith(f"roofline of a {shape.params / 1e9:.3g}B draft")
    t_draft_ms = shape.params * 2 / 3.35e12 * 1e3  # memory-bound: weights / bandwidth
    assert spec["chosen"]["propose_ms"] == pytest.approx(5 * t_draft_ms, rel=1e-3)


def test_step_overhead() -> None:
    assert step_overhead_s("1.5", None, 0.01) == (0.0015, "--step-overhead-ms")
    summary = {"variants": {"baseline": {"tpot_ms": {"mean": 30.0}}}}
    value, src = step_overhead_s("auto", summary, 0.010)
    assert value == pytest.approx(0.020) and src.startswith("auto: baseline TPOT 30 ms")
    assert step_overhead_s("auto", summary, 0.040)[0] == 0.0  # floored
    for arg, s, msg in (("x", None, "a number of ms"), ("-1", None, "must be >= 0"),
                        ("auto", None, "baseline variant"),
                        ("auto", {"variants": {"baseline": {"tpot_ms": {"mean": "x"}}}},
                         "baseline variant")):
        with pytest.raises(SpecserveError, match=msg):
            step_overhead_s(arg, s, 0.01)


def test_acceptance_inputs() -> None:
    assert acceptance_from(None, None, None, None, None, None) is None
    rates = acceptance_from(None, "0.7, 0.5,", None, None, None, None)
    tau = acceptance_from(None, None, 2.5, 3, None, None)
    assert rates is not None and rates.rates == (0.7, 0.5)
    assert tau is not None and (tau.tau, tau.tau_k) == (2.5, 3)
    for args, msg in (((0.5, "0.3", None, None, None, None), "give one of"),
                      ((None, "a,b", None, None, None, None), "expected numbers"),
                      ((None, None, 2.5, None, None, None), "--tau needs --draft-len"),
                      ((None, None, 5.0, 3, None, None), "1 <= tau <= K"),
                      ((None, None, None, None, {"x": 1}, "s.json"), "s.json: no variants")):
        with pytest.raises(SpecserveError, match=msg):
            acceptance_from(*args)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [({"gpu": "h300"}, "--gpu 'h300'"), ({"dtype": "int4"}, "--dtype"),
     ({"kv_dtype": "fp4"}, "--kv-dtype"), ({"proposer": "eagle"}, "--proposer"),
     ({"stat": "mean"}, "--stat")],
)
def test_config_refuses_unknown_choices(kwargs: dict[str, Any], msg: str) -> None:
    with pytest.raises(SpecserveError, match=msg):
        PredictConfig(params=7e9, **kwargs)


@pytest.mark.parametrize(
    ("acceptance", "msg"),
    [({"per_position_acceptance": ["x"]}, "per_position_acceptance: expected a list"),
     ({"per_position_acceptance": 0.5}, "per_position_acceptance: expected a list"),
     ({"per_position_acceptance": []}, "no per_position_acceptance"),
     ({"per_position_acceptance": [0.3, 0.5]}, "exceeds")],
)
def test_malformed_summary_is_an_error(tmp_path: Path, acceptance: dict[str, Any],
                                       msg: str) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"variants": {"spec": {"acceptance": acceptance}}}))
    with pytest.raises(SpecserveError, match=msg):
        predict(PredictConfig(params=7e9, summary=str(p)))


def test_measured_flow_uses_the_timer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--measure: T(n) and the propose cost come from measure_step_times, called with the
    checkpoint dirs and every n the prediction needs."""
    calls: list[dict[str, Any]] = []

    def fake(model_dir: Path, ns: list[int], **kw: Any) -> dict[str, Any]:
        calls.append({"model_dir": model_dir, "ns": ns, **kw})
        return {"step_s": {1: 0.010, 2: 0.011, 3: 0.012}, "draft_step_s": 0.001,
                "heads_s": None, "samples_s": {}}

    monkeypatch.setattr(flow, "measure_step_times", fake)
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({  # read for the model's size
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "vocab_size": 32}))
    r = predict(PredictConfig(config=str(tmp_path / "t" / "config.json"), measure=True, reps=3,
                              proposer="draft", draft_config=str(tmp_path / "d"), alpha=0.5,
                              max_draft_len=2, batch=2, kv_len=7, threads=2))
    (call,) = calls
    assert call["model_dir"] == tmp_path / "t" and call["draft_dir"] == tmp_path / "d"
    assert call["ns"] == [1, 2, 3] and call["medusa_dir"] is None
    assert (call["batch"], call["kv_len"], call["reps"], call["threads"]) == (2, 7, 3, 2)
    assert r["hardware"] == {"step_times": "measured", "model_dir": str(tmp_path / "t"),
                             "reps": 3, "stat": "min", "threads": 2}
    assert r["decode"]["t1_ms"] == pytest.approx(10.0)
    assert r["decode"]["tokens_per_s_ceiling"] == pytest.approx(200.0)
    point = r["speculation"]["points"][1]  # K = 2: two draft steps, verify T(3)
    assert (point["propose_ms"], point["verify_ms"]) == (pytest.approx(2.0), pytest.approx(12.0))
    with pytest.raises(SpecserveError, match="--measure --proposer medusa needs --medusa-dir"):
        predict(PredictConfig(config=str(tmp_path / "t"), measure=True, alpha=0.5))
    with pytest.raises(SpecserveError, match="--measure needs --config"):
        predict(PredictConfig(params=7e9, measure=True))


def test_measured_on_tiny_checkpoint(tiny_ckpt: Any) -> None:
    r = predict(PredictConfig(config=str(tiny_ckpt.target), measure=True, reps=1,
                              medusa_dir=str(tiny_ckpt.medusa), tau=2.0, draft_len=3,
                              tree_nodes=20))
    assert sorted(r["step_ms"], key=int) == ["1", "21"] and r["step_ms"]["21"] > 0
    assert r["speculation"]["propose_cost"] == "measured"
    assert r["speculation"]["chosen"]["propose_ms"] > 0


def test_schedule_batches_turn_speculation_down_then_off() -> None:
    """Roofline, 8B target, 1B draft, alpha 0.8 on an H100: verify gets compute-bound as the
    batch grows, so the best K falls and speculation stops paying (speedup < 1 -> K = 0)."""
    r = predict(PredictConfig(params=8e9, gpu="h100-sxm", alpha=0.8, proposer="draft",
                              draft_params=1e9, schedule_batches="512,1,128,8"))
    lv = r["schedule"]["levels"]
    assert [x["batch"] for x in lv] == [1, 8, 128, 512]
    ks = [x["k"] for x in lv]
    assert ks[0] >= ks[2] >= ks[3] and ks[0] > 1 and ks[3] == 0
    assert all((x["k"] == 0) == (x["speedup"] <= 1.0) for x in lv)
    sched = r["schedule"]["schedule"]
    assert sched.startswith(f"1:{ks[0]}") and sched.endswith("512:0")
    one = predict(PredictConfig(params=8e9, gpu="h100-sxm", alpha=0.8, proposer="draft",
                                draft_params=1e9, batch=128))
    assert lv[2]["speedup"] == pytest.approx(one["speculation"]["best"]["speedup"])


def test_schedule_batches_bad_input() -> None:
    with pytest.raises(SpecserveError, match="expected batch sizes"):
        predict(PredictConfig(params=8e9, alpha=0.8, schedule_batches="1,x"))
    with pytest.raises(SpecserveError, match="needs an acceptance"):
        predict(PredictConfig(params=8e9, schedule_batches="1,8"))
