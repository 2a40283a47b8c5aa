"""Start and stop a real Triton Inference Server for a model repository.

Finds ``tritonserver`` on ``PATH`` (NVIDIA's containers) or the binary bundled in the
``nvidia-pytriton`` wheel, prepares the Python backend for the running interpreter (stub + library
copied into a private backend folder, venv on ``PATH``, base ``LIBDIR`` on ``LD_LIBRARY_PATH``),
starts it bound to ``127.0.0.1`` with ``--disable-auto-complete-config``, and waits for
``/v2/health/ready``. On failure the first error lines of the server log are raised as
:class:`ServerError`, and nothing is left behind: the server runs in its own process group (stubs
included), its shared-memory regions carry a private prefix that is removed on stop, and it gets
SIGTERM if the starting process dies without stopping it (even by SIGKILL; Linux
``PR_SET_PDEATHSIG``). What it launches (the command, the environment, the backend folder; multi-GPU
and TensorRT-LLM orchestrator modes) is planned by :mod:`specserve.triton.launch`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from specserve.errors import ServerError
from specserve.ports import find_free_ports
from specserve.processes import die_with_parent
from specserve.triton.launch import (
    build_command,
    find_tritonserver,
    gpu_count,
    multi_model_args,
    prepare_backends,
    prespawn_world_size,
    server_env,
    tensorrtllm_models,
)

_ERROR_PREFIXES = ("E", "error:", "Error:")
# Error-level lines tritonserver always prints on a CPU-only machine.
_HARMLESS = ("CudaDriverHelper has not been initialized", "Unable to allocate pinned system memory",
             "unable to create stream", "Failed to initialize NVML", "DCGM")


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    return find_free_ports(1, host)[0]


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise ServerError naming the port when something already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServerError(f"{what} port {port} on {host} is already in use ({e.strerror}); "
                              f"pick another with --{what}-port") from e


def error_lines(log_text: str, limit: int = 5) -> list[str]:
    """The first ``limit`` error lines of a tritonserver log (glog ``E`` lines and ``error:``)."""
    found = []
    for line in log_text.splitlines():
        s = line.strip()
        if any(h in s for h in _HARMLESS):
            continue
        if (s[:1] == "E" and s[1:5].isdigit()) or s.startswith(_ERROR_PREFIXES[1:]):
            found.append(s)
        elif "failed to load" in s or "Traceback" in s:
            found.append(s)
        if len(found) >= limit:
            break
    return found


@dataclass
class TritonServer:
    """One tritonserver process serving ``repo`` on loopback ports (free ports when 0)."""

    repo: Path
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    world_size: int = 1
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    #: None = from the repository: orchestrator mode when it has more than one tensorrtllm model
    orchestrator: bool | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: Path | None = field(default=None, init=False, repr=False)
    _shm_prefix: str = field(default="", init=False, repr=False)
    startup_s: float = field(default=0.0, init=False)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = 60.0) -> TritonServer:
        """Start and wait for readiness; on failure stop everything and raise ServerError."""
        repo = Path(self.repo).resolve()
        if not repo.is_dir():
            raise ServerError(f"{self.repo}: model repository not found")
        given = {self.http_port, self.grpc_port, self.metrics_port} - {0}
        unset = [p for p in ("http_port", "grpc_port", "metrics_port") if not getattr(self, p)]
        for name, port in zip(unset, find_free_ports(len(unset), self.host, given),
                              strict=True):
            setattr(self, name, port)
        for what, port in (("http", self.http_port), ("grpc", self.grpc_port),
                           ("metrics", self.metrics_port)):
            check_port_free(self.host, port, what)
        install = find_tritonserver()
        if self.orchestrator is None:
            self.orchestrator = len(tensorrtllm_models(repo)) > 1
        # orchestrator mode: one process whatever the engines' world size (they are spawned),
        # or, when the models name their ranks (fast logits), 1 + all of them started here
        prespawn = prespawn_world_size(repo) if self.orchestrator else None
        world = (prespawn or 1) if self.orchestrator else self.world_size
        if (self.orchestrator or world > 1) and shutil.which("mpirun") is None:
            raise ServerError(f"{self.repo}: mpirun not found on PATH (needed for "
                              + ("orchestrator mode" if self.orchestrator else
                                 f"world size {world}") + "; NVIDIA's TensorRT-LLM image has it)")
        pools = (tuple(multi_model_args(os.environ.get("NVIDIA_TRITON_SERVER_VERSION"),
                                        gpu_count())) if self.orchestrator and not prespawn
                 else ())
        self._tmp = Path(tempfile.mkdtemp(prefix="specserve-triton-"))
        self._shm_prefix = f"specserve{os.getpid()}p{self.grpc_port}"
        backend_dir = prepare_backends(install, self._tmp / "backends")
        cmd = build_command(
            install, repo, host=self.host, http_port=self.http_port, grpc_port=self.grpc_port,
            metrics_port=self.metrics_port, backend_dir=backend_dir,
            shm_prefix=self._shm_prefix, world_size=world, extra_args=self.extra_args,
            orchestrator=self.orchestrator, orchestrator_args=pools, spawn=prespawn is None,
            engine_models=tensorrtllm_models(repo) if prespawn else ("tensorrt_llm",))
        if self.log_path is None:
            self.log_path = self._tmp / "server.log"
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env=server_env(install,
                                                         orchestrator=self.orchestrator,
                                                         spawn=prespawn is None),
                                          start_new_session=True,
                                          preexec_fn=die_with_parent())
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop(keep_log=True)
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        url = f"http://{self.host}:{self.http_port}/v2/health/ready"
        deadline = time.monotonic() + timeout_s
        assert self._proc is not None
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise ServerError(self._failure(f"tritonserver exited with code {rc}"))
            try:
                with urllib.request.urlopen(url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise ServerError(self._failure(f"tritonserver not ready after {timeout_s:.0f} s"))

    def _failure(self, head: str) -> str:
        text = self.log_text()
        lines = error_lines(text) or text.strip().splitlines()[-5:]
        return f"{self.repo}: {head}; server log {self.log_path}: " + " | ".join(lines)

    def log_text(self) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return ""
        return Path(self.log_path).read_text(errors="replace")

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self) -> int:
        """Block until the server exits (for ``specserve serve``)."""
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, timeout_s: float = 15.0, keep_log: bool = False) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout_s``, then remove our
        shared-memory regions and temp folder (the log stays when ``keep_log``). Safe to call
        twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate_group(proc, timeout_s)
        if self._shm_prefix:
            for p in Path("/dev/shm").glob(f"{self._shm_prefix}*"):
                p.unlink(missing_ok=True)
        if self._tmp is not None:
            log_inside = self.log_path is not None and self._tmp in Path(self.log_path).parents
            if not (keep_log and log_inside):
                shutil.rmtree(self._tmp, ignore_errors=True)
            else:  # keep the log readable after a failed start; drop the rest
                shutil.rmtree(self._tmp / "backends", ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> TritonServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _terminate_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # stubs left in the group (e.g. after a crash) go too
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
