"""One request's accounting: what a transport's :class:`~specserve.client.transport.RawResult`
says, as the fields of its :class:`~specserve.client.metrics.RequestRecord`.

- Text: a door that answers token ids (``tensorrt_llm``) has each chunk's text decoded here
  with the model's tokenizer (``--tokenizer``).
- Tokens per chunk: the server's counts, else the tokenizer's or one per chunk
  (:func:`specserve.client.tokens.resolve_chunk_tokens`); an OpenAI ``usage.completion_tokens``
  is the request's total, and counts that disagree with it are fitted to it.
- Acceptance: the engine's per-request figures (:class:`~specserve.client.acceptance.
  EngineAcceptance`) over the perf outputs and ``spec_stats_json``, and which field they came
  from.
- Predicted Outputs: the server's accepted / rejected prediction tokens and, where the door
  answered ids and a tokenizer is given, the client's recount (:func:`specserve.client.
  prediction.recount`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specserve.client.prediction import TEXT_ONLY, Codec, chunk_texts, recount
from specserve.client.tokens import fit_to_total, resolve_chunk_tokens
from specserve.client.transport import GenParams, RawResult


def decode_ids(raw: RawResult, codec: Codec | None) -> None:
    """A door that answers ids (``tensorrt_llm``): each chunk's text, decoded here."""
    ids = raw.output_ids
    if ids is None or codec is None:
        return
    counts = [n or 0 for n in raw.chunk_num_tokens]
    if sum(counts) == len(ids):
        raw.chunk_texts = chunk_texts(ids, counts, codec.decode)
    elif raw.chunk_texts:  # counts that do not add up: the whole text on the last chunk
        raw.chunk_texts = [""] * (len(raw.chunk_texts) - 1) + [codec.decode(ids)]


def chunk_tokens(raw: RawResult, mode: str,
                 count_text: Callable[[str], int] | None) -> tuple[list[int], str]:
    """Tokens of each chunk and where the counts came from (``usage+...`` where the request's
    ``usage`` total was applied)."""
    counts, source = resolve_chunk_tokens(raw.chunk_num_tokens, raw.chunk_texts, mode,
                                          count_text)
    if raw.usage_tokens is not None and sum(counts) != raw.usage_tokens:
        counts, source = fit_to_total(counts, raw.usage_tokens), f"usage+{source}"
    elif raw.usage_tokens is not None:
        source = "usage" if source == "server" else f"usage+{source}"
    return counts, source


def acceptance_source(raw: RawResult) -> str | None:
    """Which server field the request's acceptance came from (``None``: none was sent)."""
    if raw.acceptance is not None:
        return raw.acceptance.source
    if raw.spec_stats:
        return "specserve: spec_stats_json"
    if "total_draft_tokens" in raw.server:
        return "triton: perf outputs"
    return None


def acceptance_fields(raw: RawResult) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """The record's server fields, spec stats and acceptance source: the engine's per-request
    acceptance, where it sent one, over the perf outputs and ``spec_stats_json``."""
    server, spec_stats, source = raw.server, raw.spec_stats, acceptance_source(raw)
    if raw.acceptance is not None:
        server = {**server, **raw.acceptance.server_fields()}
        spec_stats = raw.acceptance.spec_stats() or spec_stats
    return server, spec_stats, source


def prediction_fields(raw: RawResult, params: GenParams | None,
                      codec: Codec | None) -> dict[str, Any]:
    """The record's Predicted Outputs fields (all unset without a prediction)."""
    if params is None or params.prediction is None:
        return {}
    out: dict[str, Any] = {
        "prediction_sent": True,
        "accepted_prediction_tokens": raw.accepted_prediction_tokens,
        "rejected_prediction_tokens": raw.rejected_prediction_tokens}
    ids = raw.output_ids
    if ids is None:
        out["prediction_recount_note"] = TEXT_ONLY
    elif codec is None:
        out["prediction_recount_note"] = "no recount: no --tokenizer"
    else:
        out["prediction_recount"] = recount(
            ids, codec.encode(params.prediction, special=False), params.max_tokens,
            params.num_draft_tokens)
    return out
