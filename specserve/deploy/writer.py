"""``specserve deploy``: the files of each target (:func:`plan_deploy`, pure), written into a
staged directory that is renamed into place only when complete (:func:`write_deploy`).

Files: ``deployment.yaml`` (Deployment + Service), ``leaderworkerset.yaml`` (LeaderWorkerSet +
Service), ``dynamo.yaml`` / ``dynamo-disagg.yaml`` (ConfigMap + DynamoGraphDeployment),
``slurm.sbatch``, and ``deploy.json`` (the resolved config and what each file holds). Multi-line
strings (scripts, engine YAMLs) are written as YAML block literals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specserve import yamlio
from specserve.config import write_json_atomic, write_text_atomic
from specserve.deploy.config import (
    DeployConfig,
    EngineSource,
    check_image_release,
    default_name,
    read_source,
    resolve_targets,
    target_image,
)
from specserve.deploy.dynamo import graph_deployment, torch_graph_deployment
from specserve.deploy.kubernetes import deployment, leader_worker_set
from specserve.deploy.slurm import sbatch_script
from specserve.errors import SpecserveError
from specserve.outputs import staged_output

WRITER = "specserve deploy"
FILES = {"k8s": "deployment.yaml", "lws": "leaderworkerset.yaml", "dynamo": "dynamo.yaml",
         "dynamo-disagg": "dynamo-disagg.yaml", "slurm": "slurm.sbatch"}


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Kubernetes objects as one multi-document YAML text (:func:`specserve.yamlio.dump_all`)."""
    return yamlio.dump_all(objects)


@dataclass(frozen=True)
class DeployPlan:
    """What ``specserve deploy`` writes: file name -> text, plus its summary."""

    cfg: DeployConfig
    files: dict[str, str]
    objects: dict[str, list[dict[str, Any]]]   # YAML file -> its objects (for validation)
    summary: dict[str, Any]


def _model(cfg: DeployConfig, src: EngineSource) -> str:
    model = cfg.model or src.model
    if model is None:
        raise SpecserveError(f"{src.path}/build_config.json names no model; give --model "
                             "(the checkpoint path or id trtllm-serve loads)")
    return model


def _objects(target: str, name: str, cfg: DeployConfig,
             src: EngineSource) -> list[dict[str, Any]]:
    if target == "k8s":
        return deployment(name, cfg, src)
    if target == "lws":
        return leader_worker_set(name, cfg, src)
    if src.torch:
        return torch_graph_deployment(name, cfg, src)
    return graph_deployment(name, cfg, src, _model(cfg, src), disagg=target == "dynamo-disagg")


def plan_deploy(cfg: DeployConfig) -> DeployPlan:
    """Read the engine directory and render every target (nothing is written)."""
    cfg.validate()
    src = read_source(cfg.engine)
    targets = resolve_targets(cfg, src)
    nodes = src.nodes(cfg.gpus_per_node)
    name = cfg.name or default_name(cfg.engine)
    files: dict[str, str] = {}
    objects: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        image = target_image(cfg, src, target)
        if not (src.torch and target == "dynamo"):  # our worker needs no TensorRT-LLM
            check_image_release(cfg, src, image)
        tcfg = replace(cfg, image=image)
        fname = FILES[target]
        if target == "slurm":
            files[fname] = sbatch_script(name, tcfg, src, _model(tcfg, src))
            continue
        objects[fname] = _objects(target, name, tcfg, src)
        files[fname] = to_yaml(objects[fname])
    summary = {
        "config": cfg.to_dict(), "name": name, "flow": src.flow, "targets": list(targets),
        "tp_size": src.tp_size, "pp_size": src.pp_size, "world_size": src.world_size,
        "trtllm_version": src.trtllm_version,
        "nodes_per_replica": nodes, "gpus_per_pod": src.gpus_per_pod(cfg.gpus_per_node),
        "files": {FILES[t]: t for t in targets},
        "requires": [{"kind": "PersistentVolumeClaim", "name": cfg.pvc,
                      "namespace": cfg.namespace}] if set(targets) - {"slurm"} else [],
    }
    return DeployPlan(cfg, files, objects, summary)


def write_deploy(cfg: DeployConfig, force: bool = False) -> DeployPlan:
    """Plan, then write every file into a stage renamed to ``cfg.out`` (nothing on failure)."""
    plan = plan_deploy(cfg)
    out = Path(cfg.out)
    with staged_output(out, force, WRITER) as stage:
        for fname, text in plan.files.items():
            write_text_atomic(stage / fname, text)
        write_json_atomic(stage / "deploy.json", plan.summary)
    plan.summary["out"] = str(out)
    return plan
