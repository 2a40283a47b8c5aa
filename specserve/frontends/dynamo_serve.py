"""Start NVIDIA Dynamo's OpenAI frontend and specserve workers as child processes on loopback.

What ``specserve serve --frontend dynamo`` runs (checked
against ai-dynamo 1.6.1 ``dynamo/frontend/frontend_args.py``): ``python -m dynamo.frontend
--http-host 127.0.0.1 --http-port P --discovery-backend file --request-plane tcp --router-mode R
[--migration-limit M]`` and N ``python -m specserve.frontends.dynamo_worker`` processes sharing
a private file-discovery directory (``DYN_FILE_KV``), every listener on 127.0.0.1
(``DYN_TCP_RPC_HOST``, ``DYN_TCP_RESPONSE_STREAM_HOST``, ``DYN_EVENT_PLANE_HOST``,
``DYN_SYSTEM_HOST``; without them Dynamo binds the machine's external address). Each worker
exports its speculative-decoding counters on its own free port (``--metrics-port``).

Ready means: ``GET /v1/models`` lists every served name and the discovery directory holds one
endpoint instance per worker (``v1/instances/``, the layout of Dynamo 1.6.1's file backend), so
the router knows all of them. Supervision follows :mod:`specserve.triton.server`: each child in
its own session (SIGTERM to its group, SIGKILL after a grace period) and SIGTERM when we die
(:func:`specserve.processes.die_with_parent`); a child that exits during start-up is reported in
one line (its log's last error line) and everything else is stopped. A registration the frontend
refuses (its ``Model materialization failed`` line: :mod:`specserve.frontends.dynamo_registration`)
is reported as soon as it is logged, with Dynamo's reason.

Once serving, :mod:`specserve.frontends.dynamo_supervisor` keeps it so (the decisions:
:mod:`specserve.frontends.supervision`): a worker that exits is restarted after a bounded
backoff, a crash loop ends the service; a worker that stops answering is found by probing
Dynamo's own system status server of each worker from here (``DYN_SYSTEM_PORT``, ``GET
/health``, endpoint health on with ``DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]'``; the
port is read as a signed 16-bit integer by ai-dynamo-runtime 1.6.1, so it must be below 32768),
killed, and restarted. A stopped process does not answer at all; a wedged engine in a live
process is found by Dynamo's canary (``canary``: ``DYN_HEALTH_CHECK_ENABLED``, a request through
the idle engine, whose time-out turns that ``/health`` not ready:
:mod:`specserve.frontends.dynamo_registration`). Requests on a dead worker are re-sent by the
frontend with ``--migration-limit`` (else they end with an error); the service ends only on
SIGINT/SIGTERM, the frontend's exit, or a crash loop.

Loopback: besides the variables above, each worker's KV-event publisher is Dynamo's direct-mode
ZMQ PUB socket, which ai-dynamo-runtime 1.6.1 binds to ``tcp://0.0.0.0:0`` whatever
``DYN_EVENT_PLANE_HOST`` says (that variable only sets the address it advertises); no setting
binds it to loopback, so local serving publishes no KV events unless asked (``kv_events``; the
KV router then predicts from its own decisions: ``--no-router-kv-events``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specserve.errors import ServerError, SpecserveError
from specserve.frontends.dynamo_child import CANARY_ENV, HOST, Child, free_system_ports
from specserve.frontends.dynamo_registration import rejection
from specserve.ports import find_free_ports
from specserve.serving.engine_params import DEFAULT_PREFIX_CACHE_MB

ROUTERS = ("round-robin", "random", "kv")
LOOPBACK_VARS = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST",
                 "DYN_SYSTEM_HOST")
WORKER_MODULE = "specserve.frontends.dynamo_worker"
# Dynamo's frontend, run with TCP_NODELAY on its HTTP listener (specserve/frontends/nodelay.py)
FRONTEND_MODULE = "specserve.frontends.dynamo_frontend"


@dataclass(frozen=True)
class ServedModel:
    """One served model name: the engine (default: the config's) with speculation on or off."""

    name: str
    speculation: bool = True
    engine: Path | None = None


@dataclass(frozen=True)
class DynamoServeConfig:
    """What to start: the engine, the names it is served under, workers per name, routing."""

    engine: Path
    models: tuple[ServedModel, ...]
    workers: int = 1
    router: str = "round-robin"
    migration_limit: int = 0
    http_port: int = 0  # 0: a free port
    max_batch: int = 8
    log_dir: Path | None = None  # None: a temp directory
    nodelay: bool = True  # False: Dynamo's frontend as shipped (Nagle on: ~40 ms to TTFT)
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB  # each worker's (0: off, no KV events)
    kv_events: bool = False  # publish the prefix cache to the KV router (binds 0.0.0.0: above)
    probe: bool = True  # each worker's system status server on, for the liveness probe
    canary: bool = False  # Dynamo's canary through idle engines (a wedged step: not ready)

    def validate(self) -> None:
        from specserve.engine_record import read_engine_record

        for engine in {self.engine_of(m) for m in self.models} or {Path(self.engine)}:
            if not engine.is_dir():
                raise SpecserveError(f"{engine}: engine directory not found")
            rec = read_engine_record(engine)
            if rec.backend != "torch":
                raise SpecserveError(f"{engine}: the specserve Dynamo worker serves torch "
                                     f"engines, this one is {rec.backend!r} (Dynamo's own "
                                     "dynamo.trtllm worker serves TensorRT-LLM engines)")
        if self.workers < 1:
            raise SpecserveError(f"--workers must be >= 1, got {self.workers}")
        if self.router not in ROUTERS:
            raise SpecserveError(f"--router must be one of {', '.join(ROUTERS)}, got "
                                 f"{self.router!r}")
        if self.prefix_cache_mb < 0:
            raise SpecserveError(f"--prefix-cache-mb must be >= 0, got {self.prefix_cache_mb}")
        if self.migration_limit < 0:
            raise SpecserveError(f"--migration-limit must be >= 0, got {self.migration_limit}")
        names = [m.name for m in self.models]
        if not names or len(set(names)) != len(names) or not all(names):
            raise SpecserveError(f"served model names must be distinct and non-empty: {names}")


    def engine_of(self, model: ServedModel) -> Path:
        return Path(model.engine or self.engine)


def dynamo_env(discovery: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The children's environment: file discovery in ``discovery``, every listener on
    loopback, one torch thread per worker unless set."""
    env = dict(os.environ if base is None else base)
    env["DYN_FILE_KV"] = str(discovery)
    env.update(DYN_DISCOVERY_BACKEND="file", DYN_REQUEST_PLANE="tcp")
    env.pop("DYN_NAMESPACE", None)  # the workers' --namespace default
    env.update({k: HOST for k in LOOPBACK_VARS})
    env.setdefault("SPECSERVE_TORCH_THREADS", "1")
    env.pop("DYN_SYSTEM_PORT", None)  # several workers: never one fixed port
    return env


def frontend_command(cfg: DynamoServeConfig, port: int) -> list[str]:
    """The argv of Dynamo's frontend. The KV router takes the workers' KV events (their prefix
    caches' blocks stored and removed: frontends/dynamo_kv_events.py); with the cache off
    there are none, and it predicts overlap from its own routing decisions."""
    module = FRONTEND_MODULE if cfg.nodelay else "dynamo.frontend"
    cmd = [sys.executable, "-m", module, "--http-host", HOST, "--http-port",
           str(port), "--discovery-backend", "file", "--request-plane", "tcp",
           "--router-mode", cfg.router]
    if cfg.router == "kv" and (cfg.prefix_cache_mb == 0 or not cfg.kv_events):
        cmd.append("--no-router-kv-events")
    if cfg.migration_limit:
        cmd += ["--migration-limit", str(cfg.migration_limit)]
    return cmd


def worker_command(cfg: DynamoServeConfig, model: ServedModel, metrics_port: int
                   ) -> list[str]:
    """The argv of one specserve worker. The workers of one name share one endpoint
    (component ``m<the name's position>``): the router picks among its instances."""
    component = f"m{cfg.models.index(model)}"
    cmd = [sys.executable, "-m", WORKER_MODULE, "--engine", str(cfg.engine_of(model)), "--name",
           model.name, "--component", component, "--max-batch", str(cfg.max_batch),
           "--metrics-port", str(metrics_port), "--prefix-cache-mb", str(cfg.prefix_cache_mb)]
    if not cfg.kv_events:
        cmd.append("--no-kv-events")
    return cmd if model.speculation else [*cmd, "--no-speculation"]


@dataclass
class DynamoDeployment:
    """Dynamo's frontend and the workers of every served name, started and stopped together."""

    cfg: DynamoServeConfig
    children: list[Child] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0
    startup_s: float = 0.0
    _tmp: Path | None = None
    log_dir: Path | None = None
    discovery: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def workers(self) -> list[Child]:
        return [c for c in self.children if c.role != "frontend"]

    def start(self, timeout_s: float = 180.0) -> DynamoDeployment:
        """Start everything and wait until ready; on failure stop everything and raise
        ServerError naming the child and its log's error line."""
        self.cfg.validate()
        _check_dynamo()
        self._tmp = Path(tempfile.mkdtemp(prefix="specserve-dynamo-"))
        self.log_dir = Path(self.cfg.log_dir or self._tmp / "logs")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.discovery = self._tmp / "discovery"
        self.discovery.mkdir()
        env = self.env = dynamo_env(self.discovery)
        if self.cfg.canary:
            env.update(CANARY_ENV)
        n = len(self.cfg.models) * self.cfg.workers
        ports = iter(find_free_ports(1 + n, HOST, {self.cfg.http_port}))
        system = iter(free_system_ports(n if self.cfg.probe else 0, {self.cfg.http_port}))
        self.http_port = self.cfg.http_port or next(ports)
        self.children = [Child("frontend", frontend_command(self.cfg, self.http_port),
                               self.log_dir / "frontend.log")]
        for model in self.cfg.models:
            for i in range(self.cfg.workers):
                port = next(ports)
                self.children.append(Child(
                    f"worker {model.name} #{i}", worker_command(self.cfg, model, port),
                    self.log_dir / f"worker-{model.name}-{i}.log", port, model.name,
                    system_port=next(system, 0)))
        t0 = time.monotonic()
        try:
            for c in self.children:
                c.start(env)
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive("at start-up")
            if self._ready():
                return
            self._check_registration()
            time.sleep(0.2)
        raise ServerError(f"Dynamo not ready after {timeout_s:.0f} s: /v1/models lists "
                          f"{sorted(self.listed_models())}, {self._instances()} of "
                          f"{len(self.workers)} workers registered; logs in {self.log_dir}")

    def _check_registration(self) -> None:
        """Dynamo's frontend refused a registration: its reason, now (it would retry for
        ever and leave /v1/models empty)."""
        front = self.children[0]
        try:
            why = rejection(front.log.read_text(errors="replace"))
        except OSError:
            return
        if why is not None:
            names = ", ".join(m.name for m in self.cfg.models)
            raise ServerError(f"Dynamo's frontend refused to serve {names}: {why} "
                              f"(log {front.log})")

    def _check_alive(self, when: str) -> None:
        for c in self.children:
            rc = c.exited()
            if rc is not None:
                raise ServerError(f"{c.role} exited with code {rc} {when}: {c.last_error()} "
                                  f"(log {c.log})")

    def _ready(self) -> bool:
        want = {m.name for m in self.cfg.models}
        return want <= self.listed_models() and self._instances() >= len(self.workers) and \
            (not self.cfg.nodelay or self._nodelay_set())

    def _nodelay_set(self) -> bool:
        """The frontend printed that its HTTP listener has TCP_NODELAY (dynamo_frontend.py)."""
        from specserve.frontends.dynamo_frontend import READY_LINE

        try:
            return f"{READY_LINE} {self.http_port}" in self.children[0].log.read_text(
                errors="replace")
        except OSError:
            return False

    def listed_models(self) -> set[str]:
        """The model ids ``GET /v1/models`` lists now (empty while the frontend is down)."""
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=2.0) as r:
                body = json.loads(r.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return set()
        return {str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)}

    def _instances(self) -> int:
        d = (self.discovery or Path("/nonexistent")) / "v1" / "instances"
        return sum(1 for _ in d.iterdir()) if d.is_dir() else 0

    def describe(self) -> dict[str, Any]:
        """What ``--format json`` prints (and ``specserve bench --serve-json`` reads)."""
        return {
            "frontend": self.url,
            "models": [m.name for m in self.cfg.models],
            "router": self.cfg.router, "migration_limit": self.cfg.migration_limit,
            "workers": [{"model": c.model, "pid": c.proc.pid if c.proc else None,
                         "metrics_url": c.metrics_url, "log": str(c.log),
                         "health_url": f"http://{HOST}:{c.system_port}/health"
                         if c.system_port else None}
                        for c in self.workers],
            "frontend_pid": self.children[0].proc.pid if self.children and
            self.children[0].proc else None,
            "log_dir": str(self.log_dir), "startup_s": round(self.startup_s, 2),
        }

    def wait(self, poll_s: float = 0.5) -> Child:
        """Block until a child exits; the child that did."""
        while True:
            for c in self.children:
                if c.exited() is not None:
                    return c
            time.sleep(poll_s)

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Signal worker ``index``'s process group (the failure tests and benchmarks)."""
        proc = self.workers[index].proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait()

    def stop(self, grace_s: float = 10.0, keep_logs: bool = False) -> None:
        """SIGTERM every child's group, SIGKILL what is left after ``grace_s``; remove the
        temp directory (discovery, and the logs unless ``keep_logs`` or ``log_dir`` was
        given). Safe to call twice."""
        live = [c.proc for c in self.children if c.proc is not None]
        for p in live:
            signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(p, signal.SIGKILL)  # stragglers of the group go too
            p.wait()
        for c in self.children:
            c.proc = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp / "discovery", ignore_errors=True)
            if not keep_logs:
                shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> DynamoDeployment:
        return self.start() if not self.children else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _check_dynamo() -> None:
    import importlib.util

    if importlib.util.find_spec("dynamo") is None or \
            importlib.util.find_spec("dynamo.frontend") is None:
        raise SpecserveError("NVIDIA Dynamo is not installed (ai-dynamo 1.6.1: make setup)")
