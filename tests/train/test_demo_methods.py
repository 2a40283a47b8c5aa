"""The demo's side-by-side table of the methods demo-model measured (specserve.demo)."""

from __future__ import annotations

import json
from pathlib import Path

from specserve.demo import offline_lines, offline_methods


def test_offline_table_lists_every_measured_method_and_marks_the_fastest(tmp_path: Path) -> None:
    ev = {"baseline_tokens_per_s": 400.0, "fastest_method": "eagle3",
          "medusa": {"tau": 3.1, "tokens_per_s": 380.0, "top1_accuracy": [0.8]},
          "medusa_tuned": {"tau": 2.9, "tokens_per_s": 420.0},
          "draft": {"tau": 4.4, "tokens_per_s": 470.0},
          "eagle3": {"tau": 4.1, "tokens_per_s": 520.0},
          "ngram": {"tau": 1.6, "tokens_per_s": 300.0},
          "train": {"tau": 9.0, "tokens_per_s": 1.0}}  # not a method
    p = tmp_path / "eval.json"
    p.write_text(json.dumps(ev))
    off = offline_methods(str(p))
    assert list(off["methods"]) == ["medusa", "medusa_tuned", "draft", "eagle3", "ngram"]
    assert off["methods"]["eagle3"] == {"tau": 4.1, "tokens_per_s": 520.0}
    lines = offline_lines(off)
    assert len(lines) == 6 and "400 tok/s" in lines[0]
    assert [ln for ln in lines if "fastest" in ln] == [
        "  eagle3        tau 4.10    520.0 tok/s  <- fastest"]
    assert offline_methods(str(tmp_path / "none.json")) == {} and offline_lines({}) == []
    p.write_text(json.dumps({"medusa": {"tau_replay": 3.0}}))  # replay only: nothing measured
    assert offline_methods(str(p)) == {}
