"""``specserve watch --emit-rules``: the watch rule as a Prometheus alerting-rules file (pure).

The file follows Prometheus' rule-file schema (prometheus.io/docs/prometheus/latest/
configuration/alerting_rules and recording_rules "Configuring rules": ``groups:`` of
``{name, interval?, rules: [{alert, expr, for?, labels?, annotations?}]}``) and passes
``promtool check rules`` (Debian's ``prometheus`` 2.42 package in the test, where it exists).

The same rule as :mod:`specserve.watch.rule`, over the same series (:mod:`.series`), with one
interval as the range ``W``: ``increase()`` over ``W`` is an interval's delta (resets handled by
Prometheus), sums run over every worker the selector matches (all of them behind Dynamo), the
idle test is ``increase(draft tokens) >= min_activity`` (SGLang: generated tokens), and
``for: (consecutive - 1) × W`` stands for "``consecutive`` low intervals in a row". Engines with
gauges only (TensorRT-LLM's tau, SGLang) average the gauge over ``W``.
"""

from __future__ import annotations

from typing import Any

from specserve.errors import SpecserveError
from specserve.watch.rule import Rule, Thresholds
from specserve.watch.series import SCHEMAS


def _sel(name: str, selector: str, window: str) -> str:
    return f"{name}{{{selector}}}[{window}]"


def _increase(name: str, selector: str, window: str) -> str:
    return f"sum(increase({_sel(name, selector, window)}))"


def _gauge(name: str, selector: str, window: str) -> str:
    return f"avg(avg_over_time({_sel(name, selector, window)}))"


def exprs(engine: str, th: Thresholds, rule: Rule, selector: str, window: str
          ) -> dict[str, str]:
    """PromQL per figure ("acceptance_rate", "tau"): true while the figure is low and the
    interval is not idle."""
    sc = SCHEMAS[engine]
    active_series = sc.draft_tokens or sc.tokens
    assert active_series is not None
    active = f"({_increase(active_series, selector, window)} >= {rule.min_activity:g})"
    out: dict[str, str] = {}
    if th.acceptance_rate is not None:
        if sc.accepted and sc.draft_tokens:
            rate = (f"{_increase(sc.accepted, selector, window)} / "
                    f"{_increase(sc.draft_tokens, selector, window)}")
        elif sc.gauge_rate:
            rate = _gauge(sc.gauge_rate, selector, window)
        else:
            rate = ""
        if rate:
            out["acceptance_rate"] = f"({rate} < {th.acceptance_rate:.6g}) and on() {active}"
    if th.tau is not None:
        if sc.drafts and sc.accepted:
            tau = (f"1 + {_increase(sc.accepted, selector, window)} / "
                   f"{_increase(sc.drafts, selector, window)}")
        elif sc.gauge_tau:
            tau = _gauge(sc.gauge_tau, selector, window)
        else:
            tau = ""
        if tau:
            out["tau"] = f"({tau} < {th.tau:.6g}) and on() {active}"
    return out


ALERTS = {"acceptance_rate": ("SpecDecodeAcceptanceRateLow", "acceptance rate"),
          "tau": ("SpecDecodeTokensPerStepLow", "tokens per step (tau)")}


def alert_rules(engine: str, th: Thresholds, rule: Rule, interval_s: float,
                selector: str = "", baseline: str = "") -> dict[str, Any]:
    """The rule file as plain data (``yamlio.dump`` writes it)."""
    if engine not in SCHEMAS:
        raise SpecserveError(f"--emit-rules needs --engine one of {sorted(SCHEMAS)}, "
                             f"got {engine!r}")
    window = f"{max(int(round(interval_s)), 1)}s"
    hold = f"{max(int(round(interval_s * (rule.consecutive - 1))), 0)}s"
    rules = []
    for figure, expr in exprs(engine, th, rule, selector, window).items():
        name, what = ALERTS[figure]
        floor = getattr(th, figure)
        rules.append({
            "alert": name, "expr": expr, "for": hold,
            "labels": {"severity": "critical", "engine": engine},
            "annotations": {
                "summary": f"Speculative decoding {what} below its baseline ({engine})",
                "description": (f"{what} over {window} is {{{{ $value }}}}, under the floor "
                                f"{floor:.6g} = baseline x (1 - {rule.tolerance:g}) for "
                                f"{rule.consecutive} interval(s) with at least "
                                f"{rule.min_activity:g} draft tokens each (silent acceptance "
                                f"collapse: check the draft weights, quantization and sampler)."
                                + (f" Baseline: {baseline}." if baseline else "")),
            }})
    if not rules:
        raise SpecserveError(f"the baseline has no figure that {engine}'s series can be "
                             "compared with")
    return {"groups": [{"name": "specserve-watch", "rules": rules}]}
