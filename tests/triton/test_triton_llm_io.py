"""Pure request/response mapping of the reference tensorrt_llm model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specserve.errors import SpecserveError
from specserve.serving.admission import check_drafts, sampling_params
from specserve.serving.engine_params import DEFAULT_MALLOC_TRIM_S, DEFAULT_MAX_PENDING
from specserve.serving.request import PLAIN_ENGINE_MAX_DRAFT_LEN, EngineLimits
from specserve.serving.responses import (
    PerfTimes,
    generation_logits_array,
    perf_arrays,
    token_arrays,
)
from specserve.triton.llm_io import admit, parse_request, word_ids
from specserve.triton.model_params import ModelParams


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


# --- draft_input_ids / draft_logits / return_generation_logits ---------------------

def drafted(k: int = 3, logits: Any = None, **extra: Any) -> dict[str, np.ndarray[Any, Any]]:
    arrays = base(**extra)
    arrays["draft_input_ids"] = np.array([[9, 8, 7, 6, 5][:k]], dtype=np.int32)
    if logits is not None:
        arrays["draft_logits"] = np.asarray(logits, dtype=np.float32)
    return arrays


def test_draft_ids_and_logits_are_parsed() -> None:
    logits = np.arange(3 * 16, dtype=np.float32).reshape(1, 3, 16)  # [1, K, V] as the BLS
    req = parse_request(drafted(3, logits, return_generation_logits=True))
    assert req.draft_ids == (9, 8, 7) and req.return_generation_logits
    assert req.draft_logits is not None and req.draft_logits.shape == (3, 16)
    assert req.draft_logits.dtype == np.float32 and req.draft_logits[2, 15] == 47.0
    assert req.verify_max_tokens == 4  # request_output_len 8, capped at K + 1
    assert parse_request({**drafted(3), "request_output_len": np.array([2], np.int32)}
                         ).verify_max_tokens == 2
    plain = parse_request(base())
    assert (plain.draft_ids, plain.draft_logits, plain.return_generation_logits) == (
        None, None, False)


def test_empty_draft_input_ids_is_a_plain_request() -> None:
    arrays = {**base(), "draft_input_ids": np.zeros((1, 0), dtype=np.int32)}
    assert parse_request(arrays).draft_ids is None
    arrays["draft_logits"] = np.zeros((1, 0, 16), dtype=np.float32)
    assert parse_request(arrays).draft_logits is None


@pytest.mark.parametrize("logits, message", [
    (np.zeros((1, 2, 16)), r"'draft_logits' must be \[K, V\] with K = 3 .*got shape \[1, 2, 16\]"),
    (np.zeros((1, 48)), r"'draft_logits' must be \[K, V\] with K = 3"),
    (np.zeros(48), r"'draft_logits' must be \[K, V\] with K = 3"),
    (np.full((1, 3, 16), np.nan), r"'draft_logits' holds NaN or \+inf"),
])
def test_bad_draft_logits_name_the_input(logits: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_request(drafted(3, logits))


def test_draft_logits_need_draft_ids_and_minus_inf_is_allowed() -> None:
    with pytest.raises(ValueError, match="'draft_logits' needs 'draft_input_ids'"):
        parse_request({**base(), "draft_logits": np.zeros((1, 3, 16), dtype=np.float32)})
    banned = np.zeros((1, 3, 16), dtype=np.float32)
    banned[0, 0, 2] = -np.inf  # a token the draft banned (min_tokens)
    assert parse_request(drafted(3, banned)).draft_logits is not None


def test_generation_logits_are_refused_with_streaming() -> None:
    with pytest.raises(ValueError, match="'return_generation_logits' is not supported with "
                                         "streaming"):
        parse_request(base(return_generation_logits=True, streaming=True))


def test_check_drafts_against_the_engine() -> None:
    check_drafts(parse_request(base()), vocab_size=16, max_draft_len=0)  # no drafts: no limit
    req = parse_request(drafted(3, np.zeros((1, 3, 16))))
    check_drafts(req, vocab_size=16, max_draft_len=3)
    with pytest.raises(ValueError, match="'draft_input_ids' has 3 tokens, more than the "
                                         "engine's max_draft_len 2"):
        check_drafts(req, vocab_size=16, max_draft_len=2)
    with pytest.raises(ValueError, match=r"'draft_input_ids': token id 9 outside the vocab \(8\)"):
        check_drafts(parse_request(drafted(3)), vocab_size=8, max_draft_len=4)
    with pytest.raises(ValueError, match=r"'draft_logits' must be \[K, V\] = \[3, 32\] \(the "
                                         r"target's vocab\), got \[3, 16\]"):
        check_drafts(req, vocab_size=32, max_draft_len=4)
    assert PLAIN_ENGINE_MAX_DRAFT_LEN == 16  # documented in serving/admission.check_drafts


def test_generation_logits_array_shape() -> None:
    out = generation_logits_array(np.ones((3, 16), dtype=np.float64))["generation_logits"]
    assert out.shape == (1, 1, 3, 16) and out.dtype == np.float32


# --- the request checks against the engine (was the model's _params) -------------------------

LIMITS = EngineLimits(vocab_size=32, max_draft_len=4, max_input_len=3, max_seq_len=11, eos=2)


def test_sampling_params_map_the_request() -> None:
    req = parse_request(base(temperature=0.5, runtime_top_k=3, runtime_top_p=0.9, seed=7,
                             min_tokens=2))
    got = sampling_params(req, LIMITS)
    assert (got.max_tokens, got.temperature, got.top_k, got.seed, got.min_tokens) == \
        (8, 0.5, 3, 7, 2)
    assert abs(got.top_p - 0.9) < 1e-6
    assert got.end_id == 2  # no end_id input: the tokenizer's EOS
    assert sampling_params(parse_request(base(end_id=-1)), LIMITS).end_id is None
    assert sampling_params(parse_request(base(end_id=5)), LIMITS).end_id == 5


def test_max_input_len_and_max_seq_len_bounds_are_inclusive() -> None:
    """3-token prompt: max_input_len 3 passes, 2 fails; 3 + 8 = 11 = max_seq_len passes."""
    req = parse_request(base())
    sampling_params(req, LIMITS)
    with pytest.raises(ValueError, match=r"^prompt has 3 tokens, the engine's max_input_len "
                                         r"is 2$"):
        sampling_params(req, EngineLimits(vocab_size=32, max_input_len=2))
    with pytest.raises(ValueError, match=r"^prompt 3 \+ request_output_len 8 exceeds the "
                                         r"engine's max_seq_len 10$"):
        sampling_params(req, EngineLimits(vocab_size=32, max_seq_len=10))


def test_a_prompt_token_outside_the_vocab_is_refused() -> None:
    with pytest.raises(ValueError, match=r"token id 7 outside the vocab \(7\)"):
        sampling_params(parse_request(base()), EngineLimits(vocab_size=7))


def test_draft_requests_answer_at_most_k_plus_one_tokens() -> None:
    """draft_input_ids: max_tokens = min(request_output_len, K + 1), checked against
    max_seq_len as such (3 + 4 <= 7), min_tokens capped to it."""
    req = parse_request(drafted(3, min_tokens=6))
    got = sampling_params(req, EngineLimits(vocab_size=32, max_draft_len=4, max_seq_len=7))
    assert (got.max_tokens, got.min_tokens) == (4, 4)
    with pytest.raises(ValueError, match="more than the engine's max_draft_len 2"):
        sampling_params(req, EngineLimits(vocab_size=32, max_draft_len=2))


def test_streaming_needs_a_decoupled_model() -> None:
    model = ModelParams(engine_dir="e")
    admit(base(streaming=True), model, True, LIMITS)
    with pytest.raises(ValueError, match="streaming needs a decoupled model"):
        admit(base(streaming=True), model, False, LIMITS)


def _cfg(**params: str) -> dict[str, Any]:
    params = {"gpt_model_path": "/engines/e", **params}
    return {"max_batch_size": 8, "parameters": {k: {"string_value": v}
                                                for k, v in params.items()}}


def test_model_params_from_the_config() -> None:
    got = ModelParams.from_config(_cfg(specserve_speculation="off", specserve_max_pending="3",
                                       exclude_input_in_output="true",
                                       specserve_checkpoint="draft"))
    assert got == ModelParams(engine_dir="/engines/e", max_batch=8, exclude_default=True,
                              speculation=False, checkpoint="draft", max_pending=3)
    assert ModelParams.from_config(_cfg()).max_pending == DEFAULT_MAX_PENDING
    cache = ModelParams.from_config(_cfg(specserve_prefix_cache_mb="8")).prefix_cache_bytes
    assert cache == (6 << 20, 2 << 20)  # in-flight pool, verify (BLS) pool
    assert ModelParams.from_config(_cfg(specserve_prefix_cache_mb="0")).prefix_cache_bytes \
        == (0, 0)
    assert ModelParams.from_config(_cfg()).malloc_trim_s == DEFAULT_MALLOC_TRIM_S
    # TensorRT-LLM's enable_kv_cache_reuse switches the prefix cache (its budget stays ours)
    for value, want in (("false", (0, 0)), ("False", (0, 0)), ("0", (0, 0)),
                        ("true", (6 << 20, 2 << 20)), ("", (6 << 20, 2 << 20)),
                        ("${enable_kv_cache_reuse}", (6 << 20, 2 << 20))):
        got = ModelParams.from_config(_cfg(specserve_prefix_cache_mb="8",
                                           enable_kv_cache_reuse=value))
        assert got.prefix_cache_bytes == want, value
    assert ModelParams.from_config(_cfg(specserve_malloc_trim_s="2.5")).malloc_trim_s == 2.5
    assert ModelParams.from_config(_cfg(specserve_malloc_trim_s="0")).malloc_trim_s == 0


@pytest.mark.parametrize(("params", "message"), [
    ({"specserve_batching": "static"}, "specserve_batching 'static' is not served: the "
                                       "reference tensorrt_llm model batches in flight only"),
    ({"specserve_checkpoint": "medusa"}, "specserve_checkpoint must be 'target' or 'draft'"),
    ({"specserve_max_pending": "many"}, "specserve_max_pending must be an integer"),
    ({"specserve_prefix_cache_mb": "-1"}, "specserve_prefix_cache_mb must be >= 0"),
    ({"enable_kv_cache_reuse": "maybe"}, "enable_kv_cache_reuse must be true or false"),
    ({"specserve_malloc_trim_s": "often"}, "specserve_malloc_trim_s must be a number of seconds"),
    ({"specserve_malloc_trim_s": "-1"}, "specserve_malloc_trim_s must be >= 0 and finite"),
    ({"specserve_malloc_trim_s": "nan"}, "specserve_malloc_trim_s must be >= 0 and finite"),
    ({"gpt_model_path": ""}, "gpt_model_path"),
])
def test_model_params_refuse_what_is_not_served(params: dict[str, str], message: str) -> None:
    """The removed static batching loop: a repository asking for it fails to load with one
    message, it is never silently served in flight."""
    with pytest.raises(SpecserveError, match=message):
        ModelParams.from_config(_cfg(**params))
    assert ModelParams.from_config(_cfg(specserve_batching="inflight")).max_batch == 8


def test_thread_counts_from_the_environment() -> None:
    from specserve.serving.engine_params import env_threads

    assert env_threads("SPECSERVE_PREFILL_THREADS", 0, env={}) == 0
    assert env_threads("SPECSERVE_PREFILL_THREADS", 0, env={"SPECSERVE_PREFILL_THREADS": "2"}) \
        == 2
    for bad, message in (("two", "must be an integer"), ("-1", "must be >= 0")):
        with pytest.raises(SpecserveError, match=f"SPECSERVE_TORCH_THREADS {message}"):
            env_threads("SPECSERVE_TORCH_THREADS", 1, env={"SPECSERVE_TORCH_THREADS": bad})
