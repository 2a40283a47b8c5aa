"""``specserve predict`` and context length (issue 33 item 2): the verify step's cost depends on
the context (roofline KV bytes; the timed forward's attention with --measure), a table per
context, and the check of the predicted verify step against a measured
``bench --sweep --input-lengths`` summary, cell by cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.predict import PredictConfig, cell_prediction, predict, verify_check

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


def _cell(n: int, c: int, spec_ms: float, base_ms: float) -> dict[str, Any]:
    return {"input_length": n, "concurrency": c, "spec": {"step_ms": spec_ms},
            "baseline": {"step_ms": base_ms}}


def test_cell_prediction_adds_the_serving_overhead_to_the_verify_forward() -> None:
    row = cell_prediction(_cell(256, 4, 6.0, 5.0), 5, 0.003, 0.004)
    assert row["overhead_ms"] == pytest.approx(2.0)           # 5 ms baseline step - T(1)
    assert row["predicted_step_ms"] == pytest.approx(6.0)     # T(5) + overhead
    assert row["relative_error"] == pytest.approx(0.0)
    fixed = cell_prediction(_cell(256, 4, 6.0, 5.0), 5, 0.003, 0.004, overhead_s=0.0005)
    assert fixed["predicted_step_ms"] == pytest.approx(4.5)
    assert fixed["relative_error"] == pytest.approx(-0.25)
    with pytest.raises(SpecserveError, match="no measured step_ms"):
        cell_prediction(_cell(256, 4, 6.0, 5.0) | {"spec": {}}, 5, 0.003, 0.004)


def _sweep(tmp_path: Path, cells: list[dict[str, Any]]) -> str:
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps({"config": {"max_tokens": 64}, "input_lengths": [128, 2048],
                             "levels": cells}))
    return str(p)


def test_verify_check_per_cell_with_the_roofline(tmp_path: Path) -> None:
    cfg = PredictConfig(config=_config(tmp_path), gpu="h100-sxm", proposer="ngram",
                        draft_len=4)
    # measured steps: the short cells as the model says (+1 ms serving overhead), the long
    # context cell of batch 16 twice as slow as predicted
    probe = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": _sweep(tmp_path, [
        _cell(128, 1, 1.0, 1.0), _cell(2048, 1, 1.0, 1.0), _cell(128, 16, 1.0, 1.0),
        _cell(2048, 16, 1.0, 1.0)])}))
    t = {(r["input_length"], r["concurrency"]): (r["t1_ms"], r["t_verify_ms"])
         for r in probe["per_cell"]}
    assert probe["context_offset"] == 32 and probe["n_verify"] == 5
    assert t[(2048, 16)][1] > t[(128, 16)][1]                      # context term in T(5)
    cells = [_cell(n, c, t[(n, c)][1] + 1.0, t[(n, c)][0] + 1.0) for n, c in t]
    cells[-1]["spec"]["step_ms"] *= 2
    out = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": _sweep(tmp_path, cells)}))
    errs = {(r["input_length"], r["concurrency"]): r["relative_error"] for r in out["per_cell"]}
    assert all(abs(e) < 1e-9 for k, e in errs.items() if k != (2048, 16))
    assert errs[(2048, 16)] == pytest.approx(-0.5)
    assert [x.split(":")[0] for x in out["outside"]] == ["per_cell", "from_shortest"]
    assert "c=16 L=2048" in out["outside"][0]


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
