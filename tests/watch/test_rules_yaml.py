"""``--emit-rules``: the rule file has Prometheus' rule-file structure, and where ``promtool``
can be had (Debian's ``prometheus`` package: ``apt-get download prometheus``, ``dpkg-deb -x``;
point ``SPECSERVE_PROMTOOL`` at ``usr/bin/promtool`` or put it on PATH) it passes
``promtool check rules`` and ``promtool test rules`` fires it on a collapse and not before."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserve.watch.baseline import Baseline
from specserve.watch.rule import Rule, thresholds
from specserve.watch.rules_yaml import alert_rules
from specserve.watch.series import ENGINES
from specserve.yamlio import dump

BASE = Baseline(acceptance_rate=0.8, tau=3.0, source="summary.json")
RULE = Rule(tolerance=0.3, consecutive=2, min_activity=64)
# Prometheus' duration: [0-9]+(ms|s|m|h|d|w|y) units, largest first
DURATION = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")


def promtool() -> str | None:
    return os.environ.get("SPECSERVE_PROMTOOL") or shutil.which("promtool")


def rules_for(engine: str, selector: str = "") -> dict[str, Any]:
    return alert_rules(engine, thresholds(BASE, RULE), RULE, 60, selector, BASE.source)


def check_structure(doc: Any) -> None:
    """Prometheus' rule-file schema (docs "Configuring rules" / "Alerting rules")."""
    assert isinstance(doc, dict) and set(doc) == {"groups"}
    names = set()
    for g in doc["groups"]:
        assert set(g) <= {"name", "interval", "limit", "rules"} and g["name"] not in names
        names.add(g["name"])
        for r in g["rules"]:
            assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels",
                              "annotations"}
            assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", r["alert"])
            assert isinstance(r["expr"], str) and r["expr"]
            assert DURATION.match(r["for"]) and r["for"] != ""
            for k, v in {**r["labels"], **r["annotations"]}.items():
                assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) and isinstance(v, str)


@pytest.mark.parametrize("engine", ENGINES)
def test_rule_file_structure_per_engine(engine: str) -> None:
    doc = yaml.safe_load(dump(rules_for(engine)))
    check_structure(doc)
    alerts = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert set(alerts) == {"SpecDecodeAcceptanceRateLow", "SpecDecodeTokensPerStepLow"}
    assert alerts["SpecDecodeAcceptanceRateLow"]["for"] == "60s"  # (2 - 1) x 60 s
    assert "< 0.56" in alerts["SpecDecodeAcceptanceRateLow"]["expr"]
    assert "< 2.1" in alerts["SpecDecodeTokensPerStepLow"]["expr"]
    assert ">= 64" in alerts["SpecDecodeAcceptanceRateLow"]["expr"]


@pytest.mark.parametrize("engine", ENGINES)
def test_promtool_checks_the_rule_file(engine: str, tmp_path: Path) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not found (SPECSERVE_PROMTOOL or PATH)")
    f = tmp_path / "rules.yaml"
    f.write_text(dump(rules_for(engine, 'job="spec"')))
    r = subprocess.run([tool, "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rules found" in r.stdout + r.stderr


def test_promtool_fires_on_collapse_summed_over_two_workers(tmp_path: Path) -> None:
    """Two vLLM workers scraped every 15 s: healthy for 10 min (rate 0.8 ... per worker), then
    w0's draft collapses (1% accepted) while w1 idles. The alerts must not fire at 9 min and
    must fire at 13 min, with the summed figures in their description."""
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not found (SPECSERVE_PROMTOOL or PATH)")
    labels = {"severity": "critical", "engine": "vllm"}
    doc = rules_for("vllm")
    (tmp_path / "rules.yaml").write_text(dump(doc))
    ann = {r["alert"]: r["annotations"] for r in doc["groups"][0]["rules"]}

    def expect(alert: str, value: str) -> dict[str, Any]:
        a = ann[alert]
        return {"exp_labels": labels, "exp_annotations": {
            "summary": a["summary"], "description": a["description"].replace(
                "{{ $value }}", value)}}

    w0 = {"drafts": "0+100x80", "draft_tokens": "0+400x80",
          "accepted": "0+380x40 15200+4x40"}
    w1 = {"drafts": "0+100x40 4000+0x40", "draft_tokens": "0+400x40 16000+0x40",
          "accepted": "0+380x40 15200+0x40"}
    names = {"drafts": "vllm:spec_decode_num_drafts_total",
             "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
    series = [{"series": f'{names[k]}{{instance="{w}"}}', "values": v}
              for w, d in (("w0", w0), ("w1", w1)) for k, v in d.items()]
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "SpecDecodeAcceptanceRateLow", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "SpecDecodeTokensPerStepLow", "exp_alerts": []},
            {"eval_time": "13m", "alertname": "SpecDecodeAcceptanceRateLow",
             "exp_alerts": [expect("SpecDecodeAcceptanceRateLow", "0.01")]},
            {"eval_time": "13m", "alertname": "SpecDecodeTokensPerStepLow",
             "exp_alerts": [expect("SpecDecodeTokensPerStepLow", "1.04")]},
        ]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    r = subprocess.run([tool, "test", "rules", "test.yaml"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
