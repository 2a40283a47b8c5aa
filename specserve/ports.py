"""Free TCP ports for the servers we start (neutral, standard library only): tritonserver's
HTTP/gRPC/metrics ports and the Dynamo frontend's and workers' ports."""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection
from contextlib import ExitStack


def find_free_ports(n: int, host: str = "127.0.0.1", avoid: Collection[int] = (),
                    new_socket: Callable[[], socket.socket] = socket.socket) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now, none of them in ``avoid``. The
    sockets are held bound until all are picked: ports picked one at a time, each socket closed
    before the next bind, can come back equal (seen: tritonserver refused to start with HTTP and
    metrics on the same port). ``new_socket``: a TCP socket (the tests give a model kernel)."""
    with ExitStack() as stack:
        got: list[int] = []
        while len(got) < n:
            s = stack.enter_context(new_socket())
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port not in avoid:
                got.append(port)
        return got
