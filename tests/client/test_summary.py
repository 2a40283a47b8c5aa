"""Summaries: throughput, goodput under SLOs, acceptance pooling, bootstrap speedup."""

from __future__ import annotations

import numpy as np
import pytest

from specserve.client.metrics import RequestRecord, make_record
from specserve.client.summary import (
    Slo,
    acceptance_of,
    bootstrap_speedup,
    parse_slo,
    per_request_values,
    speedups,
    summarize,
)
from specserve.errors import SpecserveError


def rec(variant: str = "spec", times: tuple[float, ...] = (0.1, 0.2, 0.3),
        tokens: tuple[int, ...] = (1, 2, 1), end: float | None = 0.3, error: str | None = None,
        server: dict[str, float | int] | None = None, spec_stats: dict | None = None,
        phase: str = "measure", index: int = 0) -> RequestRecord:
    return make_record(index=index, variant=variant, phase=phase, model=f"m-{variant}", url="u",
                       prompt_index=index, send_time_unix_s=0.0, streaming=True,
                       chunk_times_s=times, chunk_tokens=tokens, end_s=end,
                       token_count_source="server", server=server, spec_stats=spec_stats,
                       error=error)


def test_summarize_counts_errors_and_excludes_warmup() -> None:
    rs = [rec(index=0), rec(index=1, end=None, error="rejected", times=(), tokens=()),
          rec(index=2, phase="warmup"), rec(index=3, variant="baseline")]
    s = summarize(rs, "spec", duration_s=2.0)
    assert (s.requests, s.completed, s.errors, s.cancelled) == (2, 1, 1, 0)
    assert s.output_tokens == 4
    assert s.request_throughput_rps == pytest.approx(0.5)
    assert s.output_token_throughput_tok_s == pytest.approx(2.0)
    assert s.ttft_ms.mean == pytest.approx(100.0)
    assert s.tpot_ms.mean == pytest.approx(200.0 / 3)
    assert s.itl_ms.n == 3 and s.itl_chunk_ms.n == 2
    assert s.per_user_tok_s.mean == pytest.approx(4 / 0.3)
    assert s.goodput_rps is None
    d = s.to_dict()
    # chunk sizes after the prefill chunk: (2, 1)
    assert d["acceptance"]["tokens_per_step_histogram"] == {"1": 1, "2": 1}


def test_goodput_applies_every_slo() -> None:
    fast = rec(times=(0.05, 0.06), tokens=(1, 1), end=0.06, index=0)    # tpot 10 ms
    slow_first = rec(times=(0.5, 0.51), tokens=(1, 1), end=0.51, index=1)
    slow_tokens = rec(times=(0.05, 0.5), tokens=(1, 1), end=0.5, index=2)  # tpot 450 ms
    one_token = rec(times=(0.05,), tokens=(1,), end=0.05, index=3)       # no tpot: not violated
    failed = rec(end=None, error="x", index=4)
    rs = [fast, slow_first, slow_tokens, one_token, failed]
    s = summarize(rs, "spec", 1.0, parse_slo("ttft=100,tpot=50"))
    assert s.goodput_rps == pytest.approx(2.0)
    assert s.goodput_fraction == pytest.approx(2 / 5)
    assert Slo(e2e_ms=100).met_by(fast) and not Slo(e2e_ms=100).met_by(slow_first)


def test_parse_slo() -> None:
    assert parse_slo("ttft=200, tpot=50ms") == Slo(ttft_ms=200, tpot_ms=50)
    for bad in ("", "ttft", "itl=3", "ttft=abc", "tpot=-1"):
        with pytest.raises(SpecserveError, match="--slo"):
            parse_slo(bad)


def test_acceptance_pools_counts_and_positions() -> None:
    a = rec(tokens=(1, 3, 2), server={"total_draft_tokens": 9, "total_accepted_draft_tokens": 3,
                                      "acceptance_rate": 1 / 3},
            spec_stats={"steps": 3, "emitted_tokens": 6, "per_position_drafted": [3, 3, 3],
                        "per_position_accepted": [2, 1, 0], "accepted_nodes": {"0,0": 2}})
    b = rec(tokens=(2, 2, 2), server={"total_draft_tokens": 3, "total_accepted_draft_tokens": 3,
                                      "acceptance_rate": 1.0},
            spec_stats={"steps": 3, "emitted_tokens": 6, "per_position_drafted": [3],
                        "per_position_accepted": [3], "accepted_nodes": {"0,0": 1, "1,2": 1}})
    acc = acceptance_of([a, b, rec(error="e", end=None, server={"total_draft_tokens": 100})])
    assert acc.draft_tokens == 12 and acc.accepted_draft_tokens == 6
    assert acc.acceptance_rate == pytest.approx(0.5)
    assert acc.mean_request_acceptance_rate == pytest.approx((1 / 3 + 1) / 2)
    assert acc.tau_stream == pytest.approx((3 + 2 + 2 + 2) / 4)  # first chunks are prefill
    assert acc.tau_server == pytest.approx(12 / 6)
    assert (acc.steps, acc.emitted_tokens) == (6, 12)
    # accepted at position k over all 6 steps (docs/architecture.md, tune-tree input), and
    # given that position k was drafted
    assert acc.per_position_acceptance == pytest.approx((5 / 6, 1 / 6, 0.0))
    assert acc.per_position_acceptance_given_drafted == pytest.approx((5 / 6, 1 / 3, 0.0))
    assert acc.tokens_per_step_histogram == {2: 3, 3: 1}
    assert acc.accepted_nodes == {"0,0": 3, "1,2": 1}


def test_acceptance_without_server_figures_is_none() -> None:
    acc = acceptance_of([rec()])
    assert acc.acceptance_rate is None and acc.tau_server is None
    assert acc.per_position_acceptance == ()


def test_bootstrap_speedup_covers_the_true_ratio() -> None:
    # Seeded: spec latencies ~ 50 ms, baseline ~ 100 ms, true speedup 2.0.
    rng = np.random.default_rng(1)
    spec = rng.normal(0.05, 0.005, 200).tolist()
    base = rng.normal(0.10, 0.01, 200).tolist()
    s = bootstrap_speedup(spec, base, higher_is_better=False, seed=3)
    assert s is not None
    assert s.speedup == pytest.approx(np.mean(base) / np.mean(spec))
    assert s.ci_low < s.speedup < s.ci_high
    assert s.ci_low < 2.0 < s.ci_high
    assert s.ci_high - s.ci_low < 0.1  # 200 samples, 10% noise: the CI is narrow
    assert bootstrap_speedup(spec, base, False, seed=3) == s  # deterministic for a seed
    up = bootstrap_speedup(base, spec, higher_is_better=True, seed=3)
    assert up is not None and up.speedup == pytest.approx(s.speedup)
    assert bootstrap_speedup([], base, False) is None


def test_speedups_over_records() -> None:
    rs = []
    for i in range(20):
        rs.append(rec("spec", times=(0.01, 0.02), tokens=(1, 3), end=0.02 + 0.001 * i, index=i))
        rs.append(rec("baseline", times=(0.01, 0.02, 0.03, 0.04), tokens=(1, 1, 1, 1),
                      end=0.04 + 0.001 * i, index=100 + i))
    sp = speedups(rs, seed=0, n_boot=500)
    assert set(sp) == {"ttft_s", "tpot_s", "itl_s", "e2e_s", "per_user_tok_s"}
    e2e_spec = np.mean(per_request_values([r for r in rs if r.variant == "spec"], "e2e_s"))
    e2e_base = np.mean(per_request_values([r for r in rs if r.variant == "baseline"], "e2e_s"))
    assert sp["e2e_s"].speedup == pytest.approx(e2e_base / e2e_spec)
    assert sp["itl_s"].speedup == pytest.approx(0.01 / (0.01 / 3))


def test_bootstrap_survives_resamples_of_zero_tpot() -> None:
    """A request whose tokens all came in one chunk can have TPOT 0; resamples of only such
    requests give an infinite ratio, which must not warn (warnings are errors) or poison the CI."""
    from specserve.client.summary import bootstrap_speedup

    sp = bootstrap_speedup([0.0, 0.0, 0.002], [0.003, 0.003, 0.003], higher_is_better=False,
                           metric="tpot_s", n_boot=500, seed=0)
    assert sp is not None and sp.speedup == pytest.approx(0.003 / (0.002 / 3))
    assert sp.ci_low <= sp.speedup <= sp.ci_high
