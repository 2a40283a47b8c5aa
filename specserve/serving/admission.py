"""A request's checks into :class:`~specserve.runtime.params.SamplingParams` (pure): the prompt
and drafts against the engine's limits, ``n``, logprobs, the guide, ``prediction``, speculation
control and stops. Every door calls :func:`sampling_params` once per request; a bad request
fails alone with a one-line reason (ValueError or SpecserveError), before it reaches the
batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specserve.runtime.params import SamplingParams, expand_n
from specserve.serving.request import EngineLimits, LlmRequest

if TYPE_CHECKING:
    from specserve.runtime.grammar import CompiledGuide

Encode = Callable[[str], list[int]]
# (guide type, guide text) -> the guide compiled for the model's tokenizer, or SpecserveError
CompileGuide = Callable[[str, str], "CompiledGuide"]


def sampling_params(req: LlmRequest, limits: EngineLimits, encode: Encode | None = None,
                    guides: CompileGuide | None = None) -> SamplingParams:
    """The validated SamplingParams of ``req``, or ValueError/SpecserveError with a one-line
    reason (a bad request fails alone, before it reaches the batch). ``encode``: the model's
    tokenizer (text -> ids without special tokens), for ``prediction``; ``guides``: its
    grammar compiler, for ``guided_decoding_guide_type``."""
    n = len(req.prompt)
    bad = next((t for t in req.prompt if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise ValueError(f"generate: token id {bad} outside the vocab ({limits.vocab_size})")
    check_drafts(req, limits.vocab_size, limits.max_draft_len)
    if limits.max_input_len and n > limits.max_input_len:
        raise ValueError(f"prompt has {n} tokens, the engine's max_input_len is "
                         f"{limits.max_input_len}")
    # draft_input_ids: one verify step answers at most K + 1 tokens
    max_tokens = req.max_tokens if req.draft_ids is None else req.verify_max_tokens
    if limits.max_seq_len and n + max_tokens > limits.max_seq_len:
        raise ValueError(f"prompt {n} + request_output_len {max_tokens} exceeds the "
                         f"engine's max_seq_len {limits.max_seq_len}")
    end_id = limits.eos if req.end_id is None else (req.end_id if req.end_id >= 0 else None)
    min_tokens = req.min_tokens if req.draft_ids is None else min(req.min_tokens, max_tokens)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
        seed=req.seed, end_id=end_id, stop_token_ids=req.stop_token_ids, min_tokens=min_tokens,
        num_draft_tokens=req.num_draft_tokens, logprobs=req.return_log_probs,
        top_logprobs=req.top_log_probs, prediction=_prediction(req, limits, encode),
        guide=_guide(req, guides))
    params.validate()
    check_n(req)
    return params


def check_n(req: LlmRequest) -> None:
    """``num_return_sequences`` in [1, MAX_RETURN_SEQUENCES], never with ``draft_input_ids``
    (one verify step of the client's drafts has one answer); SpecserveError / ValueError."""
    if req.n != 1 and req.draft_ids is not None:
        raise ValueError("input 'num_return_sequences' > 1 cannot be combined with "
                         "'draft_input_ids'")
    expand_n(SamplingParams(), req.n)  # the range check, one message for every front door


def _prediction(req: LlmRequest, limits: EngineLimits, encode: Encode | None
                ) -> tuple[int, ...]:
    if req.prediction is None:
        return ()
    if req.draft_ids is not None:
        raise ValueError("input 'prediction' cannot be combined with 'draft_input_ids'")
    if encode is None:
        raise ValueError("input 'prediction' needs the model's tokenizer")
    ids = tuple(encode(req.prediction))
    context = limits.max_seq_len
    if context and len(ids) > context:
        raise ValueError(f"input 'prediction' has {len(ids)} tokens, more than the engine's "
                         f"max_seq_len {context}")
    return ids


def _guide(req: LlmRequest, guides: CompileGuide | None) -> CompiledGuide | None:
    if req.guide_type is None:
        return None
    if guides is None:
        raise ValueError("input 'guided_decoding_guide_type' needs the model's tokenizer")
    return guides(req.guide_type, req.guide or "")


def check_drafts(req: LlmRequest, vocab_size: int, max_draft_len: int) -> None:
    """Raise ValueError (naming the input) unless the drafts fit the target: at most
    ``max_draft_len`` (the engine's; :data:`~specserve.serving.request.PLAIN_ENGINE_MAX_DRAFT_LEN`
    when it records none), ids inside the vocabulary, ``draft_logits`` [K, vocab_size]."""
    if req.draft_ids is None:
        return
    k = len(req.draft_ids)
    if k > max_draft_len:
        raise ValueError(f"input 'draft_input_ids' has {k} tokens, more than the engine's "
                         f"max_draft_len {max_draft_len}")
    bad = next((t for t in req.draft_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"input 'draft_input_ids': token id {bad} outside the vocab "
                         f"({vocab_size})")
    if req.draft_logits is not None and req.draft_logits.shape[1] != vocab_size:
        raise ValueError(f"input 'draft_logits' must be [K, V] = [{k}, {vocab_size}] (the "
                         f"target's vocab), got {list(req.draft_logits.shape)}")
