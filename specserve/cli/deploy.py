"""``specserve deploy``: Kubernetes / Dynamo / Slurm manifests for an engine directory."""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  # TP=8 engine on 8-GPU nodes: a Deployment of 2 single-node replicas + Service
  specserve deploy --engine engines/llama70b --out deploy/llama70b --replicas 2
\b
  # TP=8 x PP=2 engine: a LeaderWorkerSet, 2 pods (leader + 1 worker) per replica
  specserve deploy --engine engines/llama405b --out deploy/405b --namespace llm
\b
  # PyTorch route (build_config.json "flow": "pytorch"): Dynamo, disaggregated, and Slurm
  specserve deploy --engine engines/eagle3 --out deploy/eagle3 \\
      --target dynamo --target dynamo-disagg --target slurm
\b
  # torch reference engine behind Dynamo: its Frontend + CPU pods running our worker
  specserve deploy --engine engines/demo --out deploy/demo --target dynamo \\
      --image registry.example.com/specserve:0.1.0 --replicas 2

Targets: k8s (Deployment), lws (LeaderWorkerSet) for engines from `specserve build`;
dynamo, dynamo-disagg (DynamoGraphDeployment) and slurm (sbatch) for the PyTorch route.
Default: lws when a replica spans nodes, else k8s; dynamo + slurm for the PyTorch route.
A torch engine (`--backend torch`) may also take --target dynamo (--image: an image with
specserve and ai-dynamo installed; the pods run `python3 -m specserve.frontends.dynamo_worker`).
The pods mount PersistentVolumeClaim --pvc at --mount; the engine flow serves the model
repository --repo-path under it (write it there with `specserve repo --engine /models/...`).
Exit codes: 0 written, 2 bad input (nothing written).
"""


def _text(s: dict[str, Any]) -> str:
    lines = [f"{s['name']}: {s['flow']} flow, world size {s['world_size']} (tp {s['tp_size']}"
             f" x pp {s['pp_size']}), {s['nodes_per_replica']} node(s) x {s['gpus_per_pod']} "
             f"GPU(s) per replica, {s['config']['replicas']} replica(s)"]
    lines += [f"  {s['out']}/{f}  ({t})" for f, t in s["files"].items()]
    return "\n".join(lines)


@click.command("deploy", epilog=EXAMPLES,
               short_help="Manifests to serve an engine beyond one node (k8s, LWS, Dynamo, "
                          "Slurm).")
@click.option("--engine", required=True, type=click.Path(file_okay=False),
              help="Engine directory (build_config.json).")
@click.option("--out", required=True, type=click.Path(), help="Directory to write.")
@click.option("--target", "targets", multiple=True,
              type=click.Choice(["k8s", "lws", "dynamo", "dynamo-disagg", "slurm"]),
              help="What to write (repeatable; default from the engine, see below).")
@click.option("--name", default=None, help="Object name (default: the engine directory's).")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Replicas (LWS: groups; Dynamo: workers of each kind).")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--image", default=None,
              help="Container image (default: the one shipping the TensorRT-LLM release the "
                   "engine was written for; engine flow nvcr.io/nvidia/tritonserver:26.04-trtllm-"
                   "python-py3, Dynamo its tensorrtllm-runtime image).")
@click.option("--image-trtllm-version", default=None,
              help="The tensorrt_llm version --image ships, for an image specserve does not know"
                   " (a deploy whose image ships another release than the YAML is refused).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--pvc", default="specserve-models", show_default=True,
              help="PersistentVolumeClaim holding engines and repositories.")
@click.option("--mount", default="/models", show_default=True, help="Where pods mount it.")
@click.option("--repo-path", default="triton_repo", show_default=True,
              help="Engine flow: the model repository, relative to --mount.")
@click.option("--model", default=None,
              help="PyTorch route: the checkpoint trtllm-serve / Dynamo loads (default: the "
                   "record's).")
@click.option("--host-root", default=None,
              help="The build-host directory the PVC holds (pods see it at --mount): paths in "
                   "the engine YAML and commands are rewritten from it; paths outside are "
                   "refused.")
@click.option("--kubectl-image", default="docker.io/bitnami/kubectl:1.33", show_default=True,
              help="LWS: an image with sh and kubectl, copied into the leader for kubessh.")
@click.option("--force", is_flag=True, default=False,
              help="Replace an --out written by `specserve deploy`.")
@FORMAT_OPTION
def command(fmt: str, force: bool, targets: tuple[str, ...], **kw: Any) -> None:
    """Write deployment manifests for ENGINE into OUT."""
    from specserve.deploy.config import DeployConfig
    from specserve.deploy.writer import write_deploy

    plan = write_deploy(DeployConfig(targets=targets, **kw), force=force)
    emit(plan.summary, fmt, _text)
