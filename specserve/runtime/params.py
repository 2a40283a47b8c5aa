"""Per-request sampling parameters (the fields TensorRT-LLM's Triton backend takes per request:
``temperature``, ``runtime_top_k``, ``runtime_top_p``, ``random_seed``, ``end_id``, stop words,
``max_tokens``, ``min_tokens``)."""

from __future__ import annotations

from dataclasses import dataclass

from specserve.errors import SpecserveError


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

    @property
    def stop_ids(self) -> frozenset[int]:
        ids = set(self.stop_token_ids)
        if self.end_id is not None:
            ids.add(self.end_id)
        return frozenset(ids)
