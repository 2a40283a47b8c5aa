"""The alarm rule over intervals, and baselines from real bench / doctor outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.errors import SpecserveError
from specserve.watch.baseline import Baseline, read_baseline
from specserve.watch.interval import Interval
from specserve.watch.rule import Rule, State, judge, thresholds

DATA = Path(__file__).resolve().parents[1] / "data" / "watch"
BASE = Baseline(acceptance_rate=0.8, tau=3.0, source="test")


def iv(rate: float | None, tau: float | None, activity: float = 400.0) -> Interval:
    return Interval(1, 0, None, activity, None, (), activity, rate, tau)


def run(intervals: list[Interval], rule: Rule | None = None) -> list[tuple[str, bool, bool]]:
    rule = rule or Rule()
    th, st, out = thresholds(BASE, rule), State(), []
    for i in intervals:
        v = judge(i, th, rule, st)
        st = v.state
        out.append((v.status, v.alarm, v.recovered))
    return out


def test_thresholds_are_baseline_times_one_minus_tolerance() -> None:
    th = thresholds(BASE, Rule(tolerance=0.25))
    assert th.acceptance_rate == pytest.approx(0.6) and th.tau == pytest.approx(2.25)


def test_two_low_intervals_raise_one_alarm_and_a_good_one_ends_it() -> None:
    got = run([iv(0.79, 2.9), iv(0.1, 1.1), iv(0.05, 1.0), iv(0.0, 1.0), iv(0.8, 3.0)])
    assert got == [("ok", False, False), ("low", False, False), ("low", True, False),
                   ("low", False, False), ("ok", False, True)]


def test_idle_intervals_are_not_judged_and_do_not_break_a_streak() -> None:
    got = run([iv(0.1, 1.1), iv(None, None, activity=0), iv(0.0, 1.0, activity=63),
               iv(0.1, 1.0)])
    assert [g[0] for g in got] == ["low", "idle", "idle", "low"]
    assert [g[1] for g in got] == [False, False, False, True]


def test_tau_alone_low_is_low() -> None:
    assert run([iv(0.9, 2.0), iv(0.9, 2.0)])[1] == ("low", True, False)


def test_a_figure_the_interval_lacks_is_not_compared() -> None:
    assert run([iv(None, 3.0), iv(None, 3.0)]) == [("ok", False, False)] * 2


def test_consecutive_one_alarms_at_once() -> None:
    assert run([iv(0.1, 1.0)], Rule(consecutive=1)) == [("low", True, False)]


@pytest.mark.parametrize("kw", [{"tolerance": 0.0}, {"tolerance": 1.0}, {"consecutive": 0}])
def test_bad_rule_is_refused(kw: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(SpecserveError):
        Rule(**kw)


def test_baseline_from_the_real_doctor_report() -> None:
    b = read_baseline(str(DATA / "doctor_demo.json"))
    d = json.loads((DATA / "doctor_demo.json").read_text())["probe"]
    assert b.acceptance_rate == d["acceptance_rate"] and b.tau == d["tau"]
    assert "doctor probe" in b.source


def test_baseline_from_the_real_bench_summary_takes_the_variant_that_drafted() -> None:
    b = read_baseline(str(DATA / "bench_summary.json"))
    d = json.loads((DATA / "bench_summary.json").read_text())["variants"]["spec"]["acceptance"]
    assert (b.acceptance_rate, b.tau) == (d["acceptance_rate"], d["tau_server"])
    assert "'spec'" in b.source
    with pytest.raises(SpecserveError, match="no variant 'nope'"):
        read_baseline(str(DATA / "bench_summary.json"), "nope")


def test_bench_engine_counters_win_over_client_figures(tmp_path: Path) -> None:
    d = json.loads((DATA / "bench_summary.json").read_text())
    d["variants"]["spec"]["engine_counters"] = {
        "source": "vllm: Prometheus vllm:spec_decode_* delta", "acceptance_rate": 0.4,
        "tau": 2.6, "draft_tokens": 208}
    f = tmp_path / "summary.json"
    f.write_text(json.dumps(d))
    b = read_baseline(str(f))
    assert (b.acceptance_rate, b.tau) == (0.4, 2.6) and "vllm" in b.source


@pytest.mark.parametrize("text,msg", [
    ("not json", "not JSON"),
    ('{"groups": []}', "neither a specserve bench summary.json"),
    ('[1, 2]', "neither a specserve bench summary.json"),
    ('{"probe": {"status": "skipped"}, "findings": []}', "no acceptance probe"),
    ('{"variants": {"spec": {"acceptance": {"draft_tokens": 0}}}}', "0 variants drafted"),
])
def test_wrong_kind_of_baseline_is_one_line(tmp_path: Path, text: str, msg: str) -> None:
    f = tmp_path / "b.json"
    f.write_text(text)
    with pytest.raises(SpecserveError, match=msg) as e:
        read_baseline(str(f))
    assert "\n" not in str(e.value)


def test_missing_baseline_file() -> None:
    with pytest.raises(SpecserveError, match="cannot read the baseline"):
        read_baseline("/nonexistent/summary.json")
