"""Request and response building of the ``tensorrt_llm_bls`` speculation loop, without Triton
(numpy and the standard library; copied into a repository as ``tensorrt_llm_bls/1/lib/``).

The split follows tensorrtllm_backend's BLS: ``lib/decode.py`` holds the requests, responses and
the decoding logic as plain objects, ``lib/triton_decoder.py`` only converts them to and from
``pb_utils`` (triton-inference-server/tensorrtllm_backend
``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py`` @
38e7c9d1a63604b46a43d4952675779565a8f3a8, ``triton_decoder.py`` @
04d96ce8e635739babc0aedaac8a2ee10fa8f909, read, not copied). Here the BLS model (``bls.py``)
turns the dicts of numpy arrays built below into ``pb_utils.Tensor`` lists and back; everything
a request's answer depends on is in this module, :mod:`spec_text` and :mod:`spec_loop`, and the
unit tests call them directly (``tests/triton/test_bls_spec_io.py``).

- :class:`BlsParams`: the model's parameters (``config.pbtxt``).
- :func:`check_spec_request`, :func:`spec_request`, :func:`spec_options`: a request's checks and
  its :class:`spec_loop.SpecRequest`.
- :func:`draft_call`, :func:`target_call`: the inputs and requested outputs of the draft and
  target calls (the I/O contract with ``tensorrt_llm``; :func:`sampling_inputs` only what the
  client set; :func:`draft_logits` per-position logits or the fast-logits handle);
  :func:`merge_outputs` the outputs of a
  call over its responses; :func:`check_draft` the draft vocabulary and id checks;
  :func:`target_counts` the accepted drafts of a target answer.
The responses (streamed text, the final response, perf outputs) are built in
:mod:`spec_text`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ngram, spec_loop
from .request import (
    GUIDE_INPUTS,
    LLM,
    LOGITS_INPUTS,
    MISSING,
    SPEC_PASS,
    TARGET_ONLY_INPUTS,
    as_batch,
    flag,
    param,
    scalar,
    word_lists,
)

Arrays = dict[str, Any]  # name -> numpy array
DEFAULT_MAX_INFLIGHT = 256  # decoupled requests served at once (parameter specserve_max_inflight)
DEFAULT_AHEAD_MAX_INFLIGHT = 4  # drafting ahead up to this many requests in the BLS
OUTPUTS = ["output_ids", "sequence_length"]  # what every call asks for (see bls.py _keep)


@dataclass(frozen=True)
class BlsParams:
    """The BLS model's parameters; the speculation ones are specserve's (NVIDIA's BLS ignores
    them)."""

    llm: str = "tensorrt_llm"
    draft: str = ""
    accumulate: bool = False
    spec_mode: str = ""  # "draft" | "ngram" | "" (no speculation)
    ngram_max: int = ngram.DEFAULT_MAX_NGRAM
    max_draft_len: int | None = None
    vocab: int | None = None
    fast_logits: bool = False  # the draft's generation_logits are a fast-logits handle
    # parameter specserve_draft_logits: false for a draft padded to another vocab_size (same
    # tokenizer): acceptance by token ids only, use_draft_logits refused
    draft_logits: bool = True
    llm_decoupled: bool = False
    draft_decoupled: bool = False
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    # draft the next iteration while the target verifies (spec_loop: "Drafting ahead");
    # parameter specserve_draft_ahead, default true; never with fast logits (a handle to the
    # draft request, whose extra guess token the target must not see)
    draft_ahead: bool = True
    # ... while at most this many requests are in the BLS (parameter
    # specserve_draft_ahead_max_inflight): under load the calls started ahead and dropped
    # take cores the others need (docs/results.md, "The BLS loop": c = 8 lost 5% output
    # tok/s; c = 4 was even)
    ahead_max_inflight: int = DEFAULT_AHEAD_MAX_INFLIGHT
    # the target is specserve's reference model (parameter specserve_reference_target): it
    # takes num_draft_tokens, num_top_log_probs and prediction (request.py target_inputs)
    reference_target: bool = False

    @property
    def ahead(self) -> bool:
        """Whether requests may draft ahead: a draft model (not n-gram, whose drafts cost
        nothing), the parameter on, and no fast-logits handle."""
        return self.draft_ahead and self.spec_mode == "draft" and not self.fast_logits

    def ahead_now(self, inflight: int) -> bool:
        """Whether a request that starts with ``inflight`` requests in the BLS (itself
        included) drafts ahead."""
        return self.ahead and inflight <= self.ahead_max_inflight

    @classmethod
    def from_params(cls, params: dict[str, str]) -> BlsParams:
        draft = param(params, "tensorrt_llm_draft_model_name", "")
        max_draft = param(params, "max_draft_len", "")
        vocab = param(params, "tensorrt_llm_vocab_size", "")
        return cls(
            llm=param(params, "tensorrt_llm_model_name", "tensorrt_llm"), draft=draft,
            accumulate=flag(params, "accumulate_tokens"),
            spec_mode=param(params, "speculative_mode", "draft" if draft else ""),
            ngram_max=int(param(params, "ngram_max_size", str(ngram.DEFAULT_MAX_NGRAM))),
            max_draft_len=int(max_draft) if max_draft else None,
            vocab=int(vocab) if vocab else None,
            fast_logits=flag(params, "speculative_decoding_fast_logits"),
            draft_logits=flag(params, "specserve_draft_logits", default=True),
            llm_decoupled=flag(params, "tensorrt_llm_decoupled"),
            draft_decoupled=flag(params, "tensorrt_llm_draft_decoupled"),
            max_inflight=max(1, int(param(params, "specserve_max_inflight",
                                          str(DEFAULT_MAX_INFLIGHT)))),
            draft_ahead=flag(params, "specserve_draft_ahead", default=True),
            reference_target=flag(params, "specserve_reference_target"),
            ahead_max_inflight=int(param(params, "specserve_draft_ahead_max_inflight",
                                         str(DEFAULT_AHEAD_MAX_INFLIGHT))))


@dataclass(frozen=True)
class SpecOptions:
    """What a speculative request asks of the answer."""

    use_logits: bool = False  # use_draft_logits: the draft's logits go to the target
    streaming: bool = False  # a decoupled BLS and ``stream``
    counts_in: bool = False
    counts_out: bool = False
    exclude: bool = False  # exclude_input_in_output (non-streamed text)
    perf: bool = False


def check_spec_request(cfg: BlsParams, inputs: Arrays, k: int) -> None:
    """ValueError (one line) unless ``num_draft_tokens`` ``k`` can be served."""
    if k < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {k}")
    if cfg.max_draft_len is not None and k > cfg.max_draft_len:
        raise ValueError(f"num_draft_tokens {k} exceeds the target's max_draft_len "
                         f"{cfg.max_draft_len} (parameter max_draft_len)")
    if cfg.spec_mode == "draft" and not cfg.draft:
        raise ValueError("num_draft_tokens > 0 needs a draft model: parameter "
                         "tensorrt_llm_draft_model_name is empty")
    if cfg.spec_mode not in ("draft", "ngram"):
        raise ValueError("num_draft_tokens > 0 needs a draft source: parameter "
                         "tensorrt_llm_draft_model_name or speculative_mode ngram "
                         f"(speculative_mode is {cfg.spec_mode!r})")
    if not cfg.draft_logits and bool(scalar(inputs, "use_draft_logits", False)):
        raise ValueError("use_draft_logits: the draft's vocab_size differs from the target's "
                         "(same tokenizer, padded embeddings; parameter "
                         "specserve_draft_logits false), so its drafts are accepted by token "
                         "ids only: send use_draft_logits false")
    for name in ("beam_width", "num_return_sequences"):
        if int(scalar(inputs, name, 1)) > 1:
            raise ValueError(f"{name} > 1 is not supported with speculative decoding")
    for name in GUIDE_INPUTS:
        if name in inputs:
            raise ValueError(f"input '{name}' is not supported with speculative decoding "
                             "(num_draft_tokens > 0): the loop's draft calls ignore a grammar "
                             "and each target call would start it afresh; send "
                             "num_draft_tokens 0 (the target serves structured output)")
    for name in LOGITS_INPUTS:
        if bool(scalar(inputs, name, False)):
            raise ValueError(f"{name} is not supported with speculative decoding "
                             "(num_draft_tokens > 0): the answer is made of many draft and "
                             "target calls; send num_draft_tokens 0 for log probs or logits")
    for name in TARGET_ONLY_INPUTS:
        if name in inputs:
            raise ValueError(f"input '{name}' is not supported by the BLS's speculation loop "
                             "(num_draft_tokens > 0): its drafts come from its own draft "
                             "source, one target verify step at a time; send "
                             "num_draft_tokens 0 (the target serves it)")


def prompt_of(pre: Arrays) -> tuple[int, ...]:
    """The prompt ids preprocessing made (``input_ids`` trimmed to ``input_lengths``)."""
    n_in = int(pre["input_lengths"].reshape(-1)[0])
    return tuple(int(t) for t in pre["input_ids"].reshape(-1)[:n_in])


def end_id_of(pre: Arrays) -> int:
    return int(pre["end_id"].reshape(-1)[0]) if "end_id" in pre else -1


def spec_request(inputs: Arrays, pre: Arrays, k: int) -> spec_loop.SpecRequest:
    """The loop's request: the BLS inputs and preprocessing's outputs."""
    seed = scalar(inputs, "seed", None)
    return spec_loop.SpecRequest(
        prompt=prompt_of(pre), max_tokens=int(scalar(inputs, "max_tokens", 0)),
        num_draft_tokens=k,
        sampling=spec_loop.Sampling(
            temperature=_opt(inputs, "temperature", float), top_k=_opt(inputs, "top_k", int),
            top_p=_opt(inputs, "top_p", float), seed=None if seed is None else int(seed)),
        end_id=end_id_of(pre), stop_words=word_lists(pre.get("stop_words_list")),
        min_tokens=int(scalar(inputs, "min_tokens", 0)))


def _opt(inputs: Arrays, name: str, kind: Callable[[Any], Any]) -> Any:
    """The client's value of a sampling input, None when it sent none."""
    value = scalar(inputs, name, None)
    return None if value is None else kind(value)


def spec_options(inputs: Arrays, decoupled: bool) -> SpecOptions:
    return SpecOptions(
        use_logits=bool(scalar(inputs, "use_draft_logits", False)),
        streaming=decoupled and bool(scalar(inputs, "stream", False)),
        counts_in=bool(scalar(inputs, "return_num_input_tokens", False)),
        counts_out=bool(scalar(inputs, "return_num_output_tokens", False)),
        exclude=bool(scalar(inputs, "exclude_input_in_output", False)),
        perf=bool(scalar(inputs, "return_perf_metrics", False)))


def i32(v: int) -> Any:
    """An int as an INT32 [1, 1] array."""
    return np.array([[v]], dtype=np.int32)


def sampling_inputs(s: spec_loop.Sampling) -> Arrays:
    """The sampling tensors of one draft or target call: only those with a value. A sampling
    input the client did not set stays unset (upstream's ``triton_decoder.py``
    ``create_triton_tensors`` skips ``None``), so the executor keeps its greedy default: sending
    ``temperature`` 0 instead runs top-p sampling over logits scaled by ``1/(T + 1e-6)``, which
    is not the greedy path. ``min_tokens`` 0 (a
    target call with none left) is unset too."""
    out: Arrays = {}
    if s.temperature is not None:
        out["temperature"] = np.array([[s.temperature]], dtype=np.float32)
    if s.top_k is not None:
        out["runtime_top_k"] = i32(s.top_k)
    if s.top_p is not None:
        out["runtime_top_p"] = np.array([[s.top_p]], dtype=np.float32)
    if s.min_tokens > 0:
        out["min_tokens"] = i32(s.min_tokens)
    if s.seed is not None:
        out["seed"] = np.array([[s.seed]], dtype=np.uint64)
    return out


def call_inputs(inputs: Arrays, pre: Arrays, ctx: Sequence[int], s: spec_loop.Sampling,
                out_len: int, end_id: int) -> Arrays:
    """The inputs every draft and target call gets: the context, ``request_output_len``,
    ``end_id``, only new tokens back, the call's sampling (:func:`sampling_inputs`),
    preprocessing's ``pad_id`` / ``bad_words_list``, and the inputs the models judge themselves
    (:data:`SPEC_PASS`)."""
    out: Arrays = {
        "input_ids": np.array([list(ctx)], dtype=np.int32),
        "input_lengths": i32(len(ctx)),
        "request_output_len": i32(out_len),
        "end_id": i32(end_id),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        **sampling_inputs(s),
    }
    for name in ("pad_id", "bad_words_list"):
        if name in pre:
            out[name] = pre[name]
    for k in SPEC_PASS:
        if k in inputs:
            out[LLM[k]] = as_batch(inputs[k])
    return out


def draft_call(inputs: Arrays, pre: Arrays, ctx: Sequence[int], n: int, s: spec_loop.Sampling,
               opts: SpecOptions) -> tuple[Arrays, list[str]]:
    """(inputs, requested outputs) of the draft call: ``n`` tokens, never stopping on a token
    (``end_id`` -1), and ``return_generation_logits`` = ``use_draft_logits``, as upstream's
    ``_get_llm_tensors_from_request`` sets it for the draft: the logits are asked for (and their
    vocabulary checked, :func:`check_draft`) only when they go to the target."""
    out = call_inputs(inputs, pre, ctx, s, n, -1)
    out["return_generation_logits"] = np.array([[opts.use_logits]], dtype=bool)
    return out, OUTPUTS + (["generation_logits"] if opts.use_logits else [])


def draft_logits(cfg: BlsParams, out: Arrays, opts: SpecOptions) -> tuple[Any, Any]:
    """(the loop's per-position logits [n, V] or None, the fast-logits handle or None) of a
    draft answer. With ``speculative_decoding_fast_logits`` the draft engine answers, in place
    of its logits, a handle the target engine fetches them with (TensorRT-LLM
    ``LlmRequest::createResult``: ``specDecFastLogitsInfo`` {request id, MPI rank};
    ``ExternalDraftTokensConfig`` expects ``draft_logits`` [1, (sizeof(info) + 1) / 4]): it
    goes to the target unchanged, as upstream's BLS forwards it (one row, so its
    ``draft_logits[-len(drafts):]`` keeps it whole); none with ``use_draft_logits`` off."""
    logits = out.get("generation_logits") if opts.use_logits else None
    if logits is None or not cfg.fast_logits:
        return logits, None
    return None, np.ascontiguousarray(logits, dtype=np.float32).reshape(1, -1)


def target_call(inputs: Arrays, pre: Arrays, ctx: Sequence[int], drafts: Sequence[int],
                logits: Any, s: spec_loop.Sampling, fast: Any = None
                ) -> tuple[Arrays, list[str]]:
    """(inputs, requested outputs) of the target call: the drafts (+ their logits [1, k, V],
    or the fast-logits handle ``fast`` [1, 1, W] of :func:`draft_logits`),
    ``request_output_len`` = drafts + 1, preprocessing's ``end_id`` and stop words; exactly the
    outputs the target produces (no perf outputs: see ``bls.py`` ``_keep``)."""
    out = call_inputs(inputs, pre, ctx, s, len(drafts) + 1, end_id_of(pre))
    if "stop_words_list" in pre:
        out["stop_words_list"] = pre["stop_words_list"]
    if drafts:
        out["draft_input_ids"] = np.array([list(drafts)], dtype=np.int32)
        if fast is not None:
            out["draft_logits"] = np.ascontiguousarray(fast, dtype=np.float32)[None]
        elif logits is not None:
            out["draft_logits"] = np.ascontiguousarray(logits, dtype=np.float32)[None]
    return out, list(OUTPUTS)


def merge_outputs(responses: Sequence[Arrays]) -> Arrays:
    """One call's outputs over its responses (a decoupled model sends several): ``output_ids``
    the new ids of all of them (each trimmed to its ``sequence_length``), ``generation_logits``
    [n, V] concatenated, every other output its last value; empty responses skipped."""
    out: Arrays = {"output_ids": []}
    logits: list[Any] = []
    for got in responses:
        if not got:
            continue
        got = dict(got)
        ids = got.pop("output_ids", np.zeros((1, 1, 0), dtype=np.int32)).reshape(-1)
        n = int(got.pop("sequence_length", np.array([ids.size])).reshape(-1)[0])
        out["output_ids"].extend(int(t) for t in ids[:min(n, ids.size)])
        lg = got.pop("generation_logits", None)
        if lg is not None and lg.size:
            logits.append(lg.reshape(-1, lg.shape[-1]))
        out.update(got)
    if logits:
        out["generation_logits"] = np.concatenate(logits)
    return out


def call_error(role: str, model: str, message: str) -> str:
    """The message of a failed draft or target call, naming the model and its parameter."""
    param_name = ("tensorrt_llm_draft_model_name" if role == "draft"
                  else "tensorrt_llm_model_name")
    if any(m in message.lower() for m in MISSING):
        return (f"{role} model '{model}' (parameter {param_name}) is not available in the "
                f"repository: {message}")
    return f"{role} model '{model}' (parameter {param_name}): {message}"


def within_target_vocab(cfg: BlsParams, tokens: list[int]) -> list[int]:
    """A padded draft's tokens up to the first one the target's vocabulary lacks (parameter
    ``specserve_draft_logits`` false: the draft's rows are wider than the target's, and its
    padding rows are ids the target can never produce, so that draft and every one after it
    would be rejected anyway); any other draft's tokens as they are (:func:`check_draft`)."""
    if cfg.draft_logits or cfg.vocab is None:
        return tokens
    cut = next((i for i, t in enumerate(tokens) if not 0 <= t < cfg.vocab), len(tokens))
    return tokens[:cut]


def check_draft(cfg: BlsParams, tokens: Sequence[int], logits: Any) -> bool:
    """ValueError unless the draft's vocabulary (the width of its ``generation_logits``, sent
    with ``use_draft_logits`` only) is the target's and its ids are inside it; True when the
    vocabulary was checked here. Without logits only the ids are checked: acceptance is by token
    id then, and a draft whose embeddings are padded wider serves (upstream does not compare
    widths either)."""
    if cfg.vocab is None:
        return False
    checked = logits is not None and len(tokens) > 0
    if checked and logits.shape[-1] != cfg.vocab:
        raise ValueError(
            f"draft model '{cfg.draft}' has a vocabulary of {logits.shape[-1]} (its "
            f"generation_logits), the target's is {cfg.vocab} (parameter "
            "tensorrt_llm_vocab_size): draft and target must share the tokenizer")
    bad = next((t for t in tokens if not 0 <= t < cfg.vocab), None)
    if bad is not None:
        raise ValueError(f"draft model '{cfg.draft}' proposed token id {bad}, outside the "
                         f"target's vocabulary ({cfg.vocab})")
    return checked


def target_counts(drafts: Sequence[int], tokens: list[int]) -> tuple[list[int], int, int]:
    """(tokens, accepted, drafted) of a target answer: a rejected draft's position never holds
    the draft, so the accepted drafts are the prefix of the tokens equal to them."""
    return tokens, spec_loop.accepted_prefix(drafts, tokens), len(drafts)
