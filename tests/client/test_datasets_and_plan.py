"""Prompt sources, job planning (interleaving) and Poisson arrivals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specserve.client.benchmark import plan_jobs, poisson_arrivals
from specserve.client.builtin_prompts import builtin_code_prompts
from specserve.client.datasets import dump_jsonl, load_jsonl, load_prompts
from specserve.client.prompt import Prompt
from specserve.errors import SpecserveError


def test_jsonl_reads_prompts_and_skips_blank_lines(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):"}\n\n{"text_input": "import os", "max_tokens": 5}\n'
                 '{"text": "x = 1", "output_length": 7, "type": "single_turn"}\n')  # AIPerf's
    assert load_jsonl(f) == [Prompt("def f(x):"), Prompt("import os", 5), Prompt("x = 1", 7)]


@pytest.mark.parametrize(("line", "why"), [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"question": "x"}', "missing 'prompt'"),
    ('{"prompt": ""}', "non-empty string"),
    ('{"prompt": "x", "max_tokens": 0}', "positive integer"),
    ('{"prompt": "x", "max_tokens": true}', "positive integer"),
    ('{"text": "x", "output_length": -3}', "'output_length' must be a positive integer"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(SpecserveError, match=rf"bad\.jsonl:2: .*{why}"):
        load_jsonl(f)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="not found"):
        load_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(SpecserveError, match="no prompts"):
        load_jsonl(tmp_path / "e.jsonl")


def test_builtin_code_is_deterministic_per_seed() -> None:
    a = builtin_code_prompts(12, seed=0)
    assert a == builtin_code_prompts(12, seed=0)
    assert a != builtin_code_prompts(12, seed=1)
    assert len({p.text for p in a}) == 12
    assert all(p.text.startswith("def ") and 40 <= len(p.text) <= 400 for p in a)


def test_load_prompts_cycles_a_dataset_and_rejects_unknown_sets(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert [p.text for p in load_prompts(str(f), None, 5, 0)] == ["a", "b", "a", "b", "a"]
    with pytest.raises(SpecserveError, match="unknown set"):
        load_prompts(None, "sharegpt", 3, 0)


def test_plan_interleaves_variants_on_the_same_prompts() -> None:
    prompts = [Prompt(f"p{i}") for i in range(5)]
    jobs = plan_jobs(prompts, warmup=1, requests=4, baseline=True)
    assert [j.index for j in jobs] == list(range(10))
    assert [(j.phase, j.variant, j.prompt_index) for j in jobs[:2]] == [
        ("warmup", "spec", 0), ("warmup", "baseline", 0)]
    meas = [(j.variant, j.prompt_index) for j in jobs if j.phase == "measure"]
    assert meas == [("spec", 1), ("baseline", 1), ("baseline", 2), ("spec", 2),
                    ("spec", 3), ("baseline", 3), ("baseline", 4), ("spec", 4)]
    solo = plan_jobs(prompts, warmup=0, requests=5, baseline=False)
    assert [j.variant for j in solo] == ["spec"] * 5


def test_poisson_arrivals_have_the_requested_rate() -> None:
    # Seeded; 4000 exponential gaps at rate 8/s: mean gap 0.125 s, std error 0.125/sqrt(4000)
    # ~ 0.002, so a 5-sigma bound is 0.01.
    t = poisson_arrivals(4000, rate=8.0, seed=7)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.125) < 0.01
    assert abs(gaps.std() - 0.125) < 0.015  # exponential: std == mean
    assert t == poisson_arrivals(4000, rate=8.0, seed=7)


def test_jsonl_lines_end_at_newline_only(tmp_path: Path) -> None:
    """A string holding U+2028 / U+2029 / U+0085 raw (valid JSON; dump_jsonl writes them so) is
    one record, not split where str.splitlines() would split it."""
    prompts = [Prompt("a\u2028b\u2029c\x85d"), Prompt("second", 3)]
    f = tmp_path / "u.jsonl"
    f.write_text(dump_jsonl(prompts), encoding="utf-8")
    assert "\u2028" in f.read_text(encoding="utf-8")  # written raw, not escaped
    assert load_jsonl(f) == prompts
    f.write_bytes(dump_jsonl(prompts).replace("\n", "\r\n").encode())  # CRLF too
    assert load_jsonl(f) == prompts
