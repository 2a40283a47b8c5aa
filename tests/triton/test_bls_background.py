"""``bls_lib/background.py``: one request's streamed responses made and sent on a thread of their
own, in order, with the first failure handed back to the loop's thread."""

from __future__ import annotations

import threading

import pytest

from specserve.triton.models.bls_lib.background import Background, Cancelled


def test_jobs_run_in_order_and_close_waits_for_them() -> None:
    done: list[int] = []
    gate = threading.Event()
    bg = Background()
    bg.put(lambda: gate.wait(5) and done.append(0))
    for i in range(1, 20):
        bg.put(lambda i=i: done.append(i))
    gate.set()
    bg.close()
    assert done == list(range(20))


def test_put_returns_while_a_job_is_still_running() -> None:
    """The loop goes on with its next call while the previous iteration's send is in flight."""
    go, finished = threading.Event(), threading.Event()
    bg = Background()
    bg.put(lambda: go.wait(5) and finished.set())
    assert not finished.is_set()  # put did not run the job itself
    go.set()
    bg.close()
    assert finished.is_set()


@pytest.mark.parametrize("failure", [Cancelled(), RuntimeError("postprocessing: bad id")])
def test_a_failed_job_stops_the_rest_and_is_raised_in_the_loop(failure: Exception) -> None:
    ran: list[str] = []
    bg = Background()

    def fail() -> None:
        ran.append("fail")
        raise failure

    bg.put(fail)
    bg.put(lambda: ran.append("after"))
    with pytest.raises(type(failure)):
        bg.close()  # waits, then raises the job's failure
    assert ran == ["fail"]  # nothing sent after it
    with pytest.raises(type(failure)):
        bg.put(lambda: ran.append("later"))
    assert ran == ["fail"]
