"""Dynamo's preprocessed request -> the serving core's request (pure, no Dynamo import).

Dynamo's frontend tokenizes an OpenAI request and hands a worker a ``PreprocessedRequest`` dict:
``token_ids``, ``stop_conditions`` (``max_tokens``, ``stop``, ``stop_token_ids``,
``stop_token_ids_hidden``, ``min_tokens``, ``ignore_eos``), ``sampling_options`` (``n``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``guided_decoding``, penalties, ...),
``output_options`` (``logprobs``, ``prompt_logprobs``, ...) and ``eos_token_ids``
(ai-dynamo/dynamo ``components/src/dynamo/vllm/handlers.py`` ``build_sampling_params``, and
the dict ai-dynamo 1.6.1's frontend sends a worker). The frontend applies stop
*strings* and detokenizes; the worker yields ``{"token_ids": [...]}`` chunks and a
``finish_reason`` on the last one.

No second copy of the request checks: the dict becomes the serving core's
:class:`~specserve.serving.request.LlmRequest` (:func:`to_request`: streamed, the prompt
excluded, every stop token in ``stop_token_ids``) and goes through
:func:`specserve.serving.admission.sampling_params`, the checks every door applies. What the
engine cannot serve (``prompt_logprobs``, penalties, beam search, ...) is refused with a
one-line ValueError, which the worker sends to the client as an error, never ignored.
``temperature`` and ``top_p`` are carried as FP32, the type of the Triton door's tensors, so a
request samples the same tokens at either door.

Logprobs: ``output_options.logprobs`` k (OpenAI completions ``logprobs``, chat ``top_logprobs``)
becomes ``return_log_probs`` (+ ``num_top_log_probs`` k when k > 0); the worker sends each chunk's
tokens' ``log_probs`` and ``top_logprobs`` (``{rank, token_id, token, logprob}`` per alternative),
the fields of Dynamo's ``LLMEngineOutput`` (ai-dynamo/dynamo
``lib/llm/src/protocols/common/llm_backend.rs``), from which its frontend writes the OpenAI
``logprobs``. The numbers are the target's, from the verify pass (:mod:`specserve.spec.logprobs`:
after temperature, before top-k / top-p).

``n`` > 1: Dynamo's frontend does not fan ``n`` out; it passes ``sampling_options.n`` to the
worker and takes the choice of each chunk from its ``index`` (ai-dynamo/dynamo
``lib/llm/src/protocols/common/llm_backend.rs`` ``LLMEngineOutput.index``;
``lib/llm/src/protocols/openai/completions/delta.rs`` ``choice_from_postprocessor``:
``delta.index.unwrap_or(0)``; ``completions/aggregator.rs`` groups the choices by index).
Its ``Backend`` operator (``lib/llm/src/backend.rs``) holds ONE incremental detokenizer and
stop-string matcher per request, and passes a chunk that carries ``text`` through untouched:
so with n > 1 the worker sends each choice's own text (``frontends/dynamo_worker.py``) and
``n`` becomes the request's ``n``; stop strings with n > 1 (which only that matcher
applies) are refused.

Structured output: OpenAI's ``response_format`` reaches the worker as
``sampling_options.guided_decoding`` (Dynamo's ``GuidedDecodingOptions``: one of ``json``,
``regex``, ``choice``, ``grammar``, ``structural_tag``, plus the modifiers ``backend`` and
``whitespace_pattern``; ``{"type": "json_object"}`` arrives as ``{"json": {"type": "object"}}``
from ai-dynamo 1.6.1's frontend). ``json`` (a schema, object or string) becomes the guide type
``json_schema`` (TensorRT-LLM's ``guided_decoding_guide_type`` values) with the schema as the
guide, ``regex`` -> ``regex``, ``grammar`` -> ``ebnf_grammar`` (xgrammar's EBNF); ``choice``,
``structural_tag``, ``whitespace_pattern`` and a ``backend`` other than xgrammar are refused by
name.

Predicted Outputs and speculation control: ai-dynamo 1.6.1's frontend refuses OpenAI's top-level
``prediction`` (400 "Unsupported parameter(s)") and any ``nvext`` key but its own, and its
preprocessed request has no field for either; it hands the worker ``nvext.annotations`` (a list
of strings) intact as the request's ``annotations``. So the worker reads
``"prediction:<text>"`` (the expected output: everything after the first colon) and
``"num_draft_tokens:<k>"`` there (:data:`ANNOTATIONS`), the Triton inputs of those names and
semantics; other annotations are Dynamo's own and left to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from specserve.serving.admission import CompileGuide, Encode, sampling_params
from specserve.serving.request import EngineLimits, LlmRequest

if TYPE_CHECKING:
    from specserve.runtime.params import SamplingParams

# served fields of each section; any other field must be absent, None or its neutral value
SAMPLING_SERVED = frozenset({"temperature", "top_p", "top_k", "seed", "guided_decoding", "n"})
GUIDED = {"json": "json_schema", "regex": "regex", "grammar": "ebnf_grammar"}  # -> guide type
OUTPUT_SERVED = frozenset({"logprobs"})
STOP_SERVED = frozenset({"max_tokens", "stop", "stop_token_ids", "stop_token_ids_hidden",
                         "min_tokens", "ignore_eos"})
NEUTRAL: Mapping[str, tuple[Any, ...]] = {
    "best_of": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0), "length_penalty": (1, 1.0), "min_p": (0, 0.0),
    "use_beam_search": (False,), "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,), "formatted_prompt": (),
}
OPENAI_TEMPERATURE = 1.0  # OpenAI's default when the client sends none
# nvext.annotations the worker reads: "<name>:<value>" (the value is text)
ANNOTATIONS = ("prediction", "num_draft_tokens")


def specserve_annotations(request: Mapping[str, Any]) -> dict[str, str]:
    """The request's :data:`ANNOTATIONS` (name -> value), or ValueError for one given twice."""
    found: dict[str, str] = {}
    for item in request.get("annotations") or ():
        name, sep, value = str(item).partition(":")
        if not sep or name not in ANNOTATIONS:
            continue  # one of Dynamo's own
        if name in found:
            raise ValueError(f"nvext.annotations: '{name}:' given more than once")
        found[name] = value
    return found


def _draft_tokens(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nvext.annotations: num_draft_tokens must be an integer, got "
                         f"{value!r}") from None


def _refuse_unserved(section: str, values: Mapping[str, Any] | None,
                     served: frozenset[str]) -> None:
    for key, value in (values or {}).items():
        if key in served or value is None or value in NEUTRAL.get(key, ()):
            continue
        raise ValueError(f"{section}.{key} = {value!r} is not supported by the specserve "
                         "worker")


def _guided(options: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """Dynamo's ``guided_decoding`` -> (guide type, guide), or None."""
    if not options:
        return None
    found = []
    for key, value in options.items():
        if value is None or (key == "backend" and value == "xgrammar"):
            continue
        if key not in GUIDED:
            raise ValueError(f"sampling_options.guided_decoding.{key} = {value!r} is not "
                             "supported by the specserve worker")
        found.append((GUIDED[key], value if isinstance(value, str) else json.dumps(value)))
    if len(found) > 1:
        raise ValueError("sampling_options.guided_decoding: only one of json, regex, grammar")
    return found[0] if found else None


def to_request(request: Mapping[str, Any], max_seq_len: int) -> LlmRequest:
    """The serving core's request of one Dynamo request (streamed, the prompt excluded, every
    stop in ``stop_token_ids``), or ValueError naming the field refused. ``max_tokens`` unset:
    what ``max_seq_len`` leaves."""
    stop = dict(request.get("stop_conditions") or {})
    sampling = dict(request.get("sampling_options") or {})
    _refuse_unserved("sampling_options", sampling, SAMPLING_SERVED)
    _refuse_unserved("stop_conditions", stop, STOP_SERVED)
    output = dict(request.get("output_options") or {})
    _refuse_unserved("output_options", output, OUTPUT_SERVED)
    prompt = [int(t) for t in request.get("token_ids") or ()]
    if not prompt:
        raise ValueError("token_ids is empty")
    max_tokens = stop.get("max_tokens")
    if max_tokens is None:
        if not max_seq_len:
            raise ValueError("max_tokens is required (the engine records no max_seq_len)")
        max_tokens = max_seq_len - len(prompt)
    if int(max_tokens) <= 0:
        raise ValueError(f"request_output_len must be positive, got {int(max_tokens)}")
    stops = [int(t) for t in stop.get("stop_token_ids") or ()]
    eos = [int(t) for t in request.get("eos_token_ids") or ()]
    if not stop.get("ignore_eos"):
        stops += [int(t) for t in stop.get("stop_token_ids_hidden") or ()] + eos
    temperature = sampling.get("temperature")
    n = int(sampling.get("n") or 1)
    if n != 1 and stop.get("stop"):  # the frontend applies stop strings to token-only chunks
        raise ValueError("stop_conditions.stop (stop strings) with sampling_options.n > 1 "
                         "is not supported by the specserve worker")
    logprobs = output.get("logprobs")  # OpenAI logprobs / top_logprobs: k alternatives (0: none)
    guide = _guided(sampling.get("guided_decoding"))
    notes = specserve_annotations(request)
    return LlmRequest(
        prompt=prompt, max_tokens=int(max_tokens), streaming=True, exclude_input=True,
        perf=True,  # the final response: spec_stats_json
        temperature=_fp32(OPENAI_TEMPERATURE if temperature is None else temperature),
        top_k=0 if sampling.get("top_k") is None else max(0, int(sampling["top_k"])),
        top_p=1.0 if sampling.get("top_p") is None else _fp32(sampling["top_p"]),
        seed=None if sampling.get("seed") is None else _seed(sampling["seed"]),
        end_id=-1,  # every stop is in stop_token_ids
        min_tokens=int(stop.get("min_tokens") or 0),
        stop_token_ids=tuple(dict.fromkeys(stops)),
        return_log_probs=logprobs is not None,
        top_log_probs=0 if logprobs is None else max(0, int(logprobs)),
        guide_type=None if guide is None else guide[0],
        guide=None if guide is None else guide[1], n=n, prediction=notes.get("prediction"),
        num_draft_tokens=_draft_tokens(notes.get("num_draft_tokens")))


def _fp32(value: Any) -> float:
    """``value`` rounded to FP32, as a Triton FP32 input carries it."""
    return float(np.float32(value))


def _seed(value: Any) -> int:
    """A seed as a UINT64 input carries it (Triton's ``seed``)."""
    seed = int(value)
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"sampling_options.seed must be in [0, 2**64), got {seed}")
    return seed


def admit(request: Mapping[str, Any], limits: EngineLimits,
          guides: CompileGuide | None = None,
          encode: Encode | None = None) -> tuple[LlmRequest, SamplingParams]:
    """One Dynamo request -> (request, its sampling parameters), every check of the serving
    core done; ValueError / SpecserveError with a one-line reason. ``guides``: the model's
    grammar compiler (structured output); ``encode``: its tokenizer (the prediction's text)."""
    req = to_request(request, limits.max_seq_len)
    return req, sampling_params(req, limits, encode, guides)
