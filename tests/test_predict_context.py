"""``specserve predict`` and context length: the verify step's cost depends on
the context (roofline KV bytes; the timed forward's attention with --measure), a table per
context, and the check of the predicted verify step against a measured
``bench --sweep --input-lengths`` summary, cell by cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve import predict_sweep as sweep_flow
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.predict import PredictConfig, predict
from specserve.predict_sweep import CellTimes, ContextFit, cell_prediction, verify_check

LLAMA8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256}


def _config(tmp_path: Path) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA8B))
    return str(p)


def test_verify_cost_grows_with_context(tmp_path: Path) -> None:
    """At batch 256 a short-context verify of 5 tokens is compute-bound (about 4x a decode
    step: speculation loses); at 32k the KV reads dominate both steps and it pays again (vLLM
    RFC #48627's observation, from the roofline)."""
    r = predict(PredictConfig(config=_config(tmp_path), gpu="h100-sxm", batch=256,
                              proposer="ngram", alpha=0.7, draft_len=4,
                              context_lengths="128,4096,32768"))
    rows = r["context"]
    assert [x["context"] for x in rows] == [128, 4096, 32768]
    t1 = [x["t1_ms"] for x in rows]
    tv = [x["verify_ms"] for x in rows]
    assert t1[0] < t1[1] < t1[2] and tv[0] < tv[1] < tv[2]
    # KV bytes: 2 * 32 layers * 8 heads * 128 dims * 2 B = 128 KiB a token, 256 sequences
    kv = 256 * 32768 * 131072 / 3.35e12 * 1e3
    assert t1[2] - t1[1] == pytest.approx(kv * (1 - 4096 / 32768), rel=1e-6)
    assert rows[0]["verify_cost_ratio"] > 3 and rows[2]["verify_cost_ratio"] < 1.1
    assert rows[0]["speedup"] < 1 < rows[2]["speedup"]


def _cell(n: int, c: int, spec_ms: float, base_ms: float, tau: float = 2.0) -> dict[str, Any]:
    return {"input_length": n, "concurrency": c, "spec": {"step_ms": spec_ms, "tau": tau},
            "baseline": {"step_ms": base_ms}}


def test_cell_prediction_adds_overhead_and_the_prefill_share() -> None:
    """Spec step = T(5) + o + (c - 1) P / S_spec, o = base step - T(1) - (c - 1) P / S_base:
    4 ms + 1 ms + 3 * 6 ms / 31.5 steps (M = 64, tau 2); the baseline's share is 3 * 6 / 63."""
    times = CellTimes(t1_s=0.003, t_verify_s=0.004, prefill_s=0.006)
    base = 3.0 + 1.0 + 3 * 6.0 / 63
    spec = 4.0 + 1.0 + 3 * 6.0 / 31.5
    row = cell_prediction(_cell(256, 4, spec, base), 5, times, 64)
    assert row["overhead_ms"] == pytest.approx(1.0)
    assert row["prefill_share_ms"] == pytest.approx(3 * 6.0 / 31.5)
    assert row["relative_error"] == pytest.approx(0.0)
    fixed = cell_prediction(_cell(256, 4, spec, base), 5, times, 64, overhead_s=0.0)
    assert fixed["predicted_step_ms"] == pytest.approx(spec - 1.0)
    alone = cell_prediction(_cell(256, 1, 5.0, 4.0), 5, times, 64)   # c = 1: no share
    assert alone["prefill_share_ms"] == 0 and alone["relative_error"] == pytest.approx(0.0)
    measured = _cell(256, 4, spec, base)
    measured["spec"]["steps_mean"] = 21.0                            # measured steps win
    assert cell_prediction(measured, 5, times, 64)["prefill_share_ms"] == pytest.approx(18 / 21)
    with pytest.raises(SpecserveError, match="no measured step_ms"):
        cell_prediction(_cell(256, 4, 6.0, 5.0) | {"spec": {}}, 5, times, 64)


def test_served_prefill_comes_from_the_baseline_stalls() -> None:
    """With the baseline's median step the prefill is the one the serving path paid: its
    stall per step (8 - 5 ms) times its 63 steps over the 3 other requests = 63 ms, not the
    6 ms timed; the speculative step then carries it over its 21 steps: 5 ms median baseline
    step - T(1) + T(5) + 3 * 63 / 21."""
    times = CellTimes(t1_s=0.003, t_verify_s=0.004, prefill_s=0.006)
    cell = _cell(512, 4, 15.0, 8.0)
    cell["baseline"] |= {"step_ms_p50": 5.0, "steps_mean": 63.0}
    cell["spec"]["steps_mean"] = 21.0
    row = cell_prediction(cell, 5, times, 64)
    assert (row["prefill_source"], row["prefill_ms"]) == ("served", pytest.approx(63.0))
    assert row["prefill_timed_ms"] == pytest.approx(6.0)
    assert row["overhead_ms"] == pytest.approx(2.0)
    assert row["predicted_step_ms"] == pytest.approx(5.0 - 3.0 + 4.0 + 9.0)
    alone = _cell(512, 1, 5.0, 4.0)
    alone["baseline"]["step_ms_p50"] = 3.0                            # c = 1: no prefills
    assert cell_prediction(alone, 5, times, 64)["prefill_source"] == "timed"


def test_context_fit_is_linear_between_the_timed_contexts() -> None:
    fit = ContextFit(160, 0.002, 480, 0.004)
    assert fit.per_token_s == pytest.approx(0.002 / 320)
    assert fit.at(320) == pytest.approx(0.003) and fit.at(160) == 0.002
    assert ContextFit(160, 0.002, 160, 0.002).at(999) == 0.002


def _sweep(tmp_path: Path, cells: list[dict[str, Any]]) -> str:
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps({"config": {"max_tokens": 64}, "input_lengths": [128, 2048],
                             "levels": cells}))
    return str(p)


def _model_cells(times: dict[tuple[int, int], CellTimes], o_ms: float,
                 tau: float) -> list[dict[str, Any]]:
    """Cells whose measured steps follow the model exactly: T + o + (c - 1) P / S."""
    out = []
    for (c, n), t in times.items():
        base = (t.t1_s + (c - 1) * t.prefill_s / 63) * 1e3 + o_ms
        spec = (t.t_verify_s + (c - 1) * t.prefill_s / (63 / tau)) * 1e3 + o_ms
        out.append(_cell(n, c, spec, base, tau))
    return out


def test_verify_check_per_cell_with_the_roofline(tmp_path: Path) -> None:
    """Steps that follow the model are predicted exactly at every cell, both ways; a cell
    twice as slow is flagged. Without the prefill share (the term dropped) the long-context
    cells at batch 16 would be off by far more than 20%: the check would fail."""
    cfg = PredictConfig(config=_config(tmp_path), gpu="h100-sxm", proposer="ngram",
                        draft_len=4)
    probe = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": _sweep(tmp_path, [
        _cell(n, c, 1.0, 1.0) for n in (128, 2048) for c in (1, 16)])}))
    assert probe["context_offset"] == 32 and probe["n_verify"] == 5
    t = {(r["concurrency"], r["input_length"]): CellTimes(r["t1_ms"] / 1e3,
                                                         r["t_verify_ms"] / 1e3,
                                                         r["prefill_ms"] / 1e3)
         for r in probe["per_cell"]}
    assert t[(16, 2048)].t_verify_s > t[(16, 128)].t_verify_s       # context term in T(5)
    assert t[(1, 2048)].prefill_s > 3 * t[(1, 128)].prefill_s         # prefill of L tokens
    cells = _model_cells(t, 1.0, tau=3.0)
    cells[-1]["spec"]["step_ms"] *= 2
    out = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": _sweep(tmp_path, cells)}))
    for name in ("per_cell", "from_shortest"):
        errs = {(r["concurrency"], r["input_length"]): r["relative_error"] for r in out[name]}
        assert all(abs(e) < 1e-9 for k, e in errs.items() if k != (16, 2048)), (name, errs)
        assert errs[(16, 2048)] == pytest.approx(-0.5)
    assert [x.split(":")[0] for x in out["outside"]] == ["per_cell", "from_shortest"]
    assert "c=16 L=2048" in out["outside"][0]
    busy = next(r for r in out["per_cell"] if (r["concurrency"], r["input_length"]) == (16, 2048))
    assert busy["prefill_share_ms"] > 0.2 * busy["predicted_step_ms"]  # the term matters


def test_measured_cell_times_interpolate_two_contexts(tiny_ckpt: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--measure times the forward at the shortest and longest context per concurrency only
    (the middle length interpolated) and each length's prefill once, on the real timer."""
    calls: list[tuple[int, int, tuple[int, ...]]] = []
    real = sweep_flow.measure_step_times

    def spy(model_dir: Path, ns: list[int], **kw: Any) -> dict[str, Any]:
        calls.append((kw["batch"], kw["kv_len"], tuple(kw["prefill_lens"])))
        return real(model_dir, ns, **kw)

    monkeypatch.setattr(sweep_flow, "measure_step_times", spy)
    cfg = PredictConfig(config=str(tiny_ckpt.target), measure=True, reps=1, draft_len=2)
    times = sweep_flow.cell_times(cfg, [1, 2], [8, 16, 24], 4, 3)
    assert calls == [(1, 12, (8, 16, 24)), (1, 28, ()), (2, 12, ()), (2, 28, ())]
    assert set(times) == {(c, n) for c in (1, 2) for n in (8, 16, 24)}
    mid, lo, hi = times[(2, 16)], times[(2, 8)], times[(2, 24)]
    assert mid.t_verify_s == pytest.approx((lo.t_verify_s + hi.t_verify_s) / 2)
    assert all(t.prefill_s > 0 for t in times.values())
    assert times[(1, 24)].prefill_s == times[(2, 24)].prefill_s


@pytest.mark.parametrize("levels, kw, why", [
    ([{"concurrency": 1, "spec": {}, "baseline": {}}], {"draft_len": 4},
     "not a `specserve bench --sweep --input-lengths` summary"),
    ([_cell(128, 1, 1.0, 1.0)], {}, "--sweep needs --draft-len"),
])
def test_bad_sweep_input_is_one_line(tmp_path: Path, levels: list[Any], kw: dict[str, Any],
                                     why: str) -> None:
    cfg = PredictConfig(config=_config(tmp_path), proposer="ngram",
                        sweep=_sweep(tmp_path, levels), **kw)
    with pytest.raises(SpecserveError, match=why):
        verify_check(cfg)


def test_cli_context_lengths_one_line_on_bad_input(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["predict", "--config", _config(tmp_path), "--alpha", "0.7",
                                 "--proposer", "ngram", "--context-lengths", "a,b"])
    assert r.exit_code == 2 and "--context-lengths" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["predict", "--config", _config(tmp_path), "--alpha", "0.7",
                                 "--proposer", "ngram", "--draft-len", "4",
                                 "--context-lengths", "128,8192"])
    assert r.exit_code == 0 and "context 8192: T(1)" in r.output, r.output
