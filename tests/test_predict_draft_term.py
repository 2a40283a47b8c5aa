"""The draft model's propose term in ``specserve predict --sweep``: a
draft-model step runs K sequential one-token draft forwards before the verify forward, so the
predicted speculative step is ``T(K + 1) + K * T_d(c, ctx) + o + prefill share``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specserve import predict_sweep as sweep_flow
from specserve.predict import PredictConfig
from specserve.predict_sweep import CellTimes, cell_prediction, propose_s, verify_check
from specserve.spec import predictor as P

TARGET = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
          "vocab_size": 128256}
DRAFT = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
         "vocab_size": 128256, "tie_word_embeddings": True}  # Llama-3.2-1B's shapes


def _write(tmp_path: Path, name: str, cfg: dict[str, Any]) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


def _cell(n: int, c: int, spec_ms: float, base_ms: float, tau: float = 2.0) -> dict[str, Any]:
    return {"input_length": n, "concurrency": c, "spec": {"step_ms": spec_ms, "tau": tau},
            "baseline": {"step_ms": base_ms}}


def test_propose_is_k_sequential_draft_forwards() -> None:
    assert propose_s("draft", 4, 0.002) == pytest.approx(0.008)
    assert propose_s("draft", 1, 0.002) == pytest.approx(0.002)
    assert propose_s("ngram", 4, 0.002) == 0.0
    assert propose_s("draft", 0, 0.002) == 0.0


def test_cell_prediction_adds_the_draft_forwards() -> None:
    """c = 1 (no prefill share): spec step = base step - T(1) + T(5) + 4 T_d = 4 - 3 + 4 + 8."""
    times = CellTimes(t1_s=0.003, t_verify_s=0.004, prefill_s=0.006, propose_s=0.008,
                      draft_step_s=0.002)
    row = cell_prediction(_cell(256, 1, 13.0, 4.0), 5, times, 64)
    assert row["propose_ms"] == pytest.approx(8.0) and row["draft_step_ms"] == 2.0
    assert row["predicted_step_ms"] == pytest.approx(13.0)
    assert row["relative_error"] == pytest.approx(0.0)


def test_the_draft_term_follows_its_roofline_per_cell(tmp_path: Path) -> None:
    """Without --measure each cell's T_d is the draft's roofline at that batch and context: at
    batch 1 memory-bound, its weight bytes (plus its KV) over the bandwidth; it grows with the
    context (KV reads) and the K forwards are summed. Cells that follow the model exactly are
    predicted exactly; the same cells predicted without the term are off by more than 20%."""
    cfg = PredictConfig(config=_write(tmp_path, "t.json", TARGET), gpu="h100-sxm",
                        proposer="draft", draft_config=_write(tmp_path, "d.json", DRAFT),
                        draft_len=4, dtype="bf16")
    times = sweep_flow.cell_times(cfg, [1, 16], [128, 2048], 32, 5)
    hw = P.hardware_for(P.GPUS["h100-sxm"], "bf16")
    draft = P.shape_from_hf_config(DRAFT)
    weights_s = draft.params * 2.0 / hw.bandwidth_bytes_per_s
    one = times[(1, 128)]
    assert weights_s < one.draft_step_s < 1.05 * weights_s           # memory-bound, KV small
    assert one.propose_s == pytest.approx(4 * one.draft_step_s)
    assert times[(16, 2048)].draft_step_s > times[(16, 128)].draft_step_s  # its KV reads
    assert times[(16, 128)].draft_step_s > times[(1, 128)].draft_step_s
    cells = []
    for (c, n), t in times.items():   # o = 1 ms; steps follow the model with the draft term
        base = (t.t1_s + (c - 1) * t.prefill_s / 63) * 1e3 + 1.0
        spec = (t.t_verify_s + t.propose_s
                + (c - 1) * (t.prefill_s + t.draft_prefill_s) / 31.5) * 1e3 + 1.0
        cells.append(_cell(n, c, spec, base))
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps({"config": {"max_tokens": 64}, "levels": cells}))
    out = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": str(p)}))
    assert all(abs(r["relative_error"]) < 1e-9 for r in out["per_cell"]), out["per_cell"]
    assert out["outside"] == []
    ngram = verify_check(PredictConfig(**{**cfg.__dict__, "sweep": str(p), "proposer": "ngram"}))
    assert len(ngram["outside"]) >= 4                                 # the term dropped


def test_measured_draft_forward_is_timed_at_both_contexts(tiny_ckpt: Any) -> None:
    """--measure --proposer draft times the draft's one-token forward beside the target's,
    per concurrency at the shortest and longest context, and interpolates the middle."""
    cfg = PredictConfig(config=str(tiny_ckpt.target), measure=True, reps=2, draft_len=2,
                        proposer="draft", draft_config=str(tiny_ckpt.draft))
    times = sweep_flow.cell_times(cfg, [1, 2], [8, 16, 24], 4, 3)
    for t in times.values():
        assert t.draft_step_s > 0 and t.propose_s == pytest.approx(2 * t.draft_step_s)
    lo, mid, hi = times[(2, 8)], times[(2, 16)], times[(2, 24)]
    assert mid.draft_step_s == pytest.approx((lo.draft_step_s + hi.draft_step_s) / 2)
    with pytest.raises(Exception, match="--draft-config"):
        sweep_flow.cell_times(PredictConfig(**{**cfg.__dict__, "draft_config": None}),
                              [1], [8], 4, 3)
