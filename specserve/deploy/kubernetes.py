"""Kubernetes manifests for the TensorRT-LLM engine flow: a Deployment per single-node replica,
a LeaderWorkerSet when a replica spans nodes, each with a Service in front (pure: dicts).

- Deployment: one pod per replica runs ``specserve serve`` (which starts ``mpirun`` itself for
  world size > 1 on the pod's GPUs).
- LeaderWorkerSet (kubernetes-sigs/lws ``leaderworkerset.x-k8s.io/v1``; CRD
  ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml`` @060ab4da): a group of
  ``size = world_size / gpus_per_node`` pods per replica. The leader runs the same rank
  layout as :func:`specserve.triton.server.build_command` (rank 0 serves HTTP/gRPC/metrics,
  ranks > 0 load only ``tensorrt_llm``) under one ``mpirun`` whose ``--host`` list gives each
  pod ``gpus_per_node`` slots, as the LWS TensorRT-LLM example's ``server.py`` does
  (``docs/examples/tensorrt-llm/build/server.py`` @87cf4a98). Worker pods run ``sshd`` for
  Open MPI's launcher (``startupPolicy: LeaderCreated``: the leader becomes ready only once
  its workers run its ranks); their addresses come from ``LWS_LEADER_ADDRESS``
  (``<name>-<group>.<name>.<namespace>``; worker ``i`` is ``<name>-<group>-<i>.<name>...``).
- Readiness: ``GET /v2/health/ready`` on the serving pod (KServe v2 health, Triton); the Service
  selects the leaders only (``role: leader``), as the LWS example's Service does.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from specserve.deploy.config import DeployConfig, EngineSource
from specserve.triton.server import TritonInstall, build_command

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
SSH_PORT = 2222
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


def _ports() -> list[dict[str, Any]]:
    return [{"name": "http", "containerPort": HTTP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT}]


def readiness_probe() -> dict[str, Any]:
    return {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT},
            "periodSeconds": 10, "failureThreshold": 3}


def startup_probe() -> dict[str, Any]:
    """Large engines load for minutes: up to 60 min before liveness-style checks count."""
    return {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT},
            "periodSeconds": 10, "failureThreshold": 360}


def volumes(cfg: DeployConfig) -> list[dict[str, Any]]:
    return [{"name": "models", "persistentVolumeClaim": {"claimName": cfg.pvc}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def volume_mounts(cfg: DeployConfig) -> list[dict[str, Any]]:
    return [{"name": "models", "mountPath": cfg.mount},
            {"name": "dshm", "mountPath": "/dev/shm"}]


def gpu_resources(gpus: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": str(gpus)}}


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "specserve"}


def _meta(name: str, cfg: DeployConfig) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.namespace, "labels": labels(name)}


def repo_dir(cfg: DeployConfig) -> str:
    return f"{cfg.mount.rstrip('/')}/{cfg.repo_path}"


def serve_argv(cfg: DeployConfig) -> list[str]:
    """``specserve serve`` in a pod: every interface, the Service's ports, patient readiness."""
    return ["specserve", "serve", "--repo", repo_dir(cfg), "--host", "0.0.0.0",
            "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
            "--metrics-port", str(METRICS_PORT), "--timeout", "3600"]


def service(name: str, cfg: DeployConfig, selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, cfg),
            "spec": {"type": "ClusterIP", "selector": selector, "ports": [
                {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                for p in _ports()]}}


def deployment(name: str, cfg: DeployConfig, src: EngineSource) -> list[dict[str, Any]]:
    """A Deployment of ``cfg.replicas`` single-node pods and its Service."""
    select = {"app.kubernetes.io/name": name}
    container = {
        "name": "triton", "image": cfg.image, "command": serve_argv(cfg), "ports": _ports(),
        "readinessProbe": readiness_probe(), "startupProbe": startup_probe(),
        "resources": gpu_resources(src.gpus_per_pod(cfg.gpus_per_node)),
        "volumeMounts": volume_mounts(cfg)}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, cfg),
           "spec": {"replicas": cfg.replicas, "selector": {"matchLabels": select},
                    "template": {"metadata": {"labels": labels(name)},
                                 "spec": {"containers": [container],
                                          "volumes": volumes(cfg)}}}}
    return [dep, service(name, cfg, select)]


def mpirun_argv(cfg: DeployConfig, src: EngineSource) -> list[str]:
    """The leader's launch: our rank layout (:func:`build_command`) on ``$SPECSERVE_HOSTS``."""
    install = TritonInstall(binary=Path("tritonserver"), bundled=False)
    argv = build_command(install, Path(repo_dir(cfg)), host="0.0.0.0", http_port=HTTP_PORT,
                         grpc_port=GRPC_PORT, metrics_port=METRICS_PORT, backend_dir=None,
                         shm_prefix="specserve", world_size=src.world_size, run_as_root=True)
    head = argv.index("-n")  # after "mpirun --allow-run-as-root"
    return [*argv[:head], "--host", "$SPECSERVE_HOSTS", "--mca", "plm_rsh_agent",
            f"ssh -p {SSH_PORT} -o StrictHostKeyChecking=no", "-x", "PATH",
            "-x", "LD_LIBRARY_PATH", *argv[head:]]


def leader_script(cfg: DeployConfig, src: EngineSource, nodes: int) -> str:
    """sh: the pods' addresses with ``gpus_per_node`` slots each, then exec mpirun."""
    slots = cfg.gpus_per_node
    argv = mpirun_argv(cfg, src)
    cmd = " ".join('"$SPECSERVE_HOSTS"' if a == "$SPECSERVE_HOSTS" else shlex.quote(a)
                   for a in argv).replace(" : ", " \\\n  : ")  # one rank per line
    return "\n".join([
        "set -eu",
        'first="${LWS_LEADER_ADDRESS%%.*}"; rest="${LWS_LEADER_ADDRESS#*.}"',
        f'SPECSERVE_HOSTS="$LWS_LEADER_ADDRESS:{slots}"',
        f"for i in $(seq 1 {nodes - 1}); do "
        f'SPECSERVE_HOSTS="$SPECSERVE_HOSTS,$first-$i.$rest:{slots}"; done',
        f"exec {cmd}", ""])


def worker_argv() -> list[str]:
    """Workers only host MPI ranks: Open MPI reaches them through sshd."""
    return ["/usr/sbin/sshd", "-D", "-e", "-p", str(SSH_PORT)]


def leader_worker_set(name: str, cfg: DeployConfig, src: EngineSource) -> list[dict[str, Any]]:
    """A LeaderWorkerSet of ``cfg.replicas`` groups of ``world / gpus_per_node`` pods and a
    Service on the leaders."""
    nodes = src.nodes(cfg.gpus_per_node)
    gpus = gpu_resources(src.gpus_per_pod(cfg.gpus_per_node))
    leader = {
        "name": "leader", "image": cfg.image, "command": ["/bin/sh", "-c"],
        "args": [leader_script(cfg, src, nodes)], "ports": _ports(),
        "readinessProbe": readiness_probe(), "startupProbe": startup_probe(),
        "resources": gpus, "volumeMounts": volume_mounts(cfg)}
    worker = {
        "name": "worker", "image": cfg.image, "command": worker_argv(),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 10},
        "resources": gpus, "volumeMounts": volume_mounts(cfg)}
    pod_labels = labels(name)
    lws = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _meta(name, cfg),
           "spec": {"replicas": cfg.replicas, "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {
                        "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                        "leaderTemplate": {
                            "metadata": {"labels": {**pod_labels, "role": "leader"}},
                            "spec": {"containers": [leader], "volumes": volumes(cfg)}},
                        "workerTemplate": {
                            "metadata": {"labels": {**pod_labels, "role": "worker"}},
                            "spec": {"containers": [worker], "volumes": volumes(cfg)}}}}}
    return [lws, service(name, cfg, {LWS_NAME_LABEL: name, "role": "leader"})]
