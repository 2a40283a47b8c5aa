"""The ``tensorrt_llm`` model's response sender (``specserve.triton.models.llm.TritonSender``)
over a stand-in for Triton's decoupled response sender: "cancelled?" costs a round trip to
tritonserver, so an answer is reused for ``CANCEL_POLL_S``; a final response always asks
afresh, and a cancelled request gets its final flag alone."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.helpers.fake_module import installed

FINAL = 1


class Sender:
    """Triton's response sender: counts is_cancelled() calls, records what is sent."""

    def __init__(self) -> None:
        self.asked = 0
        self.gone = False
        self.sent: list[tuple[Any, int]] = []

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.gone

    def send(self, response: Any = None, flags: int = 0) -> None:
        self.sent.append((response, flags))


@pytest.fixture
def llm() -> Iterator[Any]:
    m = types.ModuleType("triton_python_backend_utils")
    m.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL  # type: ignore[attr-defined]
    m.InferenceResponse = lambda output_tensors, error=None: ("response", output_tensors, error)  # type: ignore[attr-defined]  # noqa: E501
    m.Tensor = lambda name, value: (name, value)  # type: ignore[attr-defined]
    m.TritonError = lambda msg: msg  # type: ignore[attr-defined]
    with installed(m, reimport=("specserve.triton.models.llm",)):
        from specserve.triton.models import llm as mod

        yield mod


def test_cancelled_is_asked_at_most_once_per_interval(llm: Any) -> None:
    now = [0.0]
    raw = Sender()
    s = llm.TritonSender(raw, clock=lambda: now[0])
    arrays = {"output_ids": np.zeros((1, 1, 1), dtype=np.int32)}
    assert not s.cancelled()
    for _ in range(5):  # the loop's poll and streamed responses within one interval
        assert not s.cancelled() and s.send(arrays, None, final=False)
    assert raw.asked == 1 and len(raw.sent) == 5
    now[0] += llm.CANCEL_POLL_S
    raw.gone = True
    assert s.cancelled() and raw.asked == 2
    assert not s.send(arrays, None, final=False) and len(raw.sent) == 5  # nothing more sent


def test_a_final_response_asks_afresh(llm: Any) -> None:
    raw = Sender()
    s = llm.TritonSender(raw, clock=lambda: 0.0)
    assert not s.cancelled()
    raw.gone = True  # the client went away within the interval
    assert not s.send({"output_ids": np.zeros((1, 1, 1), dtype=np.int32)}, None, final=True)
    assert raw.asked == 2 and raw.sent == [(None, FINAL)]  # the final flag alone


def test_outbox_sends_in_order_from_its_own_thread(llm: Any) -> None:
    """With an Outbox, send() returns at once and the responses go out in order on the
    outbox's thread; once cancelled (learnt by a poll through the outbox) send() says so and
    the final response is the final flag alone."""
    import threading

    raw, box = Sender(), llm.Outbox()
    threads: list[str] = []
    orig = raw.send

    def send(response: Any = None, flags: int = 0) -> None:
        threads.append(threading.current_thread().name)
        orig(response, flags)
    raw.send = send  # type: ignore[method-assign]
    now = [0.0]
    s = llm.TritonSender(raw, clock=lambda: now[0], outbox=box)
    for i in range(3):
        assert s.send({"output_ids": np.full((1, 1, 1), i, dtype=np.int32)}, None, final=False)
    delivered = threading.Event()
    box.put(delivered.set)
    assert delivered.wait(5)   # the three responses are out
    raw.gone = True            # then the client goes away
    now[0] += llm.CANCEL_POLL_S
    stall = threading.Event()
    box.put(lambda: stall.wait(5))  # keep the outbox busy: the poll waits its turn
    assert not s.cancelled()   # the poll is queued: not known yet
    stall.set()
    box.close()
    assert s.cancelled()       # learnt by the outbox's poll
    box2 = llm.Outbox()
    s.outbox = box2
    assert not s.send({"output_ids": np.zeros((1, 1, 1), dtype=np.int32)}, None, final=False)
    assert not s.send(None, None, final=True)
    box2.close()
    sent = [int(r[1][0][1][0, 0, 0]) for r, _ in raw.sent[:3]]
    assert sent == [0, 1, 2] and raw.sent[3:] == [(None, FINAL)]
    assert set(threads) == {"specserve-send"}
