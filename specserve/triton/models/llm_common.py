"""What the reference ``tensorrt_llm`` Triton model (:mod:`specserve.triton.models.llm`) and
its in-flight loop (:mod:`specserve.triton.models.llm_inflight`) share: a queued request
(:class:`_Pending`) and the response-sender helpers of Triton's decoupled Python backend
(``pb_utils``; importable only inside tritonserver's Python stub).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from specserve.triton.llm_io import LlmRequest
from specserve.triton.models.bls_lib.detok import TokenHoldBack


@dataclass
class _Pending:
    req: LlmRequest
    params: Any  # SamplingParams
    sender: Any
    arrival: int
    first_scheduled: int = 0
    first_token: int = 0
    last_token: int = 0
    done: bool = False  # final sent, or the client went away
    hold: TokenHoldBack | None = None  # streaming: tokens held back while they end mid-character
    handle: Any = None  # in-flight batching: its scheduler Handle
    final_sent: bool = False  # in-flight batching: the COMPLETE_FINAL flag went out


def _send(sender: Any, response: Any, final: bool) -> bool:
    """Send one response; False when the client is gone (cancelled stream, closed sender)."""
    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
    try:
        if sender.is_cancelled():
            if final:
                sender.send(flags=flags)
            return False
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)
        return True
    except Exception:
        return False


def _gone(sender: Any) -> bool:
    """The client cancelled (a sender that cannot tell counts as still there)."""
    try:
        return bool(sender.is_cancelled())
    except Exception:
        return False


def _inputs(request: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Every input of a request as a numpy copy (valid after execute() returns)."""
    return {t.name(): t.as_numpy().copy() for t in request.inputs()}


def _response(arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])


def _error(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
