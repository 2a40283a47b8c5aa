"""Start and stop a real Triton Inference Server for a model repository.

Finds ``tritonserver`` on ``PATH`` (NVIDIA's containers) or the binary bundled in the
``nvidia-pytriton`` wheel, prepares the Python backend for the running interpreter (stub + library
copied into a private backend folder, venv on ``PATH``, base ``LIBDIR`` on ``LD_LIBRARY_PATH``;
see ``../shared/reference/triton-on-cpu.md``), starts it bound to ``127.0.0.1`` with
``--disable-auto-complete-config``, and waits for ``/v2/health/ready``. On failure the first error
lines of the server log are raised as :class:`ServerError`, and nothing is left behind: the server
runs in its own process group (stubs included), its shared-memory regions carry a private prefix
that is removed on stop, and it gets SIGTERM if the starting process dies without stopping it
(even by SIGKILL; Linux ``PR_SET_PDEATHSIG``). World size > 1 launches through ``mpirun`` as
TensorRT-LLM's ``scripts/launch_triton_server.py`` does (one rank per GPU, ranks > 0 load only
the engine model). A repository with more than one model on the C++ ``tensorrtllm`` backend
(draft-target: ``tensorrt_llm`` + ``tensorrt_llm_draft``) starts in TensorRT-LLM's orchestrator
mode, as that script's ``--multi-model`` does: ``TRTLLM_ORCHESTRATOR=1`` and
``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1`` in the environment, one ``mpirun -n 1`` tritonserver
(world size 1, asserted as upstream asserts it: the orchestrator spawns every model's ranks
itself), and on Triton > 24.06 ``--pinned-memory-pool-byte-size=0 --enable-peer-access=false``
plus ``--cuda-memory-pool-byte-size=<gpu>:0`` for each GPU. A repository whose models name
their MPI ranks (``participant_ids``, written by ``specserve repo --fast-logits``) starts as
that script's ``--multi-model --disable-spawn-processes`` does:
``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0``, world size 1 (the orchestrator) + every model's ranks,
ranks > 0 loading the engine models, no memory-pool flags (NVIDIA/TensorRT-LLM
``triton_backend/scripts/launch_triton_server.py`` @ 0a2e2c1f1268b34586393794045691b666ba28be;
the C++ backend disables fast logits unless spawning is off,
``inflight_batcher_llm/src/model_instance_state.cc`` @ c8c6df08bd0ead54cd47f7973e1e425c28a174cd;
facts in ``tests/triton/data/trtllm_fast_logits.json``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from specserve.errors import ServerError
from specserve.processes import die_with_parent

_ERROR_PREFIXES = ("E", "error:", "Error:")
# Error-level lines tritonserver always prints on a CPU-only machine (triton-on-cpu.md §3).
_HARMLESS = ("CudaDriverHelper has not been initialized", "Unable to allocate pinned system memory",
             "unable to create stream", "Failed to initialize NVML", "DCGM")


@dataclass(frozen=True)
class TritonInstall:
    """Where tritonserver lives and what it needs to run the Python backend."""

    binary: Path
    bundled: bool  # True: nvidia-pytriton wheel (we prepare the backend folder ourselves)
    backends_src: Path | None = None  # bundled: pytriton/tritonserver/backends/python
    stub: Path | None = None  # bundled: python_backend_stubs/<py>/triton_python_backend_stub
    libs: Path | None = None  # bundled: site-packages/nvidia_pytriton.libs


def find_tritonserver() -> TritonInstall:
    """``$SPECSERVE_TRITONSERVER``, then ``tritonserver`` on PATH, then the nvidia-pytriton one."""
    explicit = os.environ.get("SPECSERVE_TRITONSERVER")
    if explicit:
        if not Path(explicit).is_file():
            raise ServerError(f"SPECSERVE_TRITONSERVER={explicit}: no such file")
        return TritonInstall(binary=Path(explicit), bundled=False)
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(binary=Path(on_path), bundled=False)
    try:
        import pytriton
    except ImportError as e:
        raise ServerError(
            "tritonserver not found: not on PATH and nvidia-pytriton is not installed "
            "(pip install 'specserve[server]')"
        ) from e
    root = Path(pytriton.__file__).parent / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    binary = root / "bin" / "tritonserver"
    for p in (binary, stub, root / "backends" / "python" / "libtriton_python.so"):
        if not p.is_file():
            raise ServerError(f"{p}: missing from the nvidia-pytriton install (Python {ver})")
    return TritonInstall(binary=binary, bundled=True, backends_src=root / "backends" / "python",
                         stub=stub, libs=root.parent.parent / "nvidia_pytriton.libs")




def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise ServerError naming the port when something already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServerError(f"{what} port {port} on {host} is already in use ({e.strerror}); "
                              f"pick another with --{what}-port") from e


_TENSORRTLLM_BACKEND = re.compile(r'^\s*backend:\s*"tensorrtllm"\s*$', re.MULTILINE)
#: launch_triton_server.py adds the memory-pool flags only for Triton newer than this.
MULTI_MODEL_POOL_AFTER = (24, 6)


_PARTICIPANTS = re.compile(
    r'key:\s*"participant_ids"\s*value:\s*\{\s*string_value:\s*"([^"]*)"')


def participant_ranks(repo: Path) -> dict[str, tuple[int, ...]]:
    """``participant_ids`` of each tensorrtllm model of ``repo`` (empty: not set)."""
    out: dict[str, tuple[int, ...]] = {}
    for name in tensorrtllm_models(repo):
        text = (Path(repo) / name / "config.pbtxt").read_text(errors="replace")
        m = _PARTICIPANTS.search(text)
        value = m.group(1).strip() if m else ""
        try:
            out[name] = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise ServerError(f"{repo}/{name}: participant_ids {value!r} is not a list of MPI "
                              "ranks") from None
    return out


def prespawn_world_size(repo: Path) -> int | None:
    """None when no model names its ranks (the orchestrator spawns them); else the world size
    1 + every model's ranks, checked: all models name theirs, the ids are disjoint and exactly
    1..N (rank 0 is the orchestrator; launch_triton_server.py ``--disable-spawn-processes``)."""
    ranks = participant_ranks(repo)
    if not any(ranks.values()):
        return None
    unset = sorted(n for n, ids in ranks.items() if not ids)
    if unset:
        raise ServerError(f"{repo}: {unset[0]} has no participant_ids while "
                          f"{sorted(n for n in ranks if ranks[n])[0]} has: with spawning off "
                          "every TensorRT-LLM model needs its MPI ranks")
    ids = [i for v in ranks.values() for i in v]
    if sorted(ids) != list(range(1, len(ids) + 1)):
        raise ServerError(f"{repo}: participant_ids {dict(sorted(ranks.items()))} must cover "
                          f"ranks 1..{len(ids)} once each (rank 0 is the orchestrator)")
    return 1 + len(ids)


def tensorrtllm_models(repo: Path) -> tuple[str, ...]:
    """Models of ``repo`` on the C++ TensorRT-LLM backend (``backend: "tensorrtllm"``), sorted."""
    names = []
    for cfg in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            text = cfg.read_text(errors="replace")
        except OSError:
            continue
        if _TENSORRTLLM_BACKEND.search(text):
            names.append(cfg.parent.name)
    return tuple(names)


def _version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in (text or "").strip().split("."))
    except ValueError:
        return None


def gpu_count() -> int:
    """GPUs listed by ``nvidia-smi --list-gpus`` (0 without it), as launch_triton_server.py."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        res = subprocess.run([exe, "--list-gpus"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.strip())


def multi_model_args(triton_version: str | None, num_gpus: int) -> list[str]:
    """launch_triton_server.py ``add_multi_model_config`` (spawning processes): no pinned or
    CUDA memory pools and no peer access, when ``$NVIDIA_TRITON_SERVER_VERSION`` > 24.06."""
    version = _version(triton_version)
    if version is None or version <= MULTI_MODEL_POOL_AFTER:
        return []
    return ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
            *[f"--cuda-memory-pool-byte-size={j}:0" for j in range(num_gpus)]]


def server_env(install: TritonInstall, base: dict[str, str] | None = None,
               orchestrator: bool = False, spawn: bool = True) -> dict[str, str]:
    """Environment for tritonserver: the venv's python first on PATH (the stub derives
    ``sys.prefix`` from it) and, for the bundled server, its libraries and the base LIBDIR;
    with ``orchestrator``, TensorRT-LLM's orchestrator switches (launch_triton_server.py
    ``--multi-model``; ``spawn`` False: with ``--disable-spawn-processes``)."""
    env = dict(os.environ if base is None else base)
    if orchestrator:
        env["TRTLLM_ORCHESTRATOR"] = "1"
        env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1" if spawn else "0"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if install.bundled:
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        parts = [str(install.libs), libdir, env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in parts if p)
    return env


def prepare_backends(install: TritonInstall, dest: Path) -> Path | None:
    """For the bundled server: ``dest/python/{libtriton_python.so, utils, stub}``."""
    if not install.bundled:
        return None
    assert install.backends_src is not None and install.stub is not None
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(install.backends_src / name, py / name)
    shutil.copy2(install.stub, py / "triton_python_backend_stub")
    return dest


def build_command(
    install: TritonInstall, repo: Path, *, host: str, http_port: int, grpc_port: int,
    metrics_port: int, backend_dir: Path | None, shm_prefix: str, world_size: int = 1,
    engine_models: tuple[str, ...] = ("tensorrt_llm",), extra_args: tuple[str, ...] = (),
    run_as_root: bool | None = None, orchestrator: bool = False,
    orchestrator_args: tuple[str, ...] = (), spawn: bool = True,
) -> list[str]:
    """The argv that starts the server (``mpirun`` with one rank per GPU when world_size > 1;
    ``run_as_root`` None = whether this process runs as root). ``orchestrator``: one
    ``mpirun -n 1`` rank plus ``orchestrator_args`` (:func:`multi_model_args`); world size
    must be 1, as launch_triton_server.py asserts for ``--multi-model``; with ``spawn`` False
    (``--disable-spawn-processes``) every rank is started here, ranks > 0 loading
    ``engine_models``, and no ``orchestrator_args``."""
    if not spawn:
        orchestrator_args = ()
    if orchestrator and spawn and world_size != 1:
        raise ServerError(f"{repo}: orchestrator mode (several TensorRT-LLM models) starts one "
                          f"tritonserver, world size 1, got {world_size}; TensorRT-LLM spawns "
                          "the ranks of multi-GPU models itself")
    if run_as_root is None:
        run_as_root = os.geteuid() == 0
    def rank_args(rank: int) -> list[str]:
        args = [str(install.binary), f"--model-repository={repo}",
                "--disable-auto-complete-config", "--allow-gpu-metrics=false",
                f"--backend-config=python,shm-region-prefix-name={shm_prefix}r{rank}_"]
        if backend_dir is not None:
            args.append(f"--backend-directory={backend_dir}")
        if rank == 0:
            args += [f"--http-address={host}", f"--http-port={http_port}",
                     f"--grpc-address={host}", f"--grpc-port={grpc_port}",
                     f"--metrics-address={host}", f"--metrics-port={metrics_port}",
                     *(orchestrator_args if orchestrator else ()), *extra_args]
        else:
            args += ["--model-control-mode=explicit", "--allow-http=false",
                     "--allow-grpc=false", "--allow-metrics=false",
                     *[f"--load-model={m}" for m in engine_models]]
        return args

    # Open MPI refuses to run as root without this flag; never pass it for anyone else.
    mpirun = ["mpirun", *(["--allow-run-as-root"] if run_as_root else [])]
    if orchestrator and spawn:  # it spawns its workers through MPI: start it under mpirun
        return [*mpirun, "-n", "1", *rank_args(0)]
    if world_size <= 1:
        return rank_args(0)
    cmd = list(mpirun)
    for rank in range(world_size):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", *rank_args(rank)]
    return cmd


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
        self.http_port = self.http_port or find_free_port(self.host)
        self.grpc_port = self.grpc_port or find_free_port(self.host)
        self.metrics_port = self.metrics_port or find_free_port(self.host)
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
