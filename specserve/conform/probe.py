"""The protocol-neutral request (:class:`Probe`) and answer (:class:`Reply`) of a conformance
check, and how a failed answer is classified (refused vs broken).

A check speaks only in probes; a target adapter (``targets.py``) maps a probe onto its protocol
(OpenAI ``/v1/completions`` / ``/v1/chat/completions`` fields, or the Triton ensemble's input
tensors) or raises :class:`NotExpressible` naming what the protocol lacks.

Classification: an HTTP 4xx, or an error whose text says the feature is not
supported, is a clean refusal; a 5xx, a timeout, a cut connection, a stream without its end, or
a body of the wrong shape is broken. Triton's gRPC errors carry no usable status (a Python
model's errors are all INTERNAL): there an error answer is a refusal unless its text is one of
a crash (:data:`CRASH_WORDS`: a dead stub process, an unavailable model, a timeout, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# Error texts that are a server's own refusal of a feature (Triton carries no HTTP status on
# gRPC, and a Python model's errors are all INTERNAL): matched case-insensitively.
REFUSAL_WORDS = ("not supported", "unsupported", "not served", "not implemented", "invalid",
                 "must be", "must hold", "exceeds", "is empty", "unexpected inference input",
                 "is not allowed", "not allowed", "cannot be", "refused")


CRASH_WORDS = ("stub process", "not healthy", "unavailable", "segmentation", "traceback",
               "internal error", "timeout", "cancelled", "socket closed", "connection",
               "stream cut", "exited", "killed", "core dumped")


class NotExpressible(Exception):
    """The protocol has no way to say what the probe asks (the reason is the message)."""


@dataclass(frozen=True)
class Probe:
    """One request, in the words of the OpenAI API (``None`` / empty = not sent)."""

    prompt: str
    max_tokens: int
    chat: bool = False
    stream: bool = False
    temperature: float | None = 0.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int | None = None
    ignore_eos: bool = False
    n: int | None = None
    logprobs: int | None = None          # top-k size; chat: logprobs=true + top_logprobs=k
    response_format: dict[str, Any] | None = None
    regex: str | None = None

    def but(self, **changes: Any) -> Probe:
        return replace(self, **changes)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob and its top-k alternatives (token text -> logprob)."""

    token: str
    logprob: float | None
    top: dict[str, float] | None


@dataclass
class Choice:
    """One choice of an answer (OpenAI ``choices[i]``; the Triton ensemble has one)."""

    index: int = 0
    text: str = ""
    chunks: list[str] = field(default_factory=list)   # streamed text pieces, in order
    chunk_tokens: list[int | None] = field(default_factory=list)  # tokens in each piece
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class Reply:
    """What came back for one probe (``wire`` is exactly what was sent)."""

    wire: dict[str, Any]
    choices: list[Choice] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: int | None = None       # HTTP status where there is one
    error: str | None = None
    broken: bool = False            # the error is a crash/hang/5xx/wrong shape, not a refusal

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def refused(self) -> bool:
        return self.error is not None and not self.broken

    @property
    def text(self) -> str:
        return self.choices[0].text if self.choices else ""

    @property
    def first(self) -> Choice:
        return self.choices[0] if self.choices else Choice()

    def to_dict(self) -> dict[str, Any]:
        """JSON evidence of this reply."""
        return {"request": self.wire, "status": self.status, "error": self.error,
                "broken": self.broken, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "choices": [{"index": c.index, "text": c.text, "chunks": c.chunks,
                             "chunk_tokens": c.chunk_tokens,
                             "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                             "logprobs": None if c.logprobs is None else [
                                 {"token": t.token, "logprob": t.logprob, "top": t.top}
                                 for t in c.logprobs]}
                            for c in self.choices]}


def is_refusal(status: int | None, message: str) -> bool:
    """True when an error is the server's clean refusal: HTTP 4xx, or (no status, as on
    Triton gRPC) a message saying the feature or value is not accepted."""
    if status is not None:
        return 400 <= status < 500
    low = message.lower()
    return any(w in low for w in REFUSAL_WORDS)


def is_triton_refusal(message: str) -> bool:
    """A Triton error answer without an HTTP status: a refusal unless it reads as a crash."""
    low = message.lower()
    return not any(w in low for w in CRASH_WORDS)


def failed(wire: dict[str, Any], message: str, status: int | None = None,
           transport_failure: bool = False, refusal: bool | None = None) -> Reply:
    """A reply that is an error: broken unless it is a clean refusal (``refusal`` overrides
    the classification by status and text)."""
    clean = is_refusal(status, message) if refusal is None else refusal
    broken = transport_failure or not clean
    return Reply(wire=wire, status=status, error=message, broken=broken)
