"""Why a request ended, in OpenAI's words (``finish_reason``), from what the serving loop
knows of it: the tokens it generated and its parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specserve.runtime.params import SamplingParams


def finish_reason(generated: int, params: SamplingParams) -> str:
    """OpenAI's ``finish_reason`` of a request that ended with ``generated`` tokens: "length"
    when it reached ``max_tokens``, else "stop" (a stop token, which is not in the output)."""
    return "length" if generated >= params.max_tokens else "stop"
