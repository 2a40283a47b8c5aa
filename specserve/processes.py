"""Child processes that do not outlive us (neutral, standard library only): the servers we
start (tritonserver, a peer vLLM) get SIGTERM when the process that started them dies, even by
SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``, prctl(2))."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies, so a killed
    test run or CLI leaves no server behind. None where it cannot work: not Linux, or not the
    main thread (the signal follows the thread that forked, and a worker thread may end long
    before the server should)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not \
            threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(1)
    return preexec
