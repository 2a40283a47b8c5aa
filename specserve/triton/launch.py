"""What :class:`specserve.triton.server.TritonServer` launches: where ``tritonserver`` lives
(:func:`find_tritonserver`), the Python backend folder for the running interpreter
(:func:`prepare_backends`), the environment (:func:`server_env`) and the command
(:func:`build_command`). World size > 1 launches through ``mpirun`` as
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
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specserve.errors import ServerError


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
