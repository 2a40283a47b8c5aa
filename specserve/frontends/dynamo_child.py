"""One child process of a Dynamo deployment (the frontend or a worker): its command, log,
start and restart, Dynamo's liveness probe on its system status port, and its last error line;
the free system ports the workers' probes listen on. Used by
:mod:`specserve.frontends.dynamo_serve` (the deployment) and
:mod:`specserve.frontends.dynamo_supervisor` (the runner that restarts children)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specserve.errors import ServerError
from specserve.processes import die_with_parent

HOST = "127.0.0.1"

#: system status ports: ai-dynamo-runtime 1.6.1 parses ``DYN_SYSTEM_PORT`` as an i16
SYSTEM_PORTS = range(20000, 32768)
RESTART_MARK = "specserve: ---- restarted"
#: Dynamo's canary: after 3 s without traffic, one request through the engine; no answer in
#: 8 s = the endpoint not ready (frontends/dynamo_registration.py)
CANARY_ENV = {"DYN_HEALTH_CHECK_ENABLED": "true", "DYN_CANARY_WAIT_TIME": "3",
              "DYN_HEALTH_CHECK_REQUEST_TIMEOUT": "8"}


def free_system_ports(n: int, avoid: set[int]) -> list[int]:
    """``n`` distinct ports of :data:`SYSTEM_PORTS` free on 127.0.0.1 now."""
    import random
    import socket

    got: list[int] = []
    for port in random.sample(SYSTEM_PORTS, len(SYSTEM_PORTS)):
        if len(got) == n:
            break
        if port in avoid or port in got:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        got.append(port)
    if len(got) < n:
        raise ServerError(f"no {n} free ports in {SYSTEM_PORTS.start}-{SYSTEM_PORTS.stop - 1}")
    return got


@dataclass
class Child:
    """One started process, its role and its log."""

    role: str  # "frontend" | "worker <name> #<i>"
    cmd: list[str]
    log: Path
    metrics_port: int = 0
    model: str = ""
    proc: subprocess.Popen[bytes] | None = None
    system_port: int = 0  # Dynamo's system status server (the liveness probe); 0: none
    starts: int = 0

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics" if self.metrics_port else ""

    def start(self, env: dict[str, str]) -> None:
        """Start (a restart appends to the log after a :data:`RESTART_MARK` line)."""
        if self.system_port:
            env = {**env, "DYN_SYSTEM_PORT": str(self.system_port),
                   "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]'}
        with open(self.log, "ab" if self.starts else "wb") as log:
            if self.starts:
                log.write(f"{RESTART_MARK} ({self.starts}) ----\n".encode())
                log.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True,
                                         preexec_fn=die_with_parent())
        self.starts += 1

    def healthy(self, timeout_s: float) -> bool:
        """Dynamo's system status server of this worker answers ``GET /health`` with
        ``"status": "ready"`` within ``timeout_s``."""
        url = f"http://{HOST}:{self.system_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                return r.status == 200 and bool(json.loads(r.read()).get("status") == "ready")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return False

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def last_error(self) -> str:
        """The child's most telling log line: its last ``error:`` / exception line, else the
        last line."""
        try:
            text = self.log.read_text(errors="replace").rsplit(RESTART_MARK, 1)[-1]
        except OSError:
            return "(no log)"
        lines = [s.strip() for s in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()
                 if s.strip()]
        for s in reversed(lines):
            if s.startswith(("error:", "Error")) or "Error:" in s or "ERROR" in s:
                return s[-300:]
        return lines[-1][-300:] if lines else "(empty log)"
