"""One request as the serving core takes it, whichever door it came through, and the limits of
the engine it is checked against. A door builds an :class:`LlmRequest` from its wire format
(Triton's tensors: :func:`specserve.triton.llm_io.parse_request`; Dynamo's preprocessed request:
:func:`specserve.frontends.dynamo_request.to_request`); :mod:`.admission` checks it into
:class:`~specserve.runtime.params.SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# draft_input_ids allowed on an engine whose record has no max_draft_len (a plain engine)
PLAIN_ENGINE_MAX_DRAFT_LEN = 16


@dataclass(frozen=True)
class EngineLimits:
    """What a request is checked against: the served model's vocabulary, the engine record's
    ``max_draft_len`` / ``max_input_len`` / ``max_seq_len`` (0: not recorded) and the
    tokenizer's EOS (the default ``end_id``)."""

    vocab_size: int
    max_draft_len: int = PLAIN_ENGINE_MAX_DRAFT_LEN
    max_input_len: int = 0
    max_seq_len: int = 0
    eos: int | None = None


@dataclass(frozen=True)
class LlmRequest:
    """One request as the reference decoder needs it."""

    prompt: list[int]
    max_tokens: int
    streaming: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None  # None: the tokenizer's EOS; negative: never stop on a token
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    exclude_input: bool = False
    perf: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    # draft_input_ids: None = none (a plain request), else ONE verify step of these drafts
    draft_ids: tuple[int, ...] | None = None
    draft_logits: np.ndarray[Any, Any] | None = field(default=None, compare=False, repr=False)
    return_generation_logits: bool = False
    return_log_probs: bool = False
    top_log_probs: int = 0
    num_draft_tokens: int | None = None  # None: the engine's draft length
    prediction: str | None = None  # Predicted Outputs: the expected output's text
    guide_type: str | None = None  # guided_decoding_guide_type (None: no structured output)
    guide: str | None = None  # guided_decoding_guide
    n: int = 1  # num_return_sequences: independent sequences, one response stream each

    @property
    def verify_max_tokens(self) -> int:
        """The tokens a draft_input_ids request can answer: min(request_output_len, K + 1)."""
        assert self.draft_ids is not None
        return min(self.max_tokens, len(self.draft_ids) + 1)
