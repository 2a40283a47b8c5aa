"""``DeployConfig``: the inputs of ``specserve deploy``, and the engine directory it deploys.

Names follow the Kubernetes object-name rules (RFC 1123 DNS labels: at most 63 lower-case
alphanumerics or ``-``, starting and ending alphanumeric; kubernetes.io/docs/concepts/overview/
working-with-objects/names). The world size of a replica (TP x PP from ``build_config.json``)
must be a multiple of the GPUs per node: a replica spans ``world_size / gpus_per_node`` nodes,
one pod per node, as the LeaderWorkerSet TensorRT-LLM example and Dynamo's ``multinode.nodeCount``
lay it out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specserve.build.pins import IMAGE_RELEASES, RELEASES, TRTLLM_IMAGE, TRTLLM_VERSION
from specserve.config import JsonConfig, read_json
from specserve.engine_record import RECORD_FILE, read_engine_record
from specserve.errors import SpecserveError

#: The pinned engine-flow image (TensorRT-LLM 1.2.1).
ENGINE_IMAGE = TRTLLM_IMAGE
#: Dynamo's TensorRT-LLM runtime image as its examples name it
#: (ai-dynamo/dynamo examples/backends/trtllm/deploy/disagg.yaml @04521f47); it ships a 1.3.0
#: release candidate, so it serves ``--trtllm-version 1.3`` YAMLs only.
DYNAMO_IMAGE = RELEASES["1.3"].image
#: release line -> the Dynamo image that ships it (none ships 1.2.1: release-artifacts.md
#: @196b75f2 lists 1.1.0rc5 ... 1.2.0rc6.post2, then the 1.3.0 rcs).
DYNAMO_IMAGES = {"1.3": DYNAMO_IMAGE}
#: Any image with ``sh`` and ``kubectl`` on PATH (the LWS leader copies kubectl from it).
KUBECTL_IMAGE = "docker.io/bitnami/kubectl:1.33"
SPEC_YAML = "extra_llm_api_options.yaml"
FLOWS = ("engine", "pytorch")
TARGETS = {"engine": ("k8s", "lws"), "pytorch": ("dynamo", "dynamo-disagg", "slurm")}
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A container image reference: [registry[:port]/]path[:tag][@digest] (distribution/reference).
_IMAGE = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._/-][a-z0-9]+)*"
                    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


def check_label(value: str, what: str) -> None:
    """Raise unless ``value`` is an RFC 1123 label (Kubernetes namespace and object names)."""
    if len(value) > 63 or not _LABEL.match(value):
        raise SpecserveError(f"{what}: {value!r} is not a valid Kubernetes name (RFC 1123 label: "
                             "at most 63 characters of a-z, 0-9 and '-', starting and ending "
                             "with a letter or digit)")


def default_name(engine: str) -> str:
    """The engine directory's name made an RFC 1123 label (``Llama_70B`` -> ``llama-70b``)."""
    name = re.sub(r"[^a-z0-9]+", "-", Path(engine).resolve().name.lower()).strip("-")[:40]
    return name.strip("-") or "specserve"


@dataclass(frozen=True)
class DeployConfig(JsonConfig):
    """What ``specserve deploy`` writes (``None``: derived from the engine directory)."""

    engine: str
    out: str
    targets: tuple[str, ...] = ()     # empty: the flow's defaults (see default_targets)
    name: str | None = None           # object names; default from the engine directory
    replicas: int = 1
    gpus_per_node: int = 8
    image: str | None = None          # default ENGINE_IMAGE (Dynamo: DYNAMO_IMAGE)
    namespace: str = "default"
    pvc: str = "specserve-models"     # PersistentVolumeClaim with engines and repositories
    mount: str = "/models"            # where the claim is mounted in every pod
    repo_path: str = "triton_repo"    # engine flow: the model repository under the mount
    model: str | None = None          # PyTorch route: the checkpoint trtllm-serve loads
    image_trtllm_version: str | None = None  # what --image ships, when specserve cannot tell
    host_root: str | None = None      # the build-host directory the PVC holds (seen at --mount)
    kubectl_image: str = KUBECTL_IMAGE  # LWS: the init container that provides kubectl

    def validate(self) -> None:
        if self.replicas < 1:
            raise SpecserveError(f"--replicas must be >= 1, got {self.replicas}")
        if self.gpus_per_node < 1:
            raise SpecserveError(f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")
        if self.image is not None and not _IMAGE.match(self.image):
            raise SpecserveError(f"--image: {self.image!r} is not a container image reference "
                                 "(e.g. nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3)")
        if not _IMAGE.match(self.kubectl_image):
            raise SpecserveError(f"--kubectl-image: {self.kubectl_image!r} is not a container "
                                 "image reference")
        check_label(self.namespace, "--namespace")
        check_label(self.pvc, "--pvc")
        if self.name is not None:
            check_label(self.name, "--name")
        if not _PATH.match(self.mount):
            raise SpecserveError(f"--mount: {self.mount!r} must be an absolute path of "
                                 "letters, digits and ._/-")
        if self.repo_path.startswith("/") or not _PATH.match("/" + self.repo_path) or \
                ".." in self.repo_path.split("/"):
            raise SpecserveError(f"--repo-path: {self.repo_path!r} must be a relative path "
                                 "inside the volume")
        if self.host_root is not None and not Path(self.host_root).expanduser().is_absolute():
            raise SpecserveError(f"--host-root: {self.host_root!r} must be an absolute path")
        if self.model is not None and (not self.model or any(c.isspace() for c in self.model)):
            raise SpecserveError(f"--model: {self.model!r} must be a path or model id without "
                                 "spaces")


@dataclass(frozen=True)
class EngineSource:
    """What deployment needs from an engine directory."""

    path: Path
    flow: str                  # "engine" (TensorRT-LLM engines, Triton) | "pytorch"
    tp_size: int
    pp_size: int
    world_size: int
    spec_yaml: str | None      # pytorch: extra_llm_api_options.yaml as written by the build
    model: str | None          # pytorch: the checkpoint the record names
    record: dict[str, Any]
    trtllm_version: str = TRTLLM_VERSION  # the release line the engine / YAML was written for
    backend: str = "trtllm"    # engine flow: "torch" for the reference engine

    @property
    def torch(self) -> bool:
        return self.flow == "engine" and self.backend == "torch"

    def allowed_targets(self) -> tuple[str, ...]:
        """The flow's targets; a torch engine may also go behind Dynamo (our worker)."""
        return TARGETS[self.flow] + (("dynamo",) if self.torch else ())

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes (pods) per replica; the world size must fill whole nodes or fit in one."""
        if self.world_size <= gpus_per_node:
            return 1
        if self.world_size % gpus_per_node:
            raise SpecserveError(
                f"{self.path}: world size {self.world_size} (tp {self.tp_size} x pp "
                f"{self.pp_size}) is not a multiple of --gpus-per-node {gpus_per_node}; a "
                "replica must fill whole nodes")
        return self.world_size // gpus_per_node

    def gpus_per_pod(self, gpus_per_node: int) -> int:
        return min(self.world_size, gpus_per_node)


def _positive(data: dict[str, Any], key: str, path: Path) -> int:
    value = data.get(key, 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecserveError(f"{path}: {key!r} must be a positive integer, got {value!r}")
    return value


def read_source(engine: str | Path) -> EngineSource:
    """The engine directory: ``"flow": "pytorch"`` records (with ``extra_llm_api_options.yaml``)
    are the PyTorch route; a record without ``flow`` is a ``specserve build`` engine."""
    d = Path(engine)
    path = d / RECORD_FILE
    if not path.is_file():
        read_engine_record(d)  # the usual one-line error for a missing directory or record
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise SpecserveError(f"{path}: expected a JSON object")
    flow = raw.get("flow", "engine")
    if flow not in FLOWS:
        raise SpecserveError(f"{path}: unknown flow {flow!r} (expected one of {list(FLOWS)})")
    if flow == "engine":
        rec = read_engine_record(d)
        return EngineSource(d, "engine", rec.tp_size, rec.pp_size, rec.world_size, None, None,
                            raw, backend=rec.backend)
    tp, pp = _positive(raw, "tp_size", path), _positive(raw, "pp_size", path)
    spec = d / SPEC_YAML
    if not spec.is_file():
        raise SpecserveError(f"{spec}: not found (a PyTorch-route engine directory carries "
                             "its speculative config there)")
    config = raw.get("config")
    model = raw.get("model") or (config.get("model") if isinstance(config, dict) else None)
    version = (config.get("trtllm_version") if isinstance(config, dict) else None) or \
        TRTLLM_VERSION
    if version not in RELEASES:
        raise SpecserveError(f"{path}: config.trtllm_version {version!r} is not one of "
                             f"{list(RELEASES)}")
    return EngineSource(d, "pytorch", tp, pp, tp * pp, spec.read_text(encoding="utf-8"),
                        str(model) if model else None, raw, version)


def local_path(value: str) -> str | None:
    """``value`` as an absolute path when it names a local path (absolute, ``./``-relative or
    existing); None for a Hugging Face Hub id such as ``meta-llama/Llama-3.1-8B``."""
    if not value:
        return None
    if value.startswith(("/", ".", "~")) or Path(value).exists():
        return str(Path(value).expanduser().resolve())
    return None


MODEL_KEYS = ("speculative_model_dir", "speculative_model")


def spec_model_dir(text: str | None) -> str | None:
    """The draft / EAGLE-3 head directory an engine YAML names (either spelling), if any."""
    data = yaml.safe_load(text or "") or {}
    spec = data.get("speculative_config") if isinstance(data, dict) else None
    if not isinstance(spec, dict):
        return None
    return next((str(spec[k]) for k in MODEL_KEYS if spec.get(k)), None)


def pod_path(cfg: DeployConfig, value: str, what: str) -> str:
    """Where a build-host path is inside the pods: under ``--mount``, through ``--host-root``
    (the host directory the PVC holds); a path outside both is refused."""
    host = local_path(value)
    if host is None:
        return value  # a Hub id: the pod downloads it
    mount = cfg.mount.rstrip("/") or "/"
    if cfg.host_root is not None:
        root = Path(cfg.host_root).expanduser().resolve()
        rel = _relative(Path(host), root)
        if rel is None:
            raise SpecserveError(f"{what} {host}: outside --host-root {root}, so not on the "
                                 f"volume the pods mount at {mount}; put it under {root}")
        return mount if rel == "." else f"{mount.rstrip('/')}/{rel}"
    if _relative(Path(host), Path(mount)) is None:
        raise SpecserveError(f"{what} {host}: outside --mount {mount}, so the pods cannot see "
                             "it; give --host-root DIR (the build-host directory the PVC "
                             f"holds, mounted at {mount})")
    return host


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def target_image(cfg: DeployConfig, src: EngineSource, target: str) -> str:
    """The image a target runs: ``--image``, or the one that ships the release ``src`` was
    written for (engine flow: the pin; Dynamo: its runtime image of that line; Slurm: the
    release's own image)."""
    if cfg.image is not None:
        return cfg.image
    if target == "dynamo" and src.torch:
        raise SpecserveError(f"--target dynamo for the torch engine {src.path}: give --image, "
                             "an image with specserve and ai-dynamo 1.6.1 installed (`pip "
                             "install -c constraints.txt '.[server]'` then `pip install --no-deps "
                             "ai-dynamo==1.6.1`); none is published")
    if target.startswith("dynamo"):
        image = DYNAMO_IMAGES.get(src.trtllm_version)
        if image is None:
            raise SpecserveError(
                f"--target {target}: no Dynamo tensorrtllm-runtime image ships TensorRT-LLM "
                f"{src.trtllm_version}, which {src.path} was written for (0.8.1.post1 ships "
                f"1.2.0rc6.post2, {DYNAMO_IMAGE.rsplit(':', 1)[1]} a 1.3.0 rc); rebuild with "
                "--trtllm-version 1.3, or give --image and --image-trtllm-version")
        return image
    return RELEASES[src.trtllm_version].image if src.flow == "pytorch" else TRTLLM_IMAGE


def check_image_release(cfg: DeployConfig, src: EngineSource, image: str) -> None:
    """Refuse an image that ships another TensorRT-LLM than ``src`` was written for."""
    shipped = IMAGE_RELEASES.get(image) if cfg.image_trtllm_version is None or \
        image != cfg.image else cfg.image_trtllm_version
    if shipped is None:
        raise SpecserveError(f"--image {image}: which TensorRT-LLM it ships is not known to "
                             "specserve; give --image-trtllm-version (its tensorrt_llm."
                             "__version__), or one of: " + ", ".join(sorted(IMAGE_RELEASES)))
    if not RELEASES[src.trtllm_version].ships(shipped):
        raise SpecserveError(f"{image} ships TensorRT-LLM {shipped}, but {src.path} was written "
                             f"for {src.trtllm_version} (its field names and draft_len_schedule "
                             "semantics differ); rebuild with --trtllm-version "
                             f"{_line(shipped)}, or give an image of that release")


def _line(version: str) -> str:
    """The ``--trtllm-version`` that a shipped version belongs to ('?' if none)."""
    return next((r.name for r in RELEASES.values() if r.ships(version)), "(none: unsupported)")


def resolve_targets(cfg: DeployConfig, src: EngineSource) -> tuple[str, ...]:
    """The targets to write: as given (checked against the flow) or the flow's defaults."""
    allowed = src.allowed_targets()
    if not cfg.targets:
        if src.flow == "pytorch":  # Dynamo only where one of its images ships the release
            return ("dynamo", "slurm") if src.trtllm_version in DYNAMO_IMAGES else ("slurm",)
        return ("lws",) if src.nodes(cfg.gpus_per_node) > 1 else ("k8s",)
    bad = [t for t in cfg.targets if t not in allowed]
    if bad:
        raise SpecserveError(f"--target {bad[0]}: not for the {src.flow} flow of {src.path} "
                             f"(choose from {list(allowed)})")
    if "k8s" in cfg.targets and src.nodes(cfg.gpus_per_node) > 1:
        raise SpecserveError(f"--target k8s: a replica of {src.path} spans "
                             f"{src.nodes(cfg.gpus_per_node)} nodes (world size "
                             f"{src.world_size}, {cfg.gpus_per_node} GPUs per node); use "
                             "--target lws")
    return tuple(dict.fromkeys(cfg.targets))
