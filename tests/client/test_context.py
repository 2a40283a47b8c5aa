"""The context axis: prompts of exactly L tokens of the served tokenizer,
lengths the engine cannot hold refused in one line, the measured step cost, and a
(length x concurrency) sweep whose step cost grows with context (scripted server whose step
time grows with the prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.client.config import BenchmarkConfig
from specserve.client.context import (
    ContextLimits,
    check_lengths,
    cut_to_tokens,
    long_prompts,
    parse_lengths,
    step_ms,
    step_ms_p50,
    steps_mean,
    tokenizer_ends,
)
from specserve.client.datasets import load_dataset, load_prompts
from specserve.client.metrics import make_record
from specserve.client.prompt import Prompt
from specserve.client.run import run_benchmark
from specserve.client.sweep import build_contexts, run_sweep
from specserve.errors import SpecserveError
from tests.helpers.openai_server import Script, ScriptedOpenAI

DEMO_TOK = Path("checkpoints/demo/tokenizer")


def words(text: str) -> list[int]:
    """A whitespace tokenizer's token ends (each word one token)."""
    out, i = [], 0
    for w in text.split():
        i = text.index(w, i) + len(w)
        out.append(i)
    return out


@pytest.mark.parametrize("text", ["", "a,b", "0,4", "512,128", "4,4"])
def test_bad_lengths_are_one_line(text: str) -> None:
    with pytest.raises(SpecserveError, match="--input-lengths"):
        parse_lengths(text)


def test_lengths_the_engine_cannot_hold_are_refused() -> None:
    lim = ContextLimits(512, 1024, "engines/demo/build_config.json")
    check_lengths([128, 512], 64, lim)
    check_lengths([2048], 64, None)          # no limits known: nothing to check against
    with pytest.raises(SpecserveError, match=r"--input-lengths 2048: .* use lengths <= 512"):
        check_lengths([128, 2048], 64, lim)
    with pytest.raises(SpecserveError, match=r"--input-lengths 500: .* use lengths <= 424"):
        check_lengths([500], 600, lim)       # fits max_input_len, not with the answer


def test_cut_and_long_prompts_with_a_word_tokenizer() -> None:
    assert cut_to_tokens("a bb ccc dddd", 2, words) == "a bb"
    assert cut_to_tokens("a bb", 3, words) is None
    pool = [Prompt("one two three", category="code"), Prompt("four five", category="prose")]
    ps = long_prompts(pool, 6, 3, words)
    assert [p.text for p in ps] == ["one two three\n\nfour five\n\none",
                                    "four five\n\none two three\n\nfour",
                                    "one two three\n\nfour five\n\none"]
    assert [p.category for p in ps] == ["code", "prose", "code"]


@pytest.mark.skipif(not DEMO_TOK.is_dir(), reason="needs the demo checkpoint")
@pytest.mark.parametrize("length", [128, 448])
def test_long_prompts_have_exactly_length_served_tokens(length: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEMO_TOK / "tokenizer.json"))
    pool = load_prompts(None, "builtin-code", 64, 0)
    ps = long_prompts(pool, length, 8, tokenizer_ends(DEMO_TOK))
    assert [len(tok.encode(p.text, add_special_tokens=False).ids) for p in ps] == [length] * 8
    assert len({p.text for p in ps}) == 8 and all(p.max_tokens is None for p in ps)


def _rec(chunks: list[int], e2e: float, status_error: bool = False) -> object:
    times = [0.010 * (j + 1) for j in range(len(chunks))]
    return make_record(index=0, variant="spec", phase="measure", model="m", url="h:1",
                       prompt_index=0, send_time_unix_s=0.0, streaming=True,
                       chunk_times_s=times, chunk_tokens=chunks, end_s=e2e,
                       token_count_source="server", error="x" if status_error else None)


def test_step_ms_is_e2e_minus_ttft_over_the_steps() -> None:
    a = _rec([1, 4, 4, 4], 0.070)    # TTFT 10 ms, 3 steps over 60 ms -> 20 ms
    b = _rec([1, 2], 0.050)          # 1 step over 40 ms
    assert step_ms([a, b]) == pytest.approx(30.0)  # type: ignore[list-item]
    assert step_ms([_rec([1], 0.01)]) is None      # type: ignore[list-item]


def test_steps_mean_and_the_median_step() -> None:
    a = _rec([1, 4, 4, 4], 0.070)    # chunks every 10 ms (the helper's clock)
    b = _rec([1, 2], 0.050)
    assert steps_mean([a, b]) == pytest.approx(2.0)    # type: ignore[list-item]
    assert step_ms_p50([a, b]) == pytest.approx(10.0)  # type: ignore[list-item]
    assert steps_mean([]) is None and step_ms_p50([_rec([1], 0.01)]) is None  # type: ignore[list-item]


def _engine(tmp_path: Path, max_input: int, max_seq: int) -> Path:
    """An engine folder with a build record (the fields read_engine_record checks)."""
    from specserve.engine_record import REQUIRED_KEYS

    rec = {k: None for k in REQUIRED_KEYS}
    rec.update(backend="torch", spec_mode="ngram", max_batch_size=8, max_input_len=max_input,
               max_seq_len=max_seq, max_draft_len=4, tp_size=1, pp_size=1, dtype="float32",
               record_version=1, world_size=1)
    d = tmp_path / "engine"
    d.mkdir()
    (d / "build_config.json").write_text(json.dumps(rec))
    return d


def _cfg(tmp_path: Path, spec_url: str, base_url: str, **kw: object) -> BenchmarkConfig:
    base: dict[str, object] = dict(url=spec_url, baseline_url=base_url,
                                   out=str(tmp_path / "ctx"), protocol="openai", model="demo",
                                   requests=6, warmup=1, max_tokens=16, bootstrap=100,
                                   temperature=0.0, tokenizer=str(DEMO_TOK))
    base.update(kw)
    return BenchmarkConfig(**base)  # type: ignore[arg-type]


@pytest.mark.skipif(not DEMO_TOK.is_dir(), reason="needs the demo checkpoint")
def test_sweep_over_lengths_and_concurrency_reports_step_cost_per_cell(tmp_path: Path) -> None:
    # step time grows with the prompt: 2 ms + 40 ms per 1000 prompt characters
    spec_s = Script(steps=(5,), gap_s=0.002, context_gap_s=0.040)
    base_s = Script(steps=(1,), gap_s=0.002, context_gap_s=0.010, per_request_metrics=False,
                    drafts_counted=False)
    with ScriptedOpenAI(spec_s) as spec, ScriptedOpenAI(base_s) as base:
        cfg, ctxs, note = build_contexts(_cfg(tmp_path, spec.url, base.url), [16, 256], None)
        s = run_sweep(cfg, [1, 2], lambda c: run_benchmark(c, progress=False,
                                                            plots=False).summary,
                      contexts=ctxs, context_limits=note)
    assert s["status"] == "ok" and s["input_lengths"] == [16, 256]
    assert [(r["input_length"], r["concurrency"]) for r in s["levels"]] == [
        (16, 1), (16, 2), (256, 1), (256, 2)]
    short, long_ = s["levels"][0], s["levels"][2]
    assert long_["spec"]["step_ms"] > 2 * short["spec"]["step_ms"]
    assert long_["verify_cost_ratio"] > short["verify_cost_ratio"]
    assert short["spec"]["input_tokens_mean"] == pytest.approx(16)
    assert long_["spec"]["input_tokens_mean"] == pytest.approx(256)
    out = Path(cfg.out)
    assert {p.name for p in out.iterdir() if p.is_dir()} == {
        f"L{n}-c{c}-{v}" for n in (16, 256) for c in (1, 2) for v in ("spec", "baseline")}
    assert len(load_dataset(out / "prompts-L256.jsonl")) == 7
    assert "sweep_context.png" in (out / "README.md").read_text()
    assert "not checked" in s["context_limits"] and set(s["crossover_by_length"]) == {"16",
                                                                                    "256"}


def test_cli_refuses_lengths_beyond_the_engine_in_one_line(tmp_path: Path) -> None:
    eng = _engine(tmp_path, 512, 1024)
    r = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--baseline-model", "b",
                                 "--sweep", "1,4", "--input-lengths", "128,2048", "--engine",
                                 str(eng), "--tokenizer", str(DEMO_TOK) if DEMO_TOK.is_dir()
                                 else str(eng), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--input-lengths 2048" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--input-lengths", "128",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "axis of --sweep" in r.output
