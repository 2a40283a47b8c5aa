"""A Slurm batch script for the TensorRT-LLM PyTorch route outside Kubernetes: one task per GPU
(the MPI world size must equal TP x PP), ``srun --mpi=pmix`` into the container, and
``trtllm-llmapi-launch trtllm-serve`` as NVIDIA/TensorRT-LLM
``examples/llm-api/llm_mgmn_trtllm_serve.sh`` @0bd88711 runs it; the speculative config goes in
through ``--extra_llm_api_options``."""

from __future__ import annotations

import shlex

from specserve.deploy.config import DeployConfig, EngineSource, local_path, spec_model_dir

PORT = 8000


def serve_argv(src: EngineSource, model: str, spec_yaml: str) -> list[str]:
    return ["trtllm-llmapi-launch", "trtllm-serve", model, "--backend", "pytorch",
            "--tp_size", str(src.tp_size), "--pp_size", str(src.pp_size),
            "--host", "0.0.0.0", "--port", str(PORT), "--extra_llm_api_options", spec_yaml]


def container_mounts(engine: str, model: str, spec_yaml: str | None) -> list[str]:
    """Host directories the container needs at the same paths (pyxis ``--container-mounts``):
    the engine directory, the checkpoint and the draft / EAGLE-3 head (the
    upstream script mounts ``${MOUNT_DIR}:${MOUNT_DEST}`` covering the model); one entry for
    directories nested in another."""
    dirs = [engine] + [p for p in (local_path(model), local_path(spec_model_dir(spec_yaml) or
                                                                 "")) if p]
    out: list[str] = []
    for d in sorted(set(dirs), key=len):
        if not any(d == o or d.startswith(o.rstrip("/") + "/") for o in out):
            out.append(d)
    return out


def sbatch_script(name: str, cfg: DeployConfig, src: EngineSource, model: str) -> str:
    """The ``sbatch`` script of one replica (submit it ``--replicas`` times for more)."""
    nodes = src.nodes(cfg.gpus_per_node)
    per_node = src.gpus_per_pod(cfg.gpus_per_node)
    engine = str(src.path.resolve())
    spec = f"{engine}/extra_llm_api_options.yaml"
    mounts = ",".join(f"{d}:{d}" for d in container_mounts(engine, model, src.spec_yaml))
    srun = ["srun", "-l", "--mpi=pmix", f"--container-image={cfg.image}",
            f"--container-mounts={mounts}"]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks={src.world_size}",
        f"#SBATCH --ntasks-per-node={per_node}",
        f"#SBATCH --gpus-per-node={per_node}",
        f"#SBATCH --output={name}-%j.out",
        "# Written by `specserve deploy`; add -A/-p/-t for your cluster. One replica per job:",
        f"# submit it {cfg.replicas} time(s) and point `specserve bench --url` at each.",
        f"# World size {src.world_size} = tp {src.tp_size} x pp {src.pp_size} MPI tasks.",
        "set -euo pipefail",
        " \\\n    ".join([shlex.join(srun),
                        shlex.join(serve_argv(src, local_path(model) or model, spec))]),
        ""]
    return "\n".join(lines)
