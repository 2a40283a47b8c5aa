"""Per-request sampling parameters (the fields TensorRT-LLM's Triton backend takes per request:
``temperature``, ``runtime_top_k``, ``runtime_top_p``, ``random_seed``, ``end_id``, stop words,
``max_tokens``, ``min_tokens``), plus the per-request API features:

- ``num_draft_tokens`` (the semantics of tensorrtllm_backend's BLS input of that name): None =
  the engine's own draft length; 0 = no speculation for this request (plain decoding steps,
  nothing drafted); k > 0 = at most k drafts per step. A tree proposer (Medusa, EAGLE-3 with
  ``eagle_choices``) verifies its top-1 chain for the whole step when a row's cap is below the
  tree's depth (:func:`SamplingParams.draft_cap`; the decoder's ``chain_only``).
- ``logprobs`` / ``top_logprobs`` (TensorRT-LLM's ``return_log_probs``; OpenAI's ``logprobs`` /
  ``top_logprobs``): the target's log-probability of each emitted token and the
  ``top_logprobs`` most likely alternatives, from the logits of the forward that chose it (the
  verify forward under speculation), after temperature (T = 0: T = 1) and the min_tokens stop
  ban, before top-k/top-p (:mod:`specserve.spec.logprobs`).
- ``prediction`` (OpenAI's Predicted Outputs; Triton input ``prediction``): token ids of the
  expected output, a draft source (:mod:`specserve.runtime.proposers.prediction`); at most the
  engine's context length (checked by the decoder and the scheduler).
- ``guide`` (structured output; Triton ``guided_decoding_guide_type`` / ``guided_decoding_guide``,
  OpenAI ``response_format``): a grammar compiled by the front door for the engine's tokenizer
  (:mod:`specserve.runtime.grammar`); every emitted token is sampled from the target's
  distribution masked to the grammar, with or without speculation. The request's stop ids are
  the grammar's stop tokens (one is needed); ``min_tokens`` is refused with a guide (it could
  ban the only token the grammar allows)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specserve.errors import SpecserveError

if TYPE_CHECKING:
    from specserve.runtime.grammar import CompiledGuide

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs (vLLM's default max_logprobs is 20 too)
MAX_RETURN_SEQUENCES = 16  # n (OpenAI) / num_return_sequences (TensorRT-LLM) per request


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. ``temperature == 0`` is greedy. ``seed`` seeds the request's
    own ``torch.Generator`` (None: nondeterministic). Generation stops at ``end_id`` or any of
    ``stop_token_ids`` (not included in the output), after a multi-token stop word from
    ``stop_sequences`` (included: its first tokens may already have been streamed), or after
    ``max_tokens`` new tokens. Stops are ignored before ``min_tokens``."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    num_draft_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    prediction: tuple[int, ...] = ()
    guide: CompiledGuide | None = None

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise SpecserveError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise SpecserveError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecserveError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecserveError(f"top_k must be >= 0, got {self.top_k}")
        if any(len(seq) == 0 for seq in self.stop_sequences):
            raise SpecserveError("stop_sequences: empty stop word")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise SpecserveError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise SpecserveError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise SpecserveError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got "
                                 f"{self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise SpecserveError("top_logprobs needs logprobs (return_log_probs) on")
        if self.guide is not None:
            if self.min_tokens:
                raise SpecserveError("min_tokens cannot be combined with guided decoding")
            if not self.stop_ids:
                raise SpecserveError("guided decoding needs a stop token (end_id) to end the "
                                     "grammar")

    def draft_cap(self, default: int) -> int:
        """The most drafts per step this request allows when the engine drafts ``default``."""
        return default if self.num_draft_tokens is None else min(default, self.num_draft_tokens)

    @property
    def stop_ids(self) -> frozenset[int]:
        ids = set(self.stop_token_ids)
        if self.end_id is not None:
            ids.add(self.end_id)
        return frozenset(ids)


def expand_n(params: SamplingParams, n: int) -> list[SamplingParams]:
    """``n > 1`` (OpenAI's ``n``, TensorRT-LLM's ``num_return_sequences``): the parameters of
    ``n`` independent sequences of one prompt, each submitted as its own request (its own row,
    proposer state, generator and finish reason). Sequence i is seeded ``seed + i`` (no seed:
    each its own nondeterministic generator). Each sequence prefills the prompt itself: no
    prompt KV is shared yet (a paged cache can share it later). SpecserveError unless
    1 <= n <= MAX_RETURN_SEQUENCES."""
    if not 1 <= n <= MAX_RETURN_SEQUENCES:
        raise SpecserveError(f"n (num_return_sequences) must be in [1, {MAX_RETURN_SEQUENCES}], "
                             f"got {n}")
    return [replace(params, seed=None if params.seed is None else params.seed + i)
            for i in range(n)]
