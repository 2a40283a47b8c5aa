"""Lookahead decoding's ``(W, N, G)`` configuration (Fu et al. 2024, "Break the Sequential
Dependency of LLM Inference Using Lookahead Decoding", arXiv:2402.02057), as TensorRT-LLM's
engine flow takes it (pure; standard library only).

Upstream facts (NVIDIA/TensorRT-LLM ``examples/lookahead/README.md`` @
7ed07f0691dff2c1c89196adee670ce9f4f15f67, ``triton_backend/inflight_batcher_llm/src/
model_instance_state.cc`` @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd; read, not copied, pinned
in ``tests/build/data/trtllm_lookahead.json``):

- W = ``windows_size`` (Jacobi window), N = ``ngram_size`` (the most draft tokens accepted per
  step), G = ``verification_set_size`` (n-grams verified per step);
- the engine is built with ``trtllm-build --speculative_decoding_mode lookahead_decoding
  --max_draft_len D``, ``D = (0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)``, and the
  server's ``(W, N, G)`` must give exactly that ``D``;
- Triton's ``tensorrt_llm`` model takes ``decoding_mode: lookahead`` with the parameters
  ``lookahead_window_size``, ``lookahead_ngram_size``, ``lookahead_verification_set_size``
  (all three, or the model fails to load);
- ``(1, 1, 0)`` is plain autoregressive decoding and ``(2, 2, 1)`` the meaningful minimum: a
  configuration whose ``D`` is 0 drafts nothing and is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.errors import SpecserveError

#: Triton ``tensorrt_llm`` parameter keys, in (W, N, G) order.
TRITON_PARAMETERS = ("lookahead_window_size", "lookahead_ngram_size",
                     "lookahead_verification_set_size")


@dataclass(frozen=True)
class Lookahead:
    """A server-level lookahead configuration ``(W, N, G)``."""

    window_size: int
    ngram_size: int
    verification_set_size: int

    @classmethod
    def parse(cls, text: str, what: str = "--lookahead") -> Lookahead:
        """``"W,N,G"`` (e.g. ``"7,7,7"``) -> a checked :class:`Lookahead`."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 3:
            raise SpecserveError(f"{what} {text!r}: expected three integers W,N,G (window, "
                                 "n-gram and verification set sizes), e.g. 7,7,7")
        out = cls(*values)
        out.validate(what)
        return out

    @classmethod
    def from_dict(cls, data: object, what: str) -> Lookahead:
        """The recorded form (:meth:`to_dict`), checked; ``what`` names the file in errors."""
        keys = ("window_size", "ngram_size", "verification_set_size")
        if not isinstance(data, dict) or any(
                not isinstance(data.get(k), int) or isinstance(data.get(k), bool) for k in keys):
            raise SpecserveError(f"{what}: 'lookahead' must hold integer {list(keys)}, got "
                                 f"{data!r}")
        out = cls(*(data[k] for k in keys))
        out.validate(what)
        return out

    def to_dict(self) -> dict[str, int]:
        return {"window_size": self.window_size, "ngram_size": self.ngram_size,
                "verification_set_size": self.verification_set_size}

    def text(self) -> str:
        return f"{self.window_size},{self.ngram_size},{self.verification_set_size}"

    @property
    def max_draft_len(self) -> int:
        """The engine's ``--max_draft_len`` (upstream's formula)."""
        n = self.ngram_size
        return (0 if n == 1 else n - 2) + (self.window_size - 1 + self.verification_set_size) * (
            n - 1)

    def validate(self, what: str = "--lookahead") -> None:
        if self.window_size < 1 or self.ngram_size < 1 or self.verification_set_size < 0:
            raise SpecserveError(f"{what} {self.text()}: W and N must be >= 1 and G >= 0")
        if self.max_draft_len == 0:
            raise SpecserveError(f"{what} {self.text()}: drafts nothing (max_draft_len 0, "
                                 "plain autoregressive decoding); the smallest speculating "
                                 "configuration is 2,2,1")

    def triton_parameters(self) -> dict[str, str]:
        """The three Triton ``tensorrt_llm`` parameters."""
        values = (self.window_size, self.ngram_size, self.verification_set_size)
        return {k: str(v) for k, v in zip(TRITON_PARAMETERS, values, strict=True)}
