"""Tokens per streamed chunk (pure).

The server's count is the truth: TensorRT-LLM >= 0.20 returns ``num_output_tokens`` when the
request sets ``return_num_output_tokens``. In streaming mode each
response carries the tokens of one step; whether its ``num_output_tokens`` counts that response
(``per_response``) or the request so far (``cumulative``) is fixed in ``docs/architecture.md``
("Triton contract": per response, as in the pinned release). Only when the server sends no
count do we re-tokenize the text (genai-perf's method, which over-counts when per-step
detokenization yields U+FFFD pieces), and with no tokenizer either, each chunk counts as one
token. The record says which was used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

COUNT_MODES = ("per_response", "cumulative")


def resolve_chunk_tokens(
    num_tokens: Sequence[int | None],
    texts: Sequence[str],
    mode: str = "per_response",
    count_text: Callable[[str], int] | None = None,
) -> tuple[list[int], str]:
    """Tokens carried by each chunk, and the source: ``server``, ``tokenizer`` or ``chunks``."""
    if mode not in COUNT_MODES:
        raise ValueError(f"unknown num_output_tokens mode {mode!r}")
    if num_tokens and all(n is not None for n in num_tokens):
        counts = [int(n) for n in num_tokens if n is not None]
        if mode == "cumulative":
            prev = 0
            deltas = []
            for c in counts:
                deltas.append(max(c - prev, 0))
                prev = max(prev, c)
            counts = deltas
        return counts, "server"
    if count_text is not None:
        out: list[int] = []
        prev_total = 0
        text = ""
        for piece in texts:
            text += piece
            total = count_text(text) if text else 0
            out.append(max(total - prev_total, 0))
            prev_total = max(prev_total, total)
        return out, "tokenizer"
    return [1 if piece else 0 for piece in texts], "chunks"


def fit_to_total(counts: Sequence[int], total: int) -> list[int]:
    """Per-chunk counts rescaled to sum to ``total`` (the server's ``usage``), in proportion
    (largest remainders), each non-empty chunk keeping at least one token when ``total`` allows.

    Used when the server gives only the request's total: the re-tokenized (or per-chunk) split
    is kept, the total is the server's."""
    nonempty = [i for i, k in enumerate(counts) if k > 0]
    out = [0] * len(counts)
    if not nonempty or total <= 0:
        return out
    if sum(counts) == total:
        return list(counts)
    floor = 1 if total >= len(nonempty) else 0
    spare = total - floor * len(nonempty)
    weight = sum(counts[i] for i in nonempty)
    shares = {i: spare * counts[i] / weight for i in nonempty}
    for i in nonempty:
        out[i] = floor + int(shares[i])
    left = total - sum(out)
    for i in sorted(nonempty, key=lambda i: (-(shares[i] - int(shares[i])), i))[:left]:
        out[i] += 1
    return out
