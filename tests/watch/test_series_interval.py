"""Reading each engine's exposition text (tests/data/watch/README.md says where each sample
comes from) and turning scrapes into intervals: deltas, resets, workers summed."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.client.acceptance import parse_prometheus
from specserve.triton.spec_counters import SpecCounters, increments
from specserve.watch import series
from specserve.watch.interval import combine, delta
from specserve.watch.series import Totals, read_totals

DATA = Path(__file__).resolve().parents[1] / "data"


def sample(name: str) -> dict:  # type: ignore[type-arg]
    return parse_prometheus((DATA / name).read_text())


def test_specserve_sample_from_the_real_triton_server() -> None:
    s = sample("watch/specserve_metrics.txt")
    assert series.detect(s) == ["specserve"]
    t = read_totals(s, "specserve")
    # three 12-token requests, draft = target: 9 verify steps, 24 drafted, all accepted, three
    # updates begun and done
    assert t == Totals("specserve", 9.0, 24.0, 24.0, (6.0, 6.0, 6.0, 6.0), begun=3.0, done=3.0)
    assert series.settled(t, t)  # three whole updates: the seqlock pair equal


def test_vllm_real_capture_interval() -> None:
    before = read_totals(sample("openai/vllm_metrics_before.txt"), "vllm")
    after = read_totals(sample("openai/vllm_metrics_after.txt"), "vllm")
    assert before is not None and after is not None
    assert after.drafts == 52 and after.draft_tokens == 208 and after.accepted == 84
    assert after.created is not None
    iv = combine([delta(before, after)])
    assert iv.resets == 0
    assert iv.acceptance_rate == pytest.approx(84 / 208)
    assert iv.tau == pytest.approx(1 + 84 / 52)
    assert sum(iv.per_pos) == 84 and len(iv.per_pos) == 4


def test_trtllm_counters_and_acceptance_length_gauge() -> None:
    b = read_totals(sample("watch/trtllm_metrics_before.txt"), "trtllm")
    a = read_totals(sample("watch/trtllm_metrics_after.txt"), "trtllm")
    assert series.detect(sample("watch/trtllm_metrics_after.txt")) == ["trtllm"]
    assert b is not None and a is not None and a.drafts is None
    iv = combine([delta(b, a)])
    assert iv.draft_tokens == 600 and iv.accepted == 30
    assert iv.acceptance_rate == pytest.approx(0.05)
    assert iv.tau == pytest.approx(1.15)  # no step count: the gauge


def test_sglang_gauges_with_generated_tokens_as_activity() -> None:
    b = read_totals(sample("watch/sglang_metrics_before.txt"), "sglang")
    a = read_totals(sample("watch/sglang_metrics_after.txt"), "sglang")
    assert b is not None and a is not None
    iv = combine([delta(b, a)])
    assert iv.activity == 600
    assert iv.acceptance_rate == pytest.approx(0.02) and iv.tau == pytest.approx(1.05)


def test_no_speculative_series_is_none() -> None:
    s = parse_prometheus('nv_inference_request_success{model="m",version="1"} 3\n')
    assert series.detect(s) == []
    assert all(read_totals(s, e) is None for e in series.ENGINES)


def test_counter_that_goes_down_is_a_reset_counted_from_zero() -> None:
    prev = Totals("vllm", 1000, 4000, 3000, (900, 800))
    cur = Totals("vllm", 10, 40, 2, (2, 0))
    d = delta(prev, cur)
    assert d.reset and (d.drafts, d.draft_tokens, d.accepted, d.per_pos) == (10, 40, 2, (2, 0))
    iv = combine([d])
    assert iv.resets == 1 and iv.acceptance_rate == pytest.approx(2 / 40)


def test_changed_created_time_is_a_reset_even_when_counts_grew() -> None:
    prev = Totals("vllm", 10, 40, 30, created=100.0)
    cur = Totals("vllm", 50, 200, 20, created=200.0)
    d = delta(prev, cur)
    assert d.reset and d.draft_tokens == 200 and d.accepted == 20


def test_workers_are_summed_not_averaged() -> None:
    w0 = delta(Totals("vllm", 0, 0, 0), Totals("vllm", 100, 400, 360))
    w1 = delta(Totals("vllm", 0, 0, 0), Totals("vllm", 10, 40, 0))
    iv = combine([w0, w1])
    assert iv.workers == 2 and iv.draft_tokens == 440 and iv.accepted == 360
    assert iv.acceptance_rate == pytest.approx(360 / 440)
    assert iv.tau == pytest.approx(1 + 360 / 110)


def test_gauges_of_several_workers_weighted_by_activity() -> None:
    w0 = delta(Totals("sglang", None, None, None, tokens=0), Totals(
        "sglang", None, None, None, tokens=300, gauge_tau=3.0, gauge_rate=0.6))
    w1 = delta(Totals("sglang", None, None, None, tokens=0), Totals(
        "sglang", None, None, None, tokens=100, gauge_tau=1.0, gauge_rate=0.0))
    iv = combine([w0, w1])
    assert iv.tau == pytest.approx(2.5) and iv.acceptance_rate == pytest.approx(0.45)


def test_exporter_increments_match_acceptance_stats() -> None:
    from specserve.spec.stats import AcceptanceStats

    st = AcceptanceStats()
    st.observe(4, 4)
    st.observe(4, 1)
    st.observe(2, 0)
    incs = {(i.name, i.labels): i.value for i in increments(st.to_dict())}
    assert incs[("specserve:spec_decode_num_drafts_total", ())] == 3
    assert incs[("specserve:spec_decode_num_draft_tokens_total", ())] == 10
    assert incs[("specserve:spec_decode_num_accepted_tokens_total", ())] == 5
    per_pos = "specserve:spec_decode_num_accepted_tokens_per_pos_total"
    assert [incs[(per_pos, (("position", str(k)),))] for k in range(4)] == [2, 1, 1, 1]
    assert increments(AcceptanceStats().to_dict()) == []  # speculation off: nothing


class _Counter:
    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self.name, self.labels, self.value = name, labels, 0

    def increment(self, v: int) -> None:
        self.value += v


def test_spec_counters_make_each_series_once_with_the_model_labels() -> None:
    made: list[_Counter] = []

    def factory(name: str, labels: dict[str, str]) -> _Counter:
        made.append(_Counter(name, labels))
        return made[-1]

    c = SpecCounters(factory, {"model": "tensorrt_llm", "version": "1"})
    assert len(made) == 5 and all(m.value == 0 for m in made)  # present from the start
    for _ in range(2):
        c.observe({"steps": 2, "draft_tokens": 8, "accepted_tokens": 3,
                   "per_position_accepted": [2, 1, 0, 0]})
    by = {(m.name, m.labels.get("position")): m for m in made}
    assert len(made) == 9
    assert by[("specserve:spec_decode_num_drafts_total", None)].value == 4
    assert by[("specserve:spec_decode_num_accepted_tokens_total", None)].value == 6
    assert by[("specserve:spec_decode_num_accepted_tokens_per_pos_total", "0")].value == 4
    assert all(m.labels["model"] == "tensorrt_llm" for m in made)
