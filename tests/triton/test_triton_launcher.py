"""The launcher: clean failures (message, exit code, nothing left behind) on a real server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.errors import ServerError
from specserve.ports import find_free_ports
from specserve.triton.launch import TritonInstall, build_command
from specserve.triton.server import TritonServer, error_lines

BROKEN_CONFIG = """name: "broken"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BROKEN_MODEL = """import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("deliberately broken model for the specserve launcher test")
"""


ECHO_MODEL = """import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
"""


def echo_repo(root: Path) -> Path:
    repo = root / "echo-repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(BROKEN_CONFIG.replace("broken", "echo"))
    (repo / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    return repo


def broken_repo(root: Path) -> Path:
    repo = root / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(BROKEN_CONFIG)
    (repo / "broken" / "1" / "model.py").write_text(BROKEN_MODEL)
    return repo


def descendants_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


@pytest.mark.server
def test_broken_model_fails_cleanly(tmp_path: Path) -> None:
    server = TritonServer(broken_repo(tmp_path), log_path=tmp_path / "server.log")
    before = set(descendants_of(os.getpid()))  # a run-wide server (tests/conftest.py) may be up
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=60)
    msg = str(info.value)
    assert "deliberately broken model" in msg
    assert "tritonserver exited" in msg
    assert not server.is_running()
    assert set(descendants_of(os.getpid())) - before == set()  # no tritonserver or stub left
    assert not list(Path("/dev/shm").glob(f"specserve{os.getpid()}p{server.grpc_port}*"))


@pytest.mark.server
def test_cli_serve_broken_repo_exits_nonzero(tmp_path: Path) -> None:
    from specserve.cli.main import cli

    repo = broken_repo(tmp_path)
    ports = [str(p) for p in find_free_ports(3)]
    before = set(descendants_of(os.getpid()))  # a run-wide server (tests/conftest.py) may be up
    res = CliRunner().invoke(cli, ["serve", "--repo", str(repo), "--http-port", ports[0],
                                   "--grpc-port", ports[1], "--metrics-port", ports[2],
                                   "--timeout", "60", "--log", str(tmp_path / "serve.log")])
    assert res.exit_code == 3
    assert "error:" in res.output and "deliberately broken model" in res.output
    assert "deliberately broken model" in (tmp_path / "serve.log").read_text()  # log kept
    assert set(descendants_of(os.getpid())) - before == set()


class LowestFreeKernel:
    """A model of the kernel's ``bind(port 0)``: the lowest port no open socket holds, so a
    port comes back as soon as its socket is closed (the case that broke a server start)."""

    def __init__(self) -> None:
        self.held: set[int] = set()

    def socket(self) -> Any:
        kernel = self

        class Sock:
            port = 0

            def bind(self, addr: tuple[str, int]) -> None:
                self.port = min(set(range(7000, 7100)) - kernel.held)
                kernel.held.add(self.port)

            def getsockname(self) -> tuple[str, int]:
                return ("127.0.0.1", self.port)

            def __enter__(self) -> Sock:
                return self

            def __exit__(self, *exc: object) -> None:
                kernel.held.discard(self.port)
        return Sock()


def test_free_ports_are_distinct_and_avoid_the_given_ones() -> None:
    """Picked together (sockets held until all are bound), so never the same port twice even
    from a kernel that hands a closed port straight back, and never one in ``avoid``."""
    kernel = LowestFreeKernel()
    assert find_free_ports(3, new_socket=kernel.socket) == [7000, 7001, 7002]
    assert find_free_ports(2, avoid={7000, 7002}, new_socket=kernel.socket) == [7001, 7003]
    assert kernel.held == set()  # every socket closed on return
    ports = find_free_ports(3)  # the real kernel
    assert len(set(ports)) == 3


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = TritonServer(broken_repo(tmp_path), grpc_port=port)
        with pytest.raises(ServerError, match=f"grpc port {port} on 127.0.0.1 is already in use"):
            server.start(timeout_s=5)
    assert server.pid is None


def test_missing_repo_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="model repository not found"):
        TritonServer(tmp_path / "nope").start(timeout_s=5)


@pytest.mark.parametrize("root", [True, False])
def test_world_size_two_launches_through_mpirun(root: bool) -> None:
    install = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"), bundled=False)
    cmd = build_command(install, Path("/r"), host="127.0.0.1", http_port=1, grpc_port=2,
                        metrics_port=3, backend_dir=None, shm_prefix="p", world_size=2,
                        run_as_root=root)
    assert cmd[0] == "mpirun"
    assert ("--allow-run-as-root" in cmd) == root
    ranks = " ".join(cmd).split(" : ")
    assert len(ranks) == 2
    assert "--grpc-port=2" in ranks[0] and "--disable-auto-complete-config" in ranks[0]
    assert "--model-control-mode=explicit" in ranks[1]
    assert "--load-model=tensorrt_llm" in ranks[1] and "--grpc-port" not in ranks[1]
    assert "shm-region-prefix-name=pr1_" in ranks[1]


def test_allow_run_as_root_follows_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    install = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"), bundled=False)
    for euid, expected in ((0, True), (1000, False)):
        monkeypatch.setattr("os.geteuid", lambda e=euid: e)
        cmd = build_command(install, Path("/r"), host="127.0.0.1", http_port=1, grpc_port=2,
                            metrics_port=3, backend_dir=None, shm_prefix="p", world_size=2)
        assert ("--allow-run-as-root" in cmd) == expected, euid


def test_error_lines_picks_glog_errors() -> None:
    log = ("I1130 01:00:00.000 1 server.cc:1] fine\n"
           'E1130 01:00:00.500 1 server.cc:241] "CudaDriverHelper has not been initialized."\n'
           "E1130 01:00:01.000 1 model.cc:2] failed to load 'x'\n"
           "error: creating server: Internal - failed to load all models\n")
    assert error_lines(log) == [log.splitlines()[2], log.splitlines()[3]]


@contextmanager
def _serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``specserve serve`` of the echo repository on free ports: the process, its first output
    line (printed once ready, or the failure) and the ports; killed if still running, and its
    output pipe closed, at the end."""
    ports = [str(p) for p in find_free_ports(3)]
    cmd = [sys.executable, "-m", "specserve.cli.main", "serve", "--repo",
           str(echo_repo(tmp_path)), "--http-port", ports[0], "--grpc-port", ports[1],
           "--metrics-port", ports[2], "--timeout", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        yield proc, proc.stdout.readline(), ports  # readline blocks until ready (or failure)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.server
def test_cli_serve_prints_endpoints_and_stops_on_sigterm(tmp_path: Path) -> None:
    with _serve(tmp_path) as (proc, line, ports):
        assert line.startswith("ready in") and f"127.0.0.1:{ports[1]}" in line, line
        server_pids = descendants_of(proc.pid)
        assert server_pids
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    time.sleep(0.2)
    assert all(not Path(f"/proc/{pid}").exists() for pid in server_pids)


@pytest.mark.server
def test_server_dies_with_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL leaves the parent no chance to clean up: the server still goes (PDEATHSIG)."""
    with _serve(tmp_path) as (proc, line, _):
        assert line.startswith("ready in"), line
        server_pids = descendants_of(proc.pid)
        assert server_pids
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(
            _alive(pid) for pid in server_pids):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in server_pids)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# --- orchestrator mode for multi-model TensorRT-LLM repositories (launch_triton_server.py
#     --multi-model: TRTLLM_ORCHESTRATOR=1, world size 1 asserted) ---

_INSTALL = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"), bundled=False)


def _orchestrator_cmd(world_size: int = 1, **kw: object) -> list[str]:
    return build_command(_INSTALL, Path("/r"), host="127.0.0.1", http_port=1, grpc_port=2,
                         metrics_port=3, backend_dir=None, shm_prefix="p",
                         world_size=world_size, orchestrator=True, **kw)  # type: ignore[arg-type]


def test_orchestrator_launch_is_one_mpirun_rank() -> None:
    from specserve.triton.launch import multi_model_args

    pools = tuple(multi_model_args("26.04", 2))
    cmd = _orchestrator_cmd(run_as_root=False, orchestrator_args=pools)
    assert cmd[:3] == ["mpirun", "-n", "1"] and ":" not in cmd
    assert cmd.count(str(_INSTALL.binary)) == 1
    assert "--model-control-mode=explicit" not in cmd and "--grpc-port=2" in cmd
    assert {"--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
            "--cuda-memory-pool-byte-size=0:0", "--cuda-memory-pool-byte-size=1:0"} <= set(cmd)
    assert _orchestrator_cmd(run_as_root=True)[:2] == ["mpirun", "--allow-run-as-root"]


def test_orchestrator_asserts_world_size_one() -> None:
    with pytest.raises(ServerError, match=r"orchestrator mode .* world size 1, got 2"):
        _orchestrator_cmd(world_size=2)


def test_multi_model_pool_args_follow_the_triton_version() -> None:
    from specserve.triton.launch import multi_model_args

    assert multi_model_args("26.04", 1) == ["--pinned-memory-pool-byte-size=0",
                                            "--enable-peer-access=false",
                                            "--cuda-memory-pool-byte-size=0:0"]
    for version in ("24.06", "24.05", None, "", "r26"):  # upstream: only > 24.06
        assert multi_model_args(version, 2) == [], version


def test_orchestrator_env() -> None:
    from specserve.triton.launch import server_env

    env = server_env(_INSTALL, base={"PATH": "/bin"}, orchestrator=True)
    assert env["TRTLLM_ORCHESTRATOR"] == "1"
    assert env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    assert "TRTLLM_ORCHESTRATOR" not in server_env(_INSTALL, base={"PATH": "/bin"})


def _trt_repo(root: Path, kind: str, **record: object) -> Path:
    from specserve.triton.repository import write_repository
    from tests.triton.test_triton_repository import fake_engine

    return write_repository(fake_engine(root, kind, **record), root / f"repo-{kind}")


def capture_launch(server: TritonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   gpus: int) -> dict[str, object]:
    """``server.start()`` with a fake tritonserver binary, mpirun and ``gpus`` GPUs: the argv
    and env it launched ({"cmd", "env"}); the process it starts exits at once (code 7)."""
    import specserve.triton.server as srv

    binary = tmp_path / "tritonserver"
    binary.write_text("")
    monkeypatch.setenv("SPECSERVE_TRITONSERVER", str(binary))
    monkeypatch.setenv("NVIDIA_TRITON_SERVER_VERSION", "26.04")
    monkeypatch.setattr(srv, "gpu_count", lambda: gpus)
    real_which = shutil.which
    monkeypatch.setattr(srv.shutil, "which",
                        lambda name: "/usr/bin/mpirun" if name == "mpirun" else real_which(name))
    seen: dict[str, object] = {}
    real_popen = subprocess.Popen

    def fake_popen(cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
        seen.update(cmd=cmd, env=kw["env"])  # then a real process that exits at once
        return real_popen([sys.executable, "-c", "raise SystemExit(7)"], **kw)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(srv.subprocess, "Popen", fake_popen)
    with pytest.raises(ServerError, match="exited with code 7"):
        server.start(timeout_s=30)
    return seen


def test_tensorrtllm_models_of_written_repos(tmp_path: Path) -> None:
    from specserve.triton.launch import tensorrtllm_models

    assert tensorrtllm_models(_trt_repo(tmp_path, "draft")) == ("tensorrt_llm",
                                                                "tensorrt_llm_draft")
    assert tensorrtllm_models(_trt_repo(tmp_path, "ngram")) == ("tensorrt_llm",)
    assert tensorrtllm_models(echo_repo(tmp_path)) == ()


@pytest.mark.parametrize(("kind", "world", "orchestrator"),
                         [("draft", 1, True), ("draft", 2, True), ("medusa", 1, False)])
def test_start_launches_multi_model_repos_in_orchestrator_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, world: int,
        orchestrator: bool) -> None:
    """TritonServer.start (what `specserve serve` calls, world_size from specserve_repo.json)
    on a draft-target TensorRT-LLM repository: the env and argv it really launches with."""
    record = {"tp_size": world, "world_size": world}
    repo = _trt_repo(tmp_path, kind, **record)
    server = TritonServer(repo, world_size=world, log_path=tmp_path / "log")
    seen = capture_launch(server, tmp_path, monkeypatch, gpus=2)
    cmd, env = seen["cmd"], seen["env"]
    assert isinstance(cmd, list) and isinstance(env, dict)
    assert server.orchestrator is orchestrator
    assert (env.get("TRTLLM_ORCHESTRATOR"), env.get("TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES")) == (
        ("1", "1") if orchestrator else (None, None))
    if orchestrator:
        assert cmd[0] == "mpirun" and cmd[cmd.index("-n") + 1] == "1" and ":" not in cmd
        assert "--cuda-memory-pool-byte-size=1:0" in cmd
    else:
        assert cmd[0] == str(tmp_path / "tritonserver")
        assert "--enable-peer-access=false" not in cmd
