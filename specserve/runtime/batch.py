"""Per-call state of :class:`specserve.runtime.decoder.SpecDecoder`: the sequences of one
``generate``/``verify`` call, their outputs, stop conditions (end_id/stop tokens, max_tokens,
min_tokens, stop sequences), stats, generators, times, the opt-in emitted-token logits and
log-probabilities (:mod:`specserve.spec.logprobs`), the guided rows' grammar matchers
(:mod:`specserve.runtime.grammar`); the result record of one request; and, for in-flight
batching, one step's batch detached from the requests' own state (:meth:`Batch.detach`) with what
it did to each row (:class:`RowOutput`, applied by the scheduler's ``update``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specserve.runtime.grammar import GuideMatcher
from specserve.runtime.params import SamplingParams
from specserve.runtime.proposers import Proposer
from specserve.spec.logprobs import token_logprobs
from specserve.spec.stats import AcceptanceStats


@dataclass
class GenerationResult:
    """One request's output. ``finish_reason``: "stop" (end_id/stop token, not included),
    "length" (max_tokens) or "verified" (:meth:`SpecDecoder.verify`: its one step ended before
    max_tokens). Times are ``time.time_ns()``. ``logits`` [T, V] float32, only when asked
    (``return_logits``): for each emitted token the target's logits it was chosen from (stop
    tokens banned before ``min_tokens`` are -inf, as when it was chosen). ``logprobs`` [T] and
    ``top_logprobs`` (T lists of (token id, log-probability), most likely first), only when
    ``SamplingParams.logprobs``: see :mod:`specserve.spec.logprobs` for the distribution."""

    token_ids: list[int]
    stats: AcceptanceStats
    finish_reason: str
    first_token_time_ns: int
    last_token_time_ns: int
    logits: torch.Tensor | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # Predicted Outputs (OpenAI's usage fields), only when the request had a prediction:
    # prediction drafts accepted by verification; the prediction's length minus that
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    # structured output with grammar-forced drafts (runtime/forced_drafts.py): drafts the
    # grammar proposed (forced or jump-forward tokens) that verification accepted
    accepted_forced_tokens: int = 0

    @property
    def cum_logprob(self) -> float:
        """TensorRT-LLM's ``cum_log_probs``: the sum of the emitted tokens' log-probabilities."""
        return float(sum(self.logprobs or ()))


@dataclass(frozen=True)
class RowOutput:
    """What one step (a prefill, or a speculative step) did to one row: the tokens it emitted,
    its finish reason ("" while it runs on), this step's acceptance stats (empty after a
    prefill), the row's first/last token times, its draft length for the next step (adaptive;
    None: unset), the emitted tokens' kept logits and log-probabilities (when asked), and the
    prediction drafts accepted this step and the grammar-forced drafts accepted this step."""

    tokens: tuple[int, ...]
    finish: str
    stats: AcceptanceStats
    first_ns: int
    last_ns: int
    draft_len: int | None
    logits: tuple[torch.Tensor, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[list[tuple[int, float]], ...]
    predicted: int
    forced: int = 0


class Batch:
    """Mutable per-call state: sequences, outputs, stop flags, stats, generators, times."""

    def __init__(self, prompts: list[list[int]], params: list[SamplingParams],
                 device: torch.device) -> None:
        n = len(prompts)
        self.params = params
        self.seqs = [list(p) for p in prompts]
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.done = [False] * n
        self.finish = [""] * n
        self.stats = [AcceptanceStats() for _ in range(n)]
        self.history = [AcceptanceStats() for _ in range(n)]  # each row's stats before `stats`
        self.stop = [p.stop_ids for p in params]
        self.first, self.last = [0] * n, [0] * n
        self.gens = []
        for p in params:
            g = torch.Generator(device=device)
            if p.seed is None:
                g.seed()
            else:
                g.manual_seed(p.seed)
            self.gens.append(g)
        self.k: list[int] = []  # per-sequence draft length (chain steps)
        self.one_step = False  # SpecDecoder.verify: the caller's drafts, verified as given
        self.prop: Proposer | None = None  # this call's proposer
        self.logits: list[list[torch.Tensor]] | None = None  # per row, when some row asked
        self.want: list[bool] = [False] * n
        self.lps: list[list[float]] = [[] for _ in range(n)]  # per row, when params.logprobs
        self.tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(n)]
        self.pred = [[0] for _ in range(n)]  # per row: prediction drafts accepted (one cell)
        self.predicted: set[int] = set()  # rows whose drafts came from their prediction (step)
        self.base = [0] * n  # outputs' lengths before this step (a detach batch)
        self.forced = [0] * n  # per row: grammar-forced drafts accepted
        self.forced_at: dict[int, list[int]] = {}  # per row: its forced drafts' indices (step)
        # structured output: each guided row's grammar matcher (runtime/grammar.py)
        self.guides: list[GuideMatcher | None] = [
            None if p.guide is None else p.guide.matcher(sorted(p.stop_ids)) for p in params]

    @classmethod
    def detach(cls, parts: list[Batch], prop: Proposer | None) -> Batch:
        """One step's batch over single-row parts (in-flight batching: the model runner runs
        the decoder on it): copies of each part's sequence, output and flags, empty stats and
        captured logits / log-probabilities, so a step changes no part; :meth:`outputs` says
        what it did and :meth:`apply` is how a part takes it. The generators are the parts'
        own (row b's random stream goes on where it was)."""
        st = cls.__new__(cls)
        st.params = [p.params[0] for p in parts]
        st.seqs, st.out = [list(p.seqs[0]) for p in parts], [list(p.out[0]) for p in parts]
        st.base = [len(o) for o in st.out]
        st.done, st.finish = [p.done[0] for p in parts], [p.finish[0] for p in parts]
        st.stats = [AcceptanceStats() for _ in parts]
        st.history = [p.stats[0] for p in parts]  # the parts' own, read only
        st.stop = [p.stop[0] for p in parts]
        st.first, st.last = [p.first[0] for p in parts], [p.last[0] for p in parts]
        st.gens, st.prop = [p.gens[0] for p in parts], prop
        st.k = [p.k[0] for p in parts] if all(p.k for p in parts) else []
        st.one_step = False
        st.want = [p.want[0] for p in parts]
        st.lps, st.tops = [[] for _ in parts], [[] for _ in parts]
        st.pred, st.predicted = [[0] for _ in parts], set()
        st.forced, st.forced_at = [0] * len(parts), {}
        # the parts' own matchers, like their generators: a step advances each guided row's
        # grammar state by exactly the tokens its RowOutput carries (rejections rolled back)
        st.guides = [p.guides[0] for p in parts]
        st.logits = [[] for _ in parts] if any(st.want) else None
        return st

    def outputs(self) -> list[RowOutput]:
        """What this :meth:`detach` batch's step did, row by row."""
        return [RowOutput(tuple(self.out[b][self.base[b]:]),
                          self.finish[b] if self.done[b] else "", self.stats[b],
                          self.first[b], self.last[b], self.k[b] if self.k else None,
                          tuple(self.logits[b]) if self.logits is not None else (),
                          tuple(self.lps[b]), tuple(self.tops[b]), self.pred[b][0],
                          self.forced[b])
                for b in range(len(self.seqs))]

    def apply(self, r: RowOutput) -> None:
        """A single-row batch (one request's state) takes one step's :class:`RowOutput`."""
        self.out[0].extend(r.tokens)
        self.seqs[0].extend(r.tokens)
        self.done[0], self.finish[0] = bool(r.finish), r.finish
        self.stats[0] = self.stats[0].merge(r.stats)
        self.first[0], self.last[0] = r.first_ns, r.last_ns
        if r.draft_len is not None:
            self.k = [r.draft_len]
        if self.logits is not None:
            self.logits[0].extend(r.logits)
        self.lps[0].extend(r.logprobs)
        self.tops[0].extend(r.top_logprobs)
        self.pred[0][0] += r.predicted
        self.forced[0] += r.forced

    def keep_logits(self, want: list[bool]) -> None:
        """Keep the logits of emitted tokens for the rows that want them (opt-in)."""
        self.want = want
        self.logits = [[] for _ in want] if any(want) else None

    def capture(self, b: int, logits: torch.Tensor) -> None:
        """logits [n, V] of the n tokens row b just emitted (a copy: the batch tensor goes)."""
        if self.logits is not None and self.want[b] and logits.shape[0]:
            self.logits[b].append(logits.float().clone())

    def record(self, b: int, logits: torch.Tensor, new: list[int]) -> None:
        """logits [>= n, V] of the n tokens ``new`` row b just emitted: keep what the row asked
        for (its logits, its log-probabilities)."""
        if not new:
            return
        rows = logits[:len(new)]
        if self.logits is not None:
            self.capture(b, rows)
        p = self.params[b]
        if p.logprobs:
            lp = token_logprobs(rows, new, p.temperature, p.top_logprobs)
            self.lps[b].extend(lp.logprobs)
            self.tops[b].extend(list(zip(i, v, strict=True))
                                for i, v in zip(lp.top_ids, lp.top_logprobs, strict=True))

    def result(self, b: int, reason: str, vocab: int) -> GenerationResult:
        """Row b's :class:`GenerationResult` (finish reason ``reason``)."""
        p = self.params[b]
        want_lp, acc = p.logprobs, self.pred[b][0]
        return GenerationResult(self.out[b], self.stats[b], reason, self.first[b], self.last[b],
                                self.result_logits(b, vocab),
                                list(self.lps[b]) if want_lp else None,
                                list(self.tops[b]) if want_lp else None,
                                acc if p.prediction else None,
                                max(len(p.prediction) - acc, 0) if p.prediction else None,
                                self.forced[b])

    def result_logits(self, b: int, vocab: int) -> torch.Tensor | None:
        if self.logits is None or not self.want[b]:
            return None
        rows = self.logits[b]
        return torch.cat(rows) if rows else torch.zeros(0, vocab)

    def count_forced(self, b: int, accepted: int) -> None:
        """Row b's step accepted (and emitted) its first ``accepted`` drafts: count the
        grammar-forced ones among them."""
        self.forced[b] += sum(j < accepted for j in self.forced_at.get(b, ()))

    def active(self) -> list[int]:
        return [b for b, d in enumerate(self.done) if not d]

    def emit(self, b: int, tokens: list[int]) -> list[int]:
        """Append tokens to sequence b up to a stop condition; the tokens actually emitted."""
        p, out, new = self.params[b], self.out[b], []
        for t in tokens:
            if t in self.stop[b] and len(out) >= p.min_tokens:
                self.done[b], self.finish[b] = True, "stop"
                break
            out.append(t)
            new.append(t)
            if len(out) >= p.max_tokens:
                self.done[b], self.finish[b] = True, "length"
                break
            if p.stop_sequences and len(out) >= p.min_tokens and any(
                    out[-len(w):] == list(w) for w in p.stop_sequences):
                self.done[b], self.finish[b] = True, "stop"
                break
        self.seqs[b].extend(new)
        if new or self.done[b]:  # a request stopped before any token still gets its times
            now = time.time_ns()
            self.first[b] = self.first[b] or now
            self.last[b] = now
        return new
