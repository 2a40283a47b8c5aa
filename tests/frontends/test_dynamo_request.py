"""specserve.frontends.dynamo_request: Dynamo's preprocessed request (the fields ai-dynamo
1.6.1's frontend sends) -> the serving core's request and checks; no Dynamo needed."""

from __future__ import annotations

import pytest

from specserve.frontends.dynamo_request import admit
from specserve.serving.finish import finish_reason
from specserve.serving.request import EngineLimits

LIMITS = EngineLimits(vocab_size=256, max_seq_len=64, eos=2)


def request(**over: object) -> dict[str, object]:
    r: dict[str, object] = {
        "token_ids": [5, 6, 7],
        "stop_conditions": {"max_tokens": 4, "stop": ["\n"], "stop_token_ids": [9],
                            "stop_token_ids_hidden": [2], "min_tokens": None,
                            "ignore_eos": None},
        "sampling_options": {"n": None, "temperature": 0.0, "top_p": None, "top_k": None,
                             "seed": 3, "guided_decoding": None},
        "output_options": {"logprobs": None, "prompt_logprobs": None},
        "eos_token_ids": [2],
    }
    r.update(over)
    return r


def test_fields_map_to_the_triton_request() -> None:
    req, params = admit(request(), LIMITS)
    assert req.prompt == [5, 6, 7] and req.streaming and req.exclude_input
    assert params.max_tokens == 4 and params.temperature == 0.0 and params.seed == 3
    assert set(params.stop_token_ids) == {9, 2} and params.end_id is None


def test_ignore_eos_keeps_only_the_clients_stops() -> None:
    stop = dict(request()["stop_conditions"], ignore_eos=True)  # type: ignore[call-overload]
    _, params = admit(request(stop_conditions=stop), LIMITS)
    assert params.stop_token_ids == (9,)


def test_unset_max_tokens_and_temperature_follow_openai() -> None:
    stop = dict(request()["stop_conditions"], max_tokens=None)  # type: ignore[call-overload]
    _, params = admit(request(stop_conditions=stop, sampling_options={}), LIMITS)
    assert params.max_tokens == 64 - 3 and params.temperature == 1.0


@pytest.mark.parametrize("section, field, value", [
    ("sampling_options", "guided_decoding", {"choice": ["a", "b"]}),
    ("sampling_options", "presence_penalty", 0.5),
    ("output_options", "prompt_logprobs", 2),
    ("stop_conditions", "max_thinking_tokens", 8),
])
def test_unserved_fields_are_refused(section: str, field: str, value: object) -> None:
    body = request()
    body[section] = dict(body[section], **{field: value})  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=f"{section}.{field}"):
        admit(body, LIMITS)


@pytest.mark.parametrize(("k", "top"), [(0, 0), (3, 3)])
def test_logprobs_map_to_return_log_probs(k: int, top: int) -> None:
    """OpenAI logprobs (completions ``logprobs``, chat ``top_logprobs``) arrive as
    output_options.logprobs k: the Triton inputs return_log_probs (+ num_top_log_probs k)."""
    req, params = admit(request(output_options={"logprobs": k, "prompt_logprobs": None}), LIMITS)
    assert req.return_log_probs and req.top_log_probs == top
    assert params.logprobs and params.top_logprobs == top
    req, params = admit(request(), LIMITS)   # not asked: none
    assert not req.return_log_probs and not params.logprobs


def test_the_triton_checks_apply() -> None:
    with pytest.raises(ValueError, match="outside the vocab"):
        admit(request(token_ids=[5, 999]), LIMITS)


def test_finish_reason() -> None:
    _, params = admit(request(), LIMITS)
    assert finish_reason(4, params) == "length" and finish_reason(2, params) == "stop"


@pytest.mark.parametrize(("options", "kind", "text"), [
    ({"json": {"type": "object"}, "backend": None}, "json_schema", '{"type": "object"}'),
    ({"json": '{"type": "integer"}'}, "json_schema", '{"type": "integer"}'),
    ({"regex": "[0-9]+", "backend": "xgrammar"}, "regex", "[0-9]+"),
    ({"grammar": 'root ::= "a"'}, "ebnf_grammar", 'root ::= "a"'),
])
def test_guided_decoding_maps_to_the_triton_guide_inputs(options: dict[str, object], kind: str,
                                                         text: str) -> None:
    """response_format reaches the worker as sampling_options.guided_decoding (ai-dynamo 1.6.1);
    it becomes TensorRT-LLM's guided_decoding_guide_type / guided_decoding_guide."""
    seen: list[tuple[str, str]] = []

    def compile_guide(k: str, t: str) -> None:  # type: ignore[return]
        seen.append((k, t))

    sampling = dict(request()["sampling_options"], guided_decoding=options)  # type: ignore[call-overload]
    admit(request(sampling_options=sampling), LIMITS, compile_guide)  # type: ignore[arg-type]
    assert seen == [(kind, text)]


@pytest.mark.parametrize("options", [{"whitespace_pattern": " "}, {"backend": "outlines"},
                                     {"structural_tag": "{}"}])
def test_unserved_guided_decoding_options_are_refused(options: dict[str, object]) -> None:
    sampling = dict(request()["sampling_options"], guided_decoding=options)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="sampling_options.guided_decoding"):
        admit(request(sampling_options=sampling), LIMITS, lambda k, t: None)  # type: ignore[arg-type,return-value]


def _with(n: int, stop: list[str] | None = None) -> dict[str, object]:
    body = request()
    body["sampling_options"] = dict(body["sampling_options"], n=n)  # type: ignore[call-overload]
    body["stop_conditions"] = dict(body["stop_conditions"], stop=stop)  # type: ignore[call-overload]
    return body


def test_n_becomes_num_return_sequences() -> None:
    req, _ = admit(_with(3), LIMITS)
    assert req.n == 3
    assert admit(_with(1, ["\n"]), LIMITS)[0].n == 1


@pytest.mark.parametrize(("n", "stop", "message"), [
    (17, None, r"n \(num_return_sequences\) must be in \[1, 16\], got 17"),
    (2, ["\n"], r"stop_conditions.stop \(stop strings\) with sampling_options.n > 1"),
])
def test_bad_n_is_refused(n: int, stop: list[str] | None, message: str) -> None:
    from specserve.errors import SpecserveError

    with pytest.raises((ValueError, SpecserveError), match=message):
        admit(_with(n, stop), LIMITS)


def test_prediction_and_num_draft_tokens_come_in_nvext_annotations() -> None:
    """The frontend hands the client's nvext.annotations to the worker as ``annotations``; the
    prediction's text (after the first colon, colons kept) is tokenized like the Triton
    model's ``prediction``; Dynamo's own annotations are left alone."""
    notes = ["formatted_prompt", "prediction:a: b", "num_draft_tokens:0"]
    req, params = admit(request(annotations=notes), LIMITS, encode=lambda t: [ord(c) for c in t])
    assert req.prediction == "a: b" and params.prediction == (97, 58, 32, 98)
    assert req.num_draft_tokens == 0 == params.num_draft_tokens


@pytest.mark.parametrize(("notes", "message"), [
    (["num_draft_tokens:x"], "num_draft_tokens must be an integer, got 'x'"),
    (["num_draft_tokens:-1"], "num_draft_tokens must be >= 0, got -1"),
    (["prediction:a", "prediction:b"], "'prediction:' given more than once"),
    (["prediction:" + "a" * 65], "input 'prediction' has 65 tokens, more than the engine's"),
])
def test_bad_annotations_are_refused(notes: list[str], message: str) -> None:
    from specserve.errors import SpecserveError

    with pytest.raises((ValueError, SpecserveError), match=message):
        admit(request(annotations=notes), LIMITS, encode=lambda t: [ord(c) for c in t])
