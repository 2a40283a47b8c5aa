"""Pure request/response mapping of the reference tensorrt_llm model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specserve.triton.llm_io import (
    PerfTimes,
    parse_request,
    perf_arrays,
    token_arrays,
    word_ids,
)


def base(**extra: Any) -> dict[str, np.ndarray[Any, Any]]:
    arrays = {"input_ids": np.array([[5, 6, 7, 0]], dtype=np.int32),
              "input_lengths": np.array([3], dtype=np.int32),
              "request_output_len": np.array([8], dtype=np.int32)}
    arrays.update({k: np.array([v]) for k, v in extra.items()})
    return arrays


def test_parse_minimal_request_trims_padding() -> None:
    req = parse_request(base())
    assert req.prompt == [5, 6, 7] and req.max_tokens == 8
    assert (req.streaming, req.temperature, req.end_id, req.perf) == (False, 0.0, None, False)


def test_parse_sampling_and_flags() -> None:
    req = parse_request(base(streaming=True, temperature=np.float32(0.5), runtime_top_k=3,
                             runtime_top_p=np.float32(0.9), seed=np.uint64(7), end_id=2,
                             min_tokens=1, return_perf_metrics=True))
    assert (req.streaming, req.top_k, req.seed, req.end_id, req.min_tokens, req.perf) == (
        True, 3, 7, 2, 1, True)
    assert req.temperature == pytest.approx(0.5) and req.top_p == pytest.approx(0.9)


def test_neutral_values_of_unsupported_inputs_are_accepted() -> None:
    req = parse_request(base(beam_width=1, repetition_penalty=np.float32(1.0)))
    assert req.max_tokens == 8


@pytest.mark.parametrize("name, value", [("beam_width", 2), ("lora_task_id", 3),
                                         ("repetition_penalty", 1.2)])
def test_unsupported_inputs_are_refused_by_name(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        parse_request(base(**{name: value}))


def test_bad_lengths_are_refused() -> None:
    arrays = base()
    arrays["input_lengths"] = np.array([9], dtype=np.int32)
    with pytest.raises(ValueError, match="input_lengths 9"):
        parse_request(arrays)
    with pytest.raises(ValueError, match="request_output_len"):
        parse_request({**base(), "request_output_len": np.array([0], dtype=np.int32)})


def test_word_list_format() -> None:
    words = np.array([[[4, 9, 9, 0], [1, 3, -1, -1]]], dtype=np.int32)  # "4" and "9 9"
    assert word_ids(words) == [[4], [9, 9]]
    assert word_ids(np.array([[[0], [-1]]], dtype=np.int32)) == []
    stop_single = base()
    stop_single["stop_words_list"] = np.array([[[4, 2], [1, 2]]], dtype=np.int32)
    assert parse_request(stop_single).stop_token_ids == (4, 2)
    stop_single["stop_words_list"] = words
    with pytest.raises(ValueError, match="single tokens"):
        parse_request(stop_single)


@pytest.mark.parametrize("name", ["stop_words_list", "bad_words_list"])
def test_malformed_word_list_names_the_input(name: str) -> None:
    """An odd number of values is no [2, L] list: one line naming the input (was numpy's
    reshape message, found by the fuzz run)."""
    bad = {**base(), name: np.array([[[4, 9, 1]]], dtype=np.int32)}
    with pytest.raises(ValueError, match=rf"^input '{name}' must hold \[2, L\] values "
                                         r"\(ids, then end offsets\), got 3$"):
        parse_request(bad)


def test_token_arrays_count_per_response() -> None:
    req = parse_request(base(return_num_output_tokens=True, return_num_input_tokens=True))
    out = token_arrays(req, [11, 12])
    assert out["output_ids"].shape == (1, 1, 2) and out["output_ids"].dtype == np.int32
    assert out["num_output_tokens"].tolist() == [[2]]
    assert out["num_input_tokens"].tolist() == [[3]]
    assert token_arrays(req, [])["num_output_tokens"].tolist() == [[0]]


def test_perf_arrays() -> None:
    out = perf_arrays(PerfTimes(1, 2, 3, 4), drafted=8, accepted=6, stats_json="{}")
    assert out["acceptance_rate"].tolist() == [[0.75]]
    assert out["arrival_time_ns"].dtype == np.int64
    assert out["spec_stats_json"].tolist() == [[b"{}"]]
    assert perf_arrays(PerfTimes(1, 1, 1, 1), 0, 0, None)["acceptance_rate"].tolist() == [[0.0]]
