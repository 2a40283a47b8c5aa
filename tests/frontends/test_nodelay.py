"""TCP_NODELAY on Dynamo's listeners (specserve/frontends/nodelay.py): the quick tests set it
on a listener of this process and check that an accepted connection inherits it; the ``dynamo``
test reads the option on the frontend's own accepted client connection (pidfd_getfd(2)), with
the shipped frontend (``nodelay=False``: Nagle on) as the control."""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from specserve.frontends.dynamo_frontend import http_port
from specserve.frontends.nodelay import set_on_listeners


def _nodelay(s: socket.socket) -> int:
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_listener_gets_the_option_and_its_connections_inherit_it() -> None:
    with socket.socket() as lst, socket.socket() as other:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        other.bind(("127.0.0.1", 0))  # bound, not listening: left alone
        port = lst.getsockname()[1]
        seen: set[int] = set()
        assert port in set_on_listeners(seen) and port in seen
        assert port not in set_on_listeners(seen)  # once per port
        assert _nodelay(other) == 0
        with socket.create_connection(("127.0.0.1", port)) as cli:
            acc, _ = lst.accept()
            with acc:
                assert _nodelay(acc) == 1
                assert _nodelay(cli) == 0  # the client side is the client's business


def test_http_port_of_the_frontend_arguments() -> None:
    assert http_port(["--http-host", "127.0.0.1", "--http-port", "8090"]) == 8090
    assert http_port(["--http-port=8091"]) == 8091
    # no flag: Dynamo's own order, DYN_HTTP_PORT (an operator's env), then its default 8000
    assert http_port(["--router-mode", "kv"], env={"DYN_HTTP_PORT": "8093"}) == 8093
    assert http_port(["--http-port", "8090"], env={"DYN_HTTP_PORT": "8093"}) == 8090
    assert http_port(["--router-mode", "kv"], env={}) == 8000


def _remote_sockets(pid: int) -> Iterator[socket.socket]:
    """Duplicates of process ``pid``'s TCP sockets (pidfd_getfd(2)); skips where not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    if pidfd < 0:
        pytest.skip(f"pidfd_open: errno {ctypes.get_errno()}")
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(438, pidfd, int(name), 0)  # pidfd_getfd
            if fd < 0:
                pytest.skip(f"pidfd_getfd: errno {ctypes.get_errno()}")
            s = socket.socket(fileno=fd)
            if s.family == socket.AF_INET and s.type == socket.SOCK_STREAM:
                yield s
            else:
                s.close()
    finally:
        os.close(pidfd)


@contextmanager
def _deployment(engine: Path, nodelay: bool) -> Iterator[Any]:
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    dep = DynamoDeployment(DynamoServeConfig(engine=engine, models=(ServedModel("tiny"),),
                                             nodelay=nodelay))
    with dep.start(180):
        yield dep


def _server_side_nodelay(dep: Any) -> int:
    """TCP_NODELAY of the frontend's end of a fresh client connection."""
    with socket.create_connection(("127.0.0.1", dep.http_port)) as cli:
        cli.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        cli.recv(100)  # accepted and answered: the server's socket exists
        mine = cli.getsockname()
        for s in _remote_sockets(dep.children[0].proc.pid):
            with s:
                try:
                    if s.getpeername() == mine:
                        return _nodelay(s)
                except OSError:
                    continue
    raise AssertionError("the frontend's end of the connection was not found")


@pytest.mark.dynamo
def test_the_frontend_accepts_clients_with_nagle_off(tiny_ckpt: Any, tmp_path: Path) -> None:
    from tests.helpers.server import make_tiny_engine

    engine = make_tiny_engine(tiny_ckpt, tmp_path / "engine-draft", "draft", True)
    with _deployment(engine, nodelay=True) as dep:
        assert _server_side_nodelay(dep) == 1
        worker_log = dep.workers[0].log.read_text(errors="replace")
        assert "specserve: TCP_NODELAY set on listener port" in worker_log
    with _deployment(engine, nodelay=False) as dep:  # the control: Dynamo as shipped
        assert _server_side_nodelay(dep) == 0
