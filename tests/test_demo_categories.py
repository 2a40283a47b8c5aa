"""``specserve demo`` reports several categories: the code prompts eval.json's served
tau is for come first and unchanged, prose and structured prompts follow, and the tau check
reads the code category."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.client.datasets import load_prompts
from specserve.demo import DemoRunConfig, demo_prompts, served_tau, summary_lines, tau_check


def test_demo_prompts_keep_the_served_code_prompts_first() -> None:
    cfg = DemoRunConfig(repo="r", out="o")
    ps = demo_prompts(cfg)
    n = cfg.warmup + cfg.requests
    assert ps[:n] == load_prompts(None, "builtin-code", n, 0)   # what eval.json measured
    extra = ps[n:]
    assert [p.category for p in extra] == (["prose"] * cfg.extra_per_category
                                           + ["structured"] * cfg.extra_per_category)
    assert all(p.max_tokens == cfg.extra_max_tokens for p in extra)


def _summary(code_tau: float, all_tau: float) -> dict:
    spec = {"tau": code_tau, "tau_server": code_tau, "tau_stream": None}
    return {"variants": {"spec": {"acceptance": {"tau_server": all_tau}},
                         "baseline": {}},
            "categories": {"code": {"variants": {"spec": spec}, "speedup": {}},
                           "prose": {"variants": {"spec": {**spec, "tau": 1.5,
                                                           "tau_server": 1.5}},
                                     "speedup": {}}}}


def test_tau_check_reads_the_code_category(tmp_path: Path) -> None:
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"medusa": {"tau": 3.0}}))
    s = _summary(3.1, 2.2)
    assert served_tau(s) == (3.1, "code")
    check = tau_check(s, None, str(ev), 0.1)
    assert check["ok"] is True and check["tau_served_category"] == "code"
    one = {"variants": {"spec": {"acceptance": {"tau_server": 2.2}}},
           "categories": {"code": {"variants": {"spec": {"tau_server": 3.1}}}}}
    assert served_tau(one) == (2.2, "all")  # one category: the whole run


def test_summary_lines_list_each_categorys_tau() -> None:
    s = _summary(3.1, 2.2)
    for v in ("spec", "baseline"):
        s["variants"][v] = {"ttft_ms": {"mean": 1.0, "p50": 1.0},
                            "tpot_ms": {"mean": 1.0, "p50": 1.0},
                            "per_user_tok_s": {"mean": 1.0},
                            "acceptance": {"tau_server": 2.2, "acceptance_rate": 0.5}}
    lines = summary_lines(s, {"tau_eval": None})
    assert any(x.split() == ["code", "tau", "3.10", "speedup", "tokens/s/user", "n/a"]
               for x in lines)
    assert any(x.split()[:3] == ["prose", "tau", "1.50"] for x in lines)


@pytest.mark.parametrize("field, value", [("extra_per_category", -1), ("extra_max_tokens", 0)])
def test_bad_extra_counts_are_refused(tmp_path: Path, field: str, value: int) -> None:
    from specserve.errors import SpecserveError

    (tmp_path / "ensemble_baseline").mkdir()
    with pytest.raises(SpecserveError, match="extra_"):
        DemoRunConfig(repo=str(tmp_path), out="o", **{field: value}).validate()
