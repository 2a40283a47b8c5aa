"""Metrics math on synthetic timelines; percentiles checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserve.client.metrics import (
    Distribution,
    RequestRecord,
    derive_timing,
    make_record,
    percentile,
)


def test_multi_token_chunks_divide_the_gap_over_their_tokens() -> None:
    # chunks at 0.1 (1 token), 0.3 (4 tokens), 0.35 (2 tokens); final response at 0.4
    t = derive_timing([0.1, 0.3, 0.35], [1, 4, 2], end_s=0.4)
    assert t.ttft_s == pytest.approx(0.1)
    assert t.e2e_s == pytest.approx(0.4)
    assert t.output_tokens == 7
    assert t.tpot_s == pytest.approx((0.4 - 0.1) / 6)
    assert t.itl_token_s == pytest.approx([0.05] * 4 + [0.025] * 2)
    assert t.itl_chunk_s == pytest.approx([0.2, 0.05])
    # per-token ITL sums to the time between first and last chunk
    assert math.fsum(t.itl_token_s) == pytest.approx(0.35 - 0.1)


def test_first_chunk_with_several_tokens_gets_no_itl_for_its_extra_tokens() -> None:
    t = derive_timing([0.2, 0.5], [3, 3], end_s=0.5)
    assert t.itl_token_s == pytest.approx([0.1, 0.1, 0.1])
    assert t.tpot_s == pytest.approx(0.3 / 5)


def test_single_chunk_has_no_itl_but_a_tpot() -> None:
    t = derive_timing([0.25], [5], end_s=0.26)
    assert t.ttft_s == pytest.approx(0.25)
    assert t.itl_token_s == () and t.itl_chunk_s == ()
    assert t.tpot_s == pytest.approx(0.01 / 4)


def test_one_token_has_no_tpot() -> None:
    t = derive_timing([0.05], [1], end_s=0.06)
    assert t.output_tokens == 1 and t.tpot_s is None and t.itl_token_s == ()


def test_no_tokens_and_zero_token_chunks() -> None:
    assert derive_timing([], [], end_s=0.3).ttft_s is None
    t = derive_timing([0.1, 0.2, 0.4], [0, 2, 1], end_s=0.5)  # empty first response ignored
    assert t.ttft_s == pytest.approx(0.2) and t.output_tokens == 3
    assert t.itl_token_s == pytest.approx([0.2])


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(ValueError):
        derive_timing([0.1], [1, 2], end_s=1.0)


def _rec(**kw: object) -> RequestRecord:
    base: dict[str, object] = dict(index=0, variant="spec", phase="measure", model="m",
                                   url="u", prompt_index=0, send_time_unix_s=1.0, streaming=True,
                                   chunk_times_s=[0.1, 0.2], chunk_tokens=[1, 2], end_s=0.2,
                                   token_count_source="server")
    base.update(kw)
    return make_record(**base)  # type: ignore[arg-type]


def test_record_status_and_round_trip() -> None:
    ok = _rec()
    assert ok.status == "completed" and ok.tokens_per_step == (2,)  # first chunk: prefill
    assert RequestRecord.from_dict(ok.to_dict()) == ok
    err = _rec(error="boom", end_s=None, chunk_times_s=[0.1], chunk_tokens=[1])
    assert err.status == "error" and err.error == "boom" and err.e2e_s is None
    assert err.output_tokens == 1  # partial output is kept
    assert _rec(cancelled=True, end_s=None).status == "cancelled"
    with pytest.raises(ValueError):
        _rec(end_s=None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
       st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)),
                                                  rel=1e-9, abs=1e-6)


def test_percentile_bad_input() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_against_numpy() -> None:
    rng = np.random.default_rng(0)
    xs = rng.lognormal(size=257).tolist()
    d = Distribution.of(xs)
    assert d.n == 257
    assert d.mean == pytest.approx(float(np.mean(xs)))
    for q, v in ((50, d.p50), (90, d.p90), (99, d.p99)):
        assert v == pytest.approx(float(np.percentile(xs, q)))
    ms = d.scaled(1e3)
    assert ms.p99 == pytest.approx(float(np.percentile(xs, 99)) * 1e3)
    assert Distribution.of([]).mean is None
