"""TCP_NODELAY on the TCP listeners Dynamo binds in this process (the time to first token behind
Dynamo).

Why: Dynamo 1.6.1's OpenAI frontend serves HTTP with ``axum::serve(listener, router)``
(ai-dynamo/dynamo ``lib/llm/src/http/service/service_v2.rs``, ``HttpService::run_inner``),
which leaves Nagle's algorithm on for every accepted connection; no ``DYN_*`` variable or flag
changes it (none in ``frontend_args.py``, none among the runtime's ``DYN_HTTP_*`` names). On a
keep-alive connection the frontend writes the response headers as soon as the worker's stream
opens, then the first SSE chunk a few ms later: Nagle holds that small second write until the
client ACKs the headers, and the client (its last act was sending the request, so Linux delays
the ACK) ACKs after ~40 ms. Measured here (docs/results.md, "Through Dynamo or through
Triton?"): first event 47.9 ms with Nagle, 10.5 ms with TCP_NODELAY, on one running frontend,
by turning the option on and off.

How: Linux copies TCP_NODELAY from a listening socket to the sockets it accepts (tcp(7):
``inet_csk_clone_lock`` clones the listener's socket), so setting it once on the listener
covers every later connection. :func:`watch` runs on a daemon thread of the process that will
bind the listener (the frontend, started through :mod:`specserve.frontends.dynamo_frontend`;
the worker, whose request-plane listener answers each request with a small ack) and sets the
option on each TCP listener as it appears in ``/proc/self/fd``. Standard library only.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

FD_DIR = Path("/proc/self/fd")


def _listener(fd: int) -> socket.socket | None:
    """A duplicate of ``fd`` when it is a listening TCP socket (the caller closes it)."""
    try:
        if not os.readlink(FD_DIR / str(fd)).startswith("socket:"):
            return None
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM \
                and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return s
    except OSError:
        pass
    s.close()
    return None


def set_on_listeners(seen: set[int] | None = None) -> list[int]:
    """Set TCP_NODELAY on every listening TCP socket of this process not in ``seen`` (a set of
    ports, updated); the ports set now."""
    seen = set() if seen is None else seen
    done = []
    for name in os.listdir(FD_DIR):
        s = _listener(int(name))
        if s is None:
            continue
        with s:
            port = int(s.getsockname()[1])
            if port in seen:
                continue
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            seen.add(port)
            done.append(port)
    return done


def watch(on_set: Callable[[int], None], until: Callable[[set[int]], bool],
          duration_s: float = 300.0, interval_s: float = 0.005) -> threading.Thread:
    """A daemon thread setting TCP_NODELAY on each TCP listener of this process as it appears,
    calling ``on_set(port)`` for each; it ends once ``until(ports set so far)`` holds, or after
    ``duration_s``."""
    def run() -> None:
        seen: set[int] = set()
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for port in set_on_listeners(seen):
                on_set(port)
            if until(seen):
                return
            time.sleep(interval_s)

    t = threading.Thread(target=run, name="specserve-nodelay", daemon=True)
    t.start()
    return t
