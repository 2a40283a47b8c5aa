"""Requests through the Triton model's in-flight serving loop without pb_utils: each request
admitted as ``llm.py``'s execute() admits it (a refusal is that request's one error), then
the loop run to its end (test-only helper)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

import numpy as np

from specserve.runtime.decoder import SpecDecoder
from specserve.serving.engine import external_verify, make_scheduler
from specserve.serving.loop import Pending, ServingLoop
from specserve.serving.request import EngineLimits
from specserve.triton.llm_io import admit
from specserve.triton.model_params import ModelParams
from tests.serving.test_loop import Recorder


def serve_requests(dec: SpecDecoder, reqs: list[dict[str, np.ndarray]], limits: EngineLimits,
                   detokenize: Callable[[list[int]], str], *, capacity: int = 4,
                   max_pending: int = 8, decoupled: bool = True,
                   **admit_kw: Any) -> list[Recorder]:
    """One Recorder per request (``capacity`` rows, ``max_pending`` queued, K = 3 external
    verify; ``decoupled``: the model's transaction policy)."""
    q: queue.Queue[Pending | None] = queue.Queue()
    loop = ServingLoop(make_scheduler(dec, capacity, 0, 256), q, max_pending,
                       external_verify(dec, 3), detokenize)
    senders = []
    for a in reqs:
        s = Recorder()
        senders.append(s)
        try:
            req, params = admit(a, ModelParams(engine_dir="unused"), decoupled, limits, **admit_kw)
        except Exception as e:  # as llm.py execute(): this request only
            s.send(None, f"tensorrt_llm: {e}", final=True)
            continue
        q.put(Pending(req=req, params=params, sender=s, arrival=1))
    q.put(None)
    loop.run()
    return senders
