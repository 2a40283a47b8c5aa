"""The context axis of ``specserve bench --sweep ... --input-lengths 128,512,2048`` (pure).

Acceptance falls and verification cost rises with context length, so a schedule keyed on batch
size alone is wrong at long context in both directions (vLLM RFC #48627, speculators PR #684:
EAGLE-3 tau 2.30 at 2k -> 1.08 at 20k).
SPEED-Bench's throughput split (arXiv 2604.09557) buckets prompts by input length with real
text, since random-token prompts overstate speculative throughput.

- :func:`long_prompts`: prompts of exactly ``length`` tokens of the *served* tokenizer, built by
  joining dataset texts (rotated per prompt, so every prompt differs) and cutting at the token
  boundary that tokenizer reports (its character offsets), re-counted after the cut.
- :func:`check_lengths`: a length the engine cannot hold (``max_input_len``, or
  ``length + max_tokens > max_seq_len`` from its ``build_config.json``) is refused in one line.
- :func:`step_ms`: the measured cost of one step, per request ``(E2E - TTFT) / steps`` (the
  streamed chunks after the first; a verify step, proposal included, for speculation; a decode
  step for the baseline), averaged over completed requests; :func:`steps_mean`: how many
  such steps a request took, and :func:`step_ms_p50`: the median interval between chunks. The
  mean minus the median is mostly the stalls of steps that waited for another request's
  prefill; ``specserve predict --sweep`` reads the baseline's as the served prefill cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specserve.client.metrics import RequestRecord
from specserve.client.prompt import Prompt
from specserve.errors import SpecserveError

#: text -> the character offset where each token ends (no special tokens added)
TokenEnds = Callable[[str], list[int]]


def parse_lengths(text: str) -> list[int]:
    """``128,512,2048`` -> [128, 512, 2048] (positive, increasing, no repeats)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise SpecserveError(f"--input-lengths: '{text}' is not a list of token counts like "
                             "128,512,2048") from e
    if not out or min(out) < 1 or out != sorted(set(out)):
        raise SpecserveError(f"--input-lengths: '{text}': give increasing token counts >= 1")
    return out


@dataclass(frozen=True)
class ContextLimits:
    """What the served engine holds (its build record), and where that was read."""

    max_input_len: int
    max_seq_len: int
    source: str


def check_lengths(lengths: Sequence[int], max_tokens: int, limits: ContextLimits | None) -> None:
    """Refuse, in one line, the first length the engine cannot serve with ``max_tokens``."""
    if limits is None:
        return
    for n in lengths:
        if n > limits.max_input_len or n + max_tokens > limits.max_seq_len:
            fit = min(limits.max_input_len, limits.max_seq_len - max_tokens)
            raise SpecserveError(
                f"--input-lengths {n}: the engine ({limits.source}) holds max_input_len "
                f"{limits.max_input_len} and max_seq_len {limits.max_seq_len} (input + "
                f"--max-tokens {max_tokens}); use lengths <= {fit} or rebuild it longer")


def cut_to_tokens(text: str, length: int, ends: TokenEnds) -> str | None:
    """The prefix of ``text`` holding exactly ``length`` tokens when re-tokenized, or None
    (``text`` too short, or no cut re-counts to ``length``: a merge across the cut)."""
    offsets = ends(text)
    if len(offsets) < length:
        return None
    for j in (length - 1, length, length - 2, length + 1):  # the boundary, then its neighbours
        if 0 <= j < len(offsets):
            cut = text[:offsets[j]]
            if len(ends(cut)) == length:
                return cut
    return None


def long_prompts(pool: Sequence[Prompt], length: int, n: int, ends: TokenEnds,
                 sep: str = "\n\n") -> list[Prompt]:
    """``n`` prompts of exactly ``length`` tokens: prompt ``i`` joins the pool's texts from
    ``pool[i % len(pool)]`` on (wrapping round) and is cut at a token boundary; its category is
    its first text's, its ``max_tokens`` the run's (a conversation contributes its first turn)."""
    if not pool:
        raise SpecserveError("--input-lengths: the prompt set is empty")
    out = []
    for i in range(n):
        first = pool[i % len(pool)]
        parts: list[str] = []
        j = i
        while True:
            parts.append(pool[j % len(pool)].text)
            text = sep.join(parts)
            if len(ends(text)) > length + 1:
                break
            j += 1
            if j - i > 50 * len(pool) + length:
                raise SpecserveError(f"--input-lengths {length}: the prompt set's text is too "
                                     "short to build such prompts")
        cut = cut_to_tokens(text, length, ends) or cut_to_tokens(text + sep, length, ends)
        if cut is None:
            raise SpecserveError(f"--input-lengths {length}: no cut of prompt {i} re-tokenizes "
                                 f"to exactly {length} tokens")
        out.append(replace(first, text=cut, max_tokens=None, messages=(), turns=()))
    return out


def tokenizer_ends(path: str | Path) -> TokenEnds:
    """:data:`TokenEnds` of a tokenizer folder or ``tokenizer.json`` (HF ``tokenizers``)."""
    from tokenizers import Tokenizer

    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    try:
        tok = Tokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise SpecserveError(f"{f}: cannot load tokenizer ({e})") from e
    return lambda text: [end for _, end in tok.encode(text, add_special_tokens=False).offsets]


def step_ms(records: Sequence[RequestRecord]) -> float | None:
    """Mean per-request step time in ms: ``(E2E - TTFT) / steps`` over completed streamed
    requests with at least one step after the first chunk (None when there are none)."""
    vals = [(r.e2e_s - r.ttft_s) / len(r.tokens_per_step) * 1e3 for r in records
            if r.status == "completed" and r.phase == "measure" and r.e2e_s is not None
            and r.ttft_s is not None and r.tokens_per_step]
    return sum(vals) / len(vals) if vals else None


def steps_mean(records: Sequence[RequestRecord]) -> float | None:
    """Mean steps per request after the first chunk, over the requests :func:`step_ms` uses."""
    vals = [len(r.tokens_per_step) for r in records
            if r.status == "completed" and r.phase == "measure" and r.e2e_s is not None
            and r.ttft_s is not None and r.tokens_per_step]
    return sum(vals) / len(vals) if vals else None


def step_ms_p50(records: Sequence[RequestRecord]) -> float | None:
    """Median interval between consecutive chunks after the first, in ms, over the requests
    :func:`step_ms` uses (a step that did not wait for anyone's prefill; None without any)."""
    vals = sorted(x for r in records if r.status == "completed" and r.phase == "measure"
                  and r.e2e_s is not None and r.ttft_s is not None and r.tokens_per_step
                  for x in r.itl_chunk_s)
    if not vals:
        return None
    mid = len(vals) // 2
    return (vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2) * 1e3
