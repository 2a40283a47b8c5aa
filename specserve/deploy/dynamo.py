"""NVIDIA Dynamo manifests for the TensorRT-LLM PyTorch route: a ``DynamoGraphDeployment``
(``nvidia.com/v1alpha1``) with a Frontend and TensorRT-LLM workers, aggregated or disaggregated
(prefill and decode workers), and a ConfigMap holding each worker's engine YAML, the
speculative config of the engine directory (``extra_llm_api_options.yaml``).

Fields as the DynamoGraphDeployment CRD declares them (ai-dynamo/dynamo
``deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml`` @967e177c:
``services.<name>.{componentType, subComponentType, replicas, resources.limits.gpu (a string),
multinode.nodeCount (>= 2), extraPodSpec.{volumes, mainContainer}}``); the worker command
(``python3 -m dynamo.trtllm --model-path M --served-model-name M --extra-engine-args Y
[--disaggregation-mode prefill|decode]``) and the ConfigMap-as-volume pattern follow Dynamo's
``examples/backends/trtllm/deploy/{disagg.yaml, agg-with-config.yaml}`` @04521f47. A replica
that spans nodes gets ``multinode.nodeCount`` and ``gpus_per_node`` GPUs per node; the operator
places it through Grove or LeaderWorkerSet.

A torch (reference-engine) directory gets :func:`torch_graph_deployment`:
Dynamo's Frontend run through ``python3 -m specserve.frontends.dynamo_frontend`` (the same
frontend with TCP_NODELAY on its HTTP listener, as ``specserve serve --frontend dynamo`` runs it;
a DGD's Frontend may set its ``command`` and ``args``, as Dynamo's own examples do), and CPU
worker pods running ``python3 -m specserve.frontends.dynamo_worker``
(our worker, ``--engine`` on the models volume, its speculative-decoding counters on
``--metrics-port``), no ``backendFramework`` (the CRD's enum names sglang, vllm and trtllm only)
and no GPU. The operator injects ``DYN_NAMESPACE`` and ``DYN_DISCOVERY_BACKEND`` (default
``kubernetes``) into every component, which the worker reads; the frontend re-sends a request
whose worker died up to ``DYN_MIGRATION_LIMIT`` times (ai-dynamo 1.6.1
``dynamo/frontend/frontend_args.py``). The image must hold specserve and ai-dynamo (none is
published: ``--image`` is required).
"""

from __future__ import annotations

from typing import Any

import yaml

from specserve import yamlio
from specserve.deploy.config import MODEL_KEYS, DeployConfig, EngineSource, pod_path
from specserve.deploy.kubernetes import labels

DGD_API = "nvidia.com/v1alpha1"
CONFIG_DIR = "/etc/specserve"
FRONTEND_PORT = 8000
#: Disaggregated serving moves the KV cache between workers through the cache transceiver;
#: both sides need ``cache_transceiver_config`` in their engine YAML (Dynamo's prefill.yaml /
#: decode.yaml); paths are the pods' (``--mount``).
HEADER = "# written by specserve deploy from the engine's extra_llm_api_options.yaml\n"


def worker_yamls(cfg: DeployConfig, src: EngineSource, disagg: bool) -> dict[str, str]:
    """ConfigMap key -> engine YAML text of each worker kind, its draft / head directory
    rewritten to where the pods see it (:func:`pod_path`)."""
    data = yaml.safe_load(src.spec_yaml or "") or {}
    spec = data.get("speculative_config")
    spec = spec if isinstance(spec, dict) else {}
    for key in MODEL_KEYS:
        if spec.get(key):
            spec[key] = pod_path(cfg, str(spec[key]), f"speculative_config.{key}")
    if disagg:
        data.setdefault("cache_transceiver_config", {"backend": "DEFAULT"})
    text = HEADER + yamlio.dump(data)
    return {"prefill.yaml": text, "decode.yaml": text} if disagg else {"agg.yaml": text}


def config_map(name: str, cfg: DeployConfig, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels(name)},
            "data": data}


def _worker(cfg: DeployConfig, src: EngineSource, model: str, config: str, key: str,
            mode: str | None) -> dict[str, Any]:
    served = pod_path(cfg, model, "--model")
    args = ["--model-path", served, "--served-model-name", served,
            "--extra-engine-args", f"{CONFIG_DIR}/{key}"]
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    nodes = src.nodes(cfg.gpus_per_node)
    svc: dict[str, Any] = {
        "componentType": "worker", "replicas": cfg.replicas,
        "resources": {"limits": {"gpu": str(src.gpus_per_pod(cfg.gpus_per_node))}},
        "extraPodSpec": {
            "volumes": [{"name": "engine-config", "configMap": {"name": config}},
                        {"name": "models", "persistentVolumeClaim": {"claimName": cfg.pvc}}],
            "mainContainer": {
                "image": cfg.image, "workingDir": "/workspace",
                "command": ["python3", "-m", "dynamo.trtllm"], "args": args,
                "volumeMounts": [
                    {"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True},
                    {"name": "models", "mountPath": cfg.mount}]}}}
    if mode is not None:
        svc["subComponentType"] = mode
    if nodes > 1:
        svc["multinode"] = {"nodeCount": nodes}
    return svc


def graph_deployment(name: str, cfg: DeployConfig, src: EngineSource, model: str,
                     disagg: bool) -> list[dict[str, Any]]:
    """The ConfigMap and the DynamoGraphDeployment (aggregated, or prefill + decode)."""
    config = f"{name}-engine-config"
    yamls = worker_yamls(cfg, src, disagg)
    services: dict[str, Any] = {
        "Frontend": {"componentType": "frontend", "replicas": 1,
                     "extraPodSpec": {"mainContainer": {"image": cfg.image}}}}
    if disagg:
        services["prefill"] = _worker(cfg, src, model, config, "prefill.yaml", "prefill")
        services["decode"] = _worker(cfg, src, model, config, "decode.yaml", "decode")
    else:
        services["TRTLLMWorker"] = _worker(cfg, src, model, config, "agg.yaml", None)
    dgd = {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment",
           "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels(name)},
           "spec": {"backendFramework": "trtllm", "services": services}}
    return [config_map(config, cfg, yamls), dgd]


WORKER_MODULE = "specserve.frontends.dynamo_worker"
#: Dynamo's frontend, unchanged, with TCP_NODELAY on its HTTP listener (docs/results.md,
#: "Through Dynamo or through Triton?": the shipped frontend's Nagle delay cost ~40 ms of
#: first-token latency per keep-alive request)
FRONTEND_MODULE = "specserve.frontends.dynamo_frontend"
WORKER_METRICS_PORT = 9090
MIGRATION_LIMIT = 3
#: Per worker pod: the reference engine runs one torch thread per worker on CPU.
WORKER_CPU, WORKER_MEMORY = "2", "8Gi"


def _torch_worker(name: str, cfg: DeployConfig, src: EngineSource) -> dict[str, Any]:
    engine = pod_path(cfg, str(src.path.resolve()), "--engine")
    cpu = {"cpu": WORKER_CPU, "memory": WORKER_MEMORY}
    return {
        "componentType": "worker", "replicas": cfg.replicas,
        "resources": {"requests": dict(cpu), "limits": dict(cpu)},
        "extraPodSpec": {
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": cfg.pvc}}],
            "mainContainer": {
                "image": cfg.image, "workingDir": "/workspace",
                "command": ["python3", "-m", WORKER_MODULE],
                "args": ["--engine", engine, "--name", name, "--metrics-port",
                         str(WORKER_METRICS_PORT)],
                "env": [{"name": "SPECSERVE_TORCH_THREADS", "value": WORKER_CPU}],
                "ports": [{"name": "spec-metrics", "containerPort": WORKER_METRICS_PORT}],
                "volumeMounts": [{"name": "models", "mountPath": cfg.mount, "readOnly": True}]}}}


def torch_graph_deployment(name: str, cfg: DeployConfig, src: EngineSource
                           ) -> list[dict[str, Any]]:
    """The DynamoGraphDeployment of a torch engine: Dynamo's Frontend (migration on) and
    ``--replicas`` specserve worker pods serving the engine as model ``name``."""
    frontend = {"componentType": "frontend", "replicas": 1,
                "envs": [{"name": "DYN_MIGRATION_LIMIT", "value": str(MIGRATION_LIMIT)}],
                "extraPodSpec": {"mainContainer": {
                    "image": cfg.image, "command": ["python3", "-m", FRONTEND_MODULE],
                    "args": ["--http-port", str(FRONTEND_PORT)]}}}
    dgd = {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment",
           "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels(name)},
           "spec": {"services": {"Frontend": frontend,
                                 "SpecserveWorker": _torch_worker(name, cfg, src)}}}
    return [dgd]
