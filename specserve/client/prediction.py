"""Predicted Outputs in ``specserve bench`` (pure but for loading a tokenizer).

A record's ``prediction`` (the expected output's text) goes with the spec variant's request at
every door: Triton's ``prediction`` input (``ensemble``, ``tensorrt_llm_bls``, ``tensorrt_llm``),
Dynamo's ``nvext.annotations`` ``"prediction:<text>"`` or OpenAI's top-level ``prediction``.
The baseline variant is sent the same request without it, so a run whose baseline is the same
model measures what the prediction buys.

Per request the record keeps what the server counted (``accepted_prediction_tokens`` /
``rejected_prediction_tokens``; ``None`` where it returned nothing, never 0) and, where the door
answers token ids (the ``tensorrt_llm`` model), the client's own recount
(:func:`specserve.client.prediction_usage.accepted_prediction_tokens`, from the emitted ids and
the prediction's ids under the model's tokenizer). The recount replays an engine that drafts
from the prediction alone (no proposer of its own behind it): against an engine with one, a
mismatch is the proposer's steps, not a miscount. Doors that answer text only (``ensemble``,
the BLS, OpenAI) get no recount: re-tokenized text need not be the emitted ids.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.client.metrics import RequestRecord
from specserve.client.prediction_usage import MAX_DRAFT, accepted_prediction_tokens
from specserve.errors import SpecserveError

NOT_RETURNED = "not returned"
TEXT_ONLY = "text only: the door returns no token ids"


@dataclass(frozen=True)
class Codec:
    """The model's tokenizer on the client: prompt ids for a door that takes ids, their text
    back, the prediction's ids for the recount, and token counts (``tokenizers.Tokenizer``)."""

    tok: Any

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))

    def count(self, text: str) -> int:
        return len(self.encode(text, special=False))


def load_codec(path: str | None) -> Codec | None:
    """The tokenizer of a folder (its ``tokenizer.json``) or file; ``None`` without a path."""
    if path is None:
        return None
    from tokenizers import Tokenizer

    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    try:
        return Codec(Tokenizer.from_file(str(f)))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise SpecserveError(f"{f}: cannot load tokenizer ({e})") from e


def chunk_texts(ids: Sequence[int], counts: Sequence[int], decode: Any) -> list[str]:
    """Each chunk's text from the ids of the whole answer (chunk i holds ``counts[i]`` ids):
    the growth of the decoded prefix, so a character split over two chunks shows once."""
    out, done, prev = [], 0, ""
    for n in counts:
        done += n
        text = decode(ids[:done])
        cut = len(prev) if text.startswith(prev) else len(text)
        out.append(text[cut:])
        prev = text if text.startswith(prev) else prev
    return out


def recount(emitted: Sequence[int], prediction_ids: Sequence[int], max_tokens: int,
            num_draft_tokens: int | None) -> int:
    """The client's accepted prediction tokens at T = 0 (no proposer behind the prediction);
    ``num_draft_tokens`` caps the prediction drafts of a step as the engine does."""
    cap = MAX_DRAFT if num_draft_tokens is None else min(num_draft_tokens, MAX_DRAFT)
    return accepted_prediction_tokens(list(emitted), list(prediction_ids), max_tokens, cap)


def summarize_predictions(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """Predicted Outputs over the completed ``records`` that carried a prediction; ``None``
    when none did. Server totals are over the requests whose server returned the counts;
    ``not_returned`` counts the others (totals read "not returned", never 0, when none did).
    ``mismatches``: requests whose server count differs from the client's recount, over the
    ``compared`` ones (both known); ``recount_notes``: why the others have no recount."""
    sent = [r for r in records if r.prediction_sent and r.status == "completed"]
    if not sent:
        return None
    counted = [r for r in sent if r.accepted_prediction_tokens is not None]
    recounted = [r for r in sent if r.prediction_recount is not None]
    both = [r for r in recounted if r.accepted_prediction_tokens is not None]
    return {
        "requests": len(sent),
        "server_counted": len(counted),
        "not_returned": len(sent) - len(counted),
        "accepted_prediction_tokens": sum(r.accepted_prediction_tokens or 0 for r in counted)
        if counted else NOT_RETURNED,
        "rejected_prediction_tokens": sum(r.rejected_prediction_tokens or 0 for r in counted)
        if counted else NOT_RETURNED,
        "recounted": len(recounted),
        "recount_accepted": sum(r.prediction_recount or 0 for r in recounted)
        if recounted else None,
        "compared": len(both),
        "mismatches": sum(r.accepted_prediction_tokens != r.prediction_recount for r in both),
        "recount_notes": sorted({r.prediction_recount_note for r in sent
                                 if r.prediction_recount_note}),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def prediction_summary(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """``summary.json``'s ``prediction``: :func:`summarize_predictions` of the spec variant's
    measured requests and, with a baseline (the same requests without the prediction), per
    prompt: whether both outputs are equal (lossless at T = 0) and the median ratios of
    per-user tok/s and of E2E (baseline / spec: > 1 = the prediction is faster). ``None``
    when no request carried a prediction."""
    meas = [r for r in records if r.phase == "measure"]
    spec = summarize_predictions([r for r in meas if r.variant == "spec"])
    if spec is None:
        return None
    out: dict[str, Any] = {"spec": spec}
    base = {(r.prompt_index, r.turn): r for r in meas
            if r.variant == "baseline" and r.status == "completed"}
    pairs = [(r, base[(r.prompt_index, r.turn)]) for r in meas
             if r.variant == "spec" and r.prediction_sent and r.status == "completed"
             and (r.prompt_index, r.turn) in base]
    if pairs:
        tok = [x for s, b in pairs if (x := _ratio(s.output_tokens / s.e2e_s if s.e2e_s else None,
                                                   b.output_tokens / b.e2e_s if b.e2e_s else None))]
        e2e = [x for s, b in pairs if (x := _ratio(b.e2e_s, s.e2e_s))]
        out["vs_baseline"] = {
            "pairs": len(pairs),
            "outputs_equal": sum(s.output_text == b.output_text for s, b in pairs),
            "per_user_tok_s_ratio_median": statistics.median(tok) if tok else None,
            "e2e_ratio_median": statistics.median(e2e) if e2e else None,
        }
    return out
