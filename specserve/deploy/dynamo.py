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
places it through Grove or LeaderWorkerSet (peers-2026.md section 5).
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
