"""Kubernetes manifests for the TensorRT-LLM engine flow: a Deployment per single-node replica,
a LeaderWorkerSet when a replica spans nodes, each with a Service in front (pure: dicts).

- Deployment: one pod per replica runs ``specserve serve`` (which starts ``mpirun`` itself for
  world size > 1 on the pod's GPUs).
- LeaderWorkerSet (kubernetes-sigs/lws ``leaderworkerset.x-k8s.io/v1``; CRD
  ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml`` @060ab4da): a group of
  ``size = world_size / gpus_per_node`` pods per replica. The leader runs the same rank
  layout as :func:`specserve.triton.launch.build_command` (rank 0 serves HTTP/gRPC/metrics,
  ranks > 0 load only ``tensorrt_llm``) under one ``mpirun`` whose ``--host`` list gives each
  pod ``gpus_per_node`` slots, as the LWS TensorRT-LLM example's ``server.py`` does
  (kubernetes-sigs/lws ``docs/examples/tensorrt-llm/build/server.py`` @4aaf9d50, ``lws.yaml``
  @0e2e095a, ``build/Dockerfile`` @64b20ff7). Start-up follows that example: remote ranks are
  started with ``plm_rsh_agent kubessh`` (``kubectl exec``) as a ServiceAccount whose Role may
  list pods and exec into them (all three generated here), and the leader waits until every
  pod of its group (label ``leaderworkerset.sigs.k8s.io/group-key``) is Running before
  ``mpirun``. The stock Triton image has no kubectl: an init container from ``--kubectl-image``
  copies it, with the generated ``kubessh`` script, onto an emptyDir. Workers wait for SIGTERM.
  Pod names: the leader is ``<name>-<group>`` (the first label of ``LWS_LEADER_ADDRESS``),
  worker ``i`` ``<name>-<group>-<i>``. The only object referenced and not generated is the
  PersistentVolumeClaim ``--pvc`` (the models; ``deploy.json`` lists it under ``requires``).
- Readiness: ``GET /v2/health/ready`` on the serving pod (KServe v2 health, Triton); the Service
  selects the leaders only (``role: leader``), as the LWS example's Service does.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from specserve.deploy.config import DeployConfig, EngineSource
from specserve.triton.launch import TritonInstall, build_command

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
TOOLS_DIR = "/opt/specserve/bin"  # kubectl + kubessh on the leader (an emptyDir)


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


def mpi_name(name: str) -> str:
    """The ServiceAccount, Role and RoleBinding the leader's launcher runs as."""
    return f"{name}-mpi"


def kubessh_name(name: str) -> str:
    return f"{name}-kubessh"


#: Open MPI's remote-shell agent: ``kubessh POD CMD...`` = ``kubectl exec`` into the pod (the
#: LWS TensorRT-LLM example's ``kubessh``; its image adds kubectl, we copy it in, see below).
KUBESSH = """#!/bin/sh
# Open MPI plm_rsh_agent: run CMD in POD with kubectl exec (written by specserve deploy)
pod="$1"; shift
exec "$(dirname "$0")/kubectl" exec -i "$pod" -- /bin/sh -c "$*"
"""


def mpirun_argv(cfg: DeployConfig, src: EngineSource) -> list[str]:
    """The leader's launch: our rank layout (:func:`build_command`) on ``$SPECSERVE_HOSTS``,
    remote ranks started through ``kubessh`` (kubectl exec) as the LWS example's server.py."""
    install = TritonInstall(binary=Path("tritonserver"), bundled=False)
    argv = build_command(install, Path(repo_dir(cfg)), host="0.0.0.0", http_port=HTTP_PORT,
                         grpc_port=GRPC_PORT, metrics_port=METRICS_PORT, backend_dir=None,
                         shm_prefix="specserve", world_size=src.world_size, run_as_root=True)
    head = argv.index("-n")  # after "mpirun --allow-run-as-root"
    return [*argv[:head], "--host", "$SPECSERVE_HOSTS", "--mca", "plm_rsh_agent",
            f"{TOOLS_DIR}/kubessh", "-x", "PATH", "-x", "LD_LIBRARY_PATH", *argv[head:]]


def leader_script(cfg: DeployConfig, src: EngineSource, nodes: int) -> str:
    """sh: wait until every pod of the group runs (the LWS example's ``wait_for_workers``:
    ``kubectl get pods -l group-key --field-selector status.phase=Running``), then exec mpirun
    with ``gpus_per_node`` slots on the leader and on each worker pod (named
    ``<leader>-<i>``, as LWS names them)."""
    slots = cfg.gpus_per_node
    argv = mpirun_argv(cfg, src)
    cmd = " ".join('"$SPECSERVE_HOSTS"' if a == "$SPECSERVE_HOSTS" else shlex.quote(a)
                   for a in argv).replace(" : ", " \\\n  : ")  # one rank per line
    get = (f"{TOOLS_DIR}/kubectl get pods -n {shlex.quote(cfg.namespace)} -l "
           f'"{LWS_GROUP_KEY}=$GROUP_KEY" --field-selector status.phase=Running '
           "-o jsonpath='{.items[*].metadata.name}'")
    return "\n".join([
        "set -eu",
        'leader="${LWS_LEADER_ADDRESS%%.*}"',
        f'SPECSERVE_HOSTS="$leader:{slots}"',
        f"for i in $(seq 1 {nodes - 1}); do "
        f'SPECSERVE_HOSTS="$SPECSERVE_HOSTS,$leader-$i:{slots}"; done',
        f"until [ \"$({get} | wc -w)\" -ge {nodes} ]; do",
        f'  echo "specserve: waiting for the {nodes} pods of group $GROUP_KEY"; sleep 2',
        "done",
        f"exec {cmd}", ""])


def worker_argv() -> list[str]:
    """Workers only host MPI ranks (started by kubectl exec): wait for SIGTERM, as the LWS
    example's ``server.py worker`` does."""
    return ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def rbac(name: str, cfg: DeployConfig) -> list[dict[str, Any]]:
    """What the leader's kubectl needs (the LWS example runs as a ServiceAccount with RBAC):
    list the group's pods, and exec into them."""
    sa = mpi_name(name)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(sa, cfg),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                      {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(sa, cfg),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": sa},
               "subjects": [{"kind": "ServiceAccount", "name": sa,
                             "namespace": cfg.namespace}]}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(sa, cfg)}
    return [account, role, binding]


def kubessh_config_map(name: str, cfg: DeployConfig) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(kubessh_name(name), cfg),
            "data": {"kubessh": KUBESSH}}


def tools_init(cfg: DeployConfig) -> dict[str, Any]:
    """An init container that puts kubectl and kubessh on the ``tools`` volume (the stock
    Triton image has neither; the LWS example bakes both into its image)."""
    return {"name": "kubectl", "image": cfg.kubectl_image, "command": ["/bin/sh", "-c"],
            "args": [f'cp "$(command -v kubectl)" {TOOLS_DIR}/kubectl && '
                     f"cp /etc/specserve-kubessh/kubessh {TOOLS_DIR}/kubessh && "
                     f"chmod 0555 {TOOLS_DIR}/kubectl {TOOLS_DIR}/kubessh"],
            "volumeMounts": [{"name": "tools", "mountPath": TOOLS_DIR},
                             {"name": "kubessh", "mountPath": "/etc/specserve-kubessh",
                              "readOnly": True}]}


def leader_worker_set(name: str, cfg: DeployConfig, src: EngineSource) -> list[dict[str, Any]]:
    """A LeaderWorkerSet of ``cfg.replicas`` groups of ``world / gpus_per_node`` pods, the
    leader's ServiceAccount/Role/RoleBinding and kubessh ConfigMap, and a Service on the
    leaders."""
    nodes = src.nodes(cfg.gpus_per_node)
    gpus = gpu_resources(src.gpus_per_pod(cfg.gpus_per_node))
    group_key = {"name": "GROUP_KEY", "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{LWS_GROUP_KEY}']"}}}
    leader = {
        "name": "leader", "image": cfg.image, "command": ["/bin/sh", "-c"],
        "args": [leader_script(cfg, src, nodes)], "ports": _ports(), "env": [group_key],
        "readinessProbe": readiness_probe(), "startupProbe": startup_probe(),
        "resources": gpus,
        "volumeMounts": [*volume_mounts(cfg), {"name": "tools", "mountPath": TOOLS_DIR}]}
    worker = {
        "name": "worker", "image": cfg.image, "command": worker_argv(),
        "resources": gpus, "volumeMounts": volume_mounts(cfg)}
    leader_volumes = [*volumes(cfg), {"name": "tools", "emptyDir": {}},
                      {"name": "kubessh", "configMap": {"name": kubessh_name(name)}}]
    pod_labels = labels(name)
    lws = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _meta(name, cfg),
           "spec": {"replicas": cfg.replicas, "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {
                        "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                        "leaderTemplate": {
                            "metadata": {"labels": {**pod_labels, "role": "leader"}},
                            "spec": {"serviceAccountName": mpi_name(name),
                                     "initContainers": [tools_init(cfg)],
                                     "containers": [leader], "volumes": leader_volumes}},
                        "workerTemplate": {
                            "metadata": {"labels": {**pod_labels, "role": "worker"}},
                            "spec": {"containers": [worker], "volumes": volumes(cfg)}}}}}
    return [*rbac(name, cfg), kubessh_config_map(name, cfg), lws,
            service(name, cfg, {LWS_NAME_LABEL: name, "role": "leader"})]
