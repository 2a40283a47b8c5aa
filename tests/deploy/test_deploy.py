"""``specserve deploy``: golden manifests for four cases (plus Slurm), every YAML
object checked offline against the Kubernetes API schema or its CRD's upstream schema
(``tests/deploy/schemas.py``), the checks shown to catch violations, and bad input refused with
one line, exit 2 and nothing written.

Regenerate goldens after a deliberate change: ``SPECSERVE_UPDATE_GOLDEN=1 pytest tests/deploy``.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.deploy.config import DeployConfig
from specserve.deploy.writer import plan_deploy
from specserve.errors import SpecserveError
from tests.deploy.schemas import SchemaViolation, check, check_all
from tests.helpers.server import trtllm_build_config

GOLDEN = Path(__file__).parent / "golden"
SPEC_YAML = """\
backend: pytorch
speculative_config:
  decoding_type: Eagle3
  max_draft_len: 3
  speculative_model: /models/eagle3-llama-3.3-70b
kv_cache_config:
  free_gpu_memory_fraction: 0.85
enable_iter_perf_stats: true
"""


def engine_dir(root: Path, name: str, tp: int, pp: int) -> Path:
    """A ``specserve build`` (engine flow) record with TP x PP."""
    d = root / name
    d.mkdir(parents=True)
    rec = trtllm_build_config("medusa")
    rec.update(tp_size=tp, pp_size=pp, world_size=tp * pp)
    (d / "build_config.json").write_text(json.dumps(rec))
    return d


def pytorch_dir(root: Path, name: str, tp: int, pp: int, version: str = "1.3") -> Path:
    """A PyTorch-route directory: ``"flow": "pytorch"`` and the speculative YAML, written for
    ``--trtllm-version`` (1.3: the line Dynamo's images ship)."""
    d = root / name
    d.mkdir(parents=True)
    rec = {"flow": "pytorch", "spec_mode": "eagle", "tp_size": tp, "pp_size": pp,
           "world_size": tp * pp, "model": "/models/llama-3.3-70b-instruct",
           "config": {"trtllm_version": version}}
    (d / "build_config.json").write_text(json.dumps(rec))
    (d / "extra_llm_api_options.yaml").write_text(SPEC_YAML)
    return d


def torch_dir(root: Path, name: str, tp: int, pp: int) -> Path:
    """A ``specserve build --backend torch`` record (the reference engine), under the mount."""
    d = root / name
    for sub in ("target", "tokenizer", "draft"):
        (d / sub).mkdir(parents=True)
    rec = trtllm_build_config("draft") | {"backend": "torch", "dtype": "float32"}
    (d / "build_config.json").write_text(json.dumps(rec))
    return d


# case -> (directory maker, tp, pp, options)
CASES: dict[str, tuple[Any, int, int, dict[str, Any]]] = {
    "tp8-one-node": (engine_dir, 8, 1, {"targets": ("k8s",), "replicas": 2}),
    "tp8-pp2-two-nodes": (engine_dir, 8, 2, {"targets": ("lws",), "namespace": "llm"}),
    "dynamo-agg": (pytorch_dir, 4, 1, {"targets": ("dynamo", "slurm")}),
    "dynamo-disagg": (pytorch_dir, 8, 2, {"targets": ("dynamo-disagg", "slurm"),
                                          "replicas": 2}),
    # the volume holds the build host's <tmp> (--host-root): the engine is /models/dynamo-torch
    "dynamo-torch": (torch_dir, 1, 1, {"targets": ("dynamo",), "replicas": 2,
                                       "image": "registry.example.com/specserve:0.1.0",
                                       "host_root": "<tmp>"}),
}


def plan(tmp_path: Path, case: str):  # type: ignore[no-untyped-def]
    make, tp, pp, opts = CASES[case]
    opts = {k: str(tmp_path.resolve()) if v == "<tmp>" else v for k, v in opts.items()}
    d = make(tmp_path, case, tp, pp)
    return plan_deploy(DeployConfig(engine=str(d), out=str(tmp_path / "out"), **opts)), d


@pytest.mark.parametrize("case", list(CASES))
def test_golden_manifests(tmp_path: Path, case: str) -> None:
    p, d = plan(tmp_path, case)
    for fname, text in p.files.items():
        text = text.replace(str(d.resolve()), "<engine>")
        golden = GOLDEN / case / fname
        if os.environ.get("SPECSERVE_UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert golden.is_file(), f"{golden}: missing (SPECSERVE_UPDATE_GOLDEN=1 writes it)"
        assert text == golden.read_text(), f"{case}/{fname} differs from its golden"
    assert sorted(p.files) == sorted(f.name for f in (GOLDEN / case).iterdir())


@pytest.mark.parametrize("case", list(CASES))
def test_every_manifest_passes_its_schema(tmp_path: Path, case: str) -> None:
    p, _ = plan(tmp_path, case)
    assert p.objects
    for fname, objs in p.objects.items():
        assert list(yaml.safe_load_all(p.files[fname])) == objs  # the YAML is the objects
        check_all(objs)


@pytest.mark.parametrize("case", list(CASES))
def test_golden_files_pass_their_schema(case: str) -> None:
    """The checked-in goldens themselves (what a reader copies) are valid too."""
    for f in sorted((GOLDEN / case).glob("*.yaml")):
        check_all(list(yaml.safe_load_all(f.read_text())))


def _objs(tmp_path: Path, case: str, kind: str) -> dict[str, Any]:
    p, _ = plan(tmp_path, case)
    return next(copy.deepcopy(o) for objs in p.objects.values() for o in objs
                if o["kind"] == kind)


PLANTS: list[tuple[str, str, Any]] = [
    ("tp8-one-node", "Deployment",
     lambda o: o["spec"].__setitem__("replicas", "two")),
    ("tp8-one-node", "Deployment",  # a misspelled container field
     lambda o: o["spec"]["template"]["spec"]["containers"][0].__setitem__("imagePullPolicyy",
                                                                          "Always")),
    ("tp8-one-node", "Service", lambda o: o["spec"]["ports"][0].__setitem__("port", "http")),
    ("tp8-pp2-two-nodes", "LeaderWorkerSet",
     lambda o: o["spec"]["leaderWorkerTemplate"].__setitem__("size", "2")),
    ("tp8-pp2-two-nodes", "LeaderWorkerSet",
     lambda o: o["spec"].__setitem__("startupPolicy", "WorkersFirst")),
    ("tp8-pp2-two-nodes", "LeaderWorkerSet",  # a pod-template field the CRD does not have
     lambda o: o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
     .__setitem__("gpus", 8)),
    ("dynamo-disagg", "DynamoGraphDeployment",
     lambda o: o["spec"]["services"]["prefill"]["multinode"].__setitem__("nodeCount", 1)),
    ("dynamo-disagg", "DynamoGraphDeployment",  # Dynamo wants the GPU count as a string
     lambda o: o["spec"]["services"]["decode"]["resources"]["limits"].__setitem__("gpu", 8)),
    ("dynamo-agg", "DynamoGraphDeployment",
     lambda o: o["spec"]["services"]["TRTLLMWorker"].__setitem__("nodes", 2)),
    ("dynamo-agg", "DynamoGraphDeployment",  # inside extraPodSpec: checked as a core Pod
     lambda o: o["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"]
     .__setitem__("args", "--model-path")),
    ("dynamo-agg", "ConfigMap", lambda o: o["data"].__setitem__("agg.yaml", 3)),
    ("dynamo-torch", "DynamoGraphDeployment",  # CPU counts are strings too
     lambda o: o["spec"]["services"]["SpecserveWorker"]["resources"]["limits"]
     .__setitem__("cpu", 2)),
    ("dynamo-torch", "DynamoGraphDeployment",  # our worker is none of the CRD's frameworks
     lambda o: o["spec"].__setitem__("backendFramework", "specserve")),
    ("dynamo-torch", "DynamoGraphDeployment",  # a container port must be a number
     lambda o: o["spec"]["services"]["SpecserveWorker"]["extraPodSpec"]["mainContainer"]
     ["ports"][0].__setitem__("containerPort", "metrics")),
]


@pytest.mark.parametrize(("case", "kind", "plant"), PLANTS)
def test_schema_checks_catch_violations(tmp_path: Path, case: str, kind: str,
                                        plant: Any) -> None:
    obj = _objs(tmp_path, case, kind)
    check(obj)  # valid as generated
    plant(obj)
    with pytest.raises(SchemaViolation):
        check(obj)


def test_multi_node_layout(tmp_path: Path) -> None:
    p, _ = plan(tmp_path, "tp8-pp2-two-nodes")
    lws, svc = p.objects["leaderworkerset.yaml"][-2:]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lws["metadata"]["namespace"] == "llm"
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    for c in (leader, worker):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {"name": "models", "mountPath": "/models"} in c["volumeMounts"]
    script = leader["args"][0]
    assert script.count("-n 1 tritonserver") == 16          # one rank per GPU of the group
    assert script.count("--http-port=8000") == 1            # rank 0 serves
    assert script.count("--load-model=tensorrt_llm") == 15  # ranks > 0 load the engine only
    assert '--host "$SPECSERVE_HOSTS"' in script and "$(seq 1 1)" in script
    assert leader["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert svc["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]
                                       ["name"], "role": "leader"}
    assert p.summary["nodes_per_replica"] == 2 and p.summary["world_size"] == 16


def test_single_node_deployment(tmp_path: Path) -> None:
    p, _ = plan(tmp_path, "tp8-one-node")
    dep, svc = p.objects["deployment.yaml"]
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    assert c["command"][:4] == ["specserve", "serve", "--repo", "/models/triton_repo"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_dynamo_workers_carry_the_speculative_yaml(tmp_path: Path) -> None:
    p, _ = plan(tmp_path, "dynamo-disagg")
    cm, dgd = p.objects["dynamo-disagg.yaml"]
    services = dgd["spec"]["services"]
    assert set(services) == {"Frontend", "prefill", "decode"}
    for mode in ("prefill", "decode"):
        svc = services[mode]
        assert svc["subComponentType"] == mode and svc["multinode"] == {"nodeCount": 2}
        assert svc["replicas"] == 2 and svc["resources"]["limits"]["gpu"] == "8"
        args = svc["extraPodSpec"]["mainContainer"]["args"]
        assert args[args.index("--disaggregation-mode") + 1] == mode
        key = Path(args[args.index("--extra-engine-args") + 1]).name
        assert yaml.safe_load(cm["data"][key])["speculative_config"]["decoding_type"] == "Eagle3"
        assert svc["extraPodSpec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    script = p.files["slurm.sbatch"]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks=16" in script
    assert "trtllm-llmapi-launch trtllm-serve /models/llama-3.3-70b-instruct" in script
    assert "--tp_size 8 --pp_size 2" in script and "--mpi=pmix" in script


def test_cli_writes_the_files(tmp_path: Path) -> None:
    d = engine_dir(tmp_path, "Llama_70B", 8, 1)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(out),
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["name"] == "llama-70b" and s["targets"] == ["k8s"]
    assert sorted(f.name for f in out.iterdir()) == [".specserve-output.json", "deploy.json",
                                                     "deployment.yaml"]
    check_all(list(yaml.safe_load_all((out / "deployment.yaml").read_text())))


BAD: list[tuple[str, tuple[str, ...], str]] = [
    ("world", ("--gpus-per-node", "6"), "not a multiple of --gpus-per-node 6"),
    ("replicas", ("--replicas", "0"), "--replicas must be >= 1"),
    ("image", ("--image", "nvcr.io/nvidia/triton server:26.04"), "--image"),
    ("namespace", ("--namespace", "LLM_Serving"), "--namespace"),
    ("namespace-long", ("--namespace", "n" * 64), "--namespace"),
    ("target", ("--target", "dynamo"), "--target dynamo: not for the engine flow"),
    ("k8s-multinode", ("--target", "k8s", "--gpus-per-node", "4"), "use --target lws"),
]


@pytest.mark.parametrize(("what", "args", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path: Path, what: str,
                                                   args: tuple[str, ...], message: str) -> None:
    d = engine_dir(tmp_path, "e", 8, 2 if what == "world" else 1)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output
    assert "Traceback" not in r.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_pytorch_route_without_a_model_is_refused(tmp_path: Path) -> None:
    d = pytorch_dir(tmp_path, "p", 1, 1)
    rec = json.loads((d / "build_config.json").read_text())
    del rec["model"]
    (d / "build_config.json").write_text(json.dumps(rec))
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "give --model" in r.output and not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(tmp_path / "o"),
                                 "--model", "meta-llama/Llama-3.1-8B-Instruct"])
    assert r.exit_code == 0, r.output


IMAGES: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "trtllm_images.json")
                                    .read_text())


def test_image_table_follows_dynamos_release_artifacts() -> None:
    from specserve.build.pins import DYNAMO_RUNTIME, IMAGE_RELEASES

    for tag, version in IMAGES["tensorrtllm-runtime"].items():
        assert IMAGE_RELEASES[f"{DYNAMO_RUNTIME}:{tag}"] == version
    assert not [i for i, v in IMAGE_RELEASES.items() if v == "1.2.1" and DYNAMO_RUNTIME in i]


@pytest.mark.parametrize("version, args, message", [
    ("1.2.1", ("--target", "dynamo"), "no Dynamo tensorrtllm-runtime image ships TensorRT-LLM "
                                      "1.2.1"),
    ("1.2.1", ("--target", "dynamo", "--image",
               "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.3.1"), "ships TensorRT-LLM 1.3"),
    ("1.3", ("--target", "slurm", "--image",
             "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"), "was written for 1.3"),
    ("1.2.1", ("--target", "dynamo", "--image",
               "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post1"), "1.2.0rc6.post2"),
    ("1.3", ("--target", "slurm", "--image", "registry.local/trtllm:mine"), "not known"),
])
def test_image_of_another_release_is_refused(tmp_path: Path, version: str,
                                             args: tuple[str, ...], message: str) -> None:
    d = pytorch_dir(tmp_path, "p", 8, 1, version)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(out), *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()


def test_release_defaults(tmp_path: Path) -> None:
    """1.2.1 YAMLs go to Slurm in the 1.2.1 image; 1.3 YAMLs to Dynamo's image too; a custom
    image is accepted when it says which release it ships."""
    p = plan_deploy(DeployConfig(engine=str(pytorch_dir(tmp_path, "a", 8, 1, "1.2.1")),
                                 out=str(tmp_path / "o")))
    assert p.summary["targets"] == ["slurm"]
    assert "--container-image=nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in \
        p.files["slurm.sbatch"]
    p = plan_deploy(DeployConfig(engine=str(pytorch_dir(tmp_path, "b", 8, 1)),
                                 out=str(tmp_path / "o")))
    assert p.summary["targets"] == ["dynamo", "slurm"] and p.summary["trtllm_version"] == "1.3"
    p = plan_deploy(DeployConfig(engine=str(pytorch_dir(tmp_path, "c", 8, 1)),
                                 out=str(tmp_path / "o"), image="registry.local/trtllm:mine",
                                 image_trtllm_version="1.3.0rc20", targets=("slurm",)))
    assert "registry.local/trtllm:mine" in p.files["slurm.sbatch"]


PATHS: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "paths.json").read_text())


def _host_dir(tmp_path: Path, version: str = "1.3") -> tuple[Path, Path]:
    """A PyTorch-route directory whose YAML and record name build-host paths under ``host``."""
    host = tmp_path / "host"
    (host / "ckpt" / "target").mkdir(parents=True)
    (host / "ckpt" / "eagle3").mkdir()
    d = pytorch_dir(host, "engine", 8, 1, version)
    (d / "extra_llm_api_options.yaml").write_text(SPEC_YAML.replace(
        "/models/eagle3-llama-3.3-70b", str(host / "ckpt" / "eagle3")))
    rec = json.loads((d / "build_config.json").read_text())
    rec["model"] = str(host / "ckpt" / "target")
    (d / "build_config.json").write_text(json.dumps(rec))
    return host, d


def test_pod_paths_come_from_the_mount(tmp_path: Path) -> None:
    """The ConfigMap's head and the worker's --model-path are the pods' paths."""
    host, d = _host_dir(tmp_path)
    p = plan_deploy(DeployConfig(engine=str(d), out=str(tmp_path / "o"), targets=("dynamo",),
                                 host_root=str(host)))
    cm, dgd = p.objects["dynamo.yaml"]
    spec = yaml.safe_load(cm["data"]["agg.yaml"])["speculative_config"]
    assert spec["speculative_model"] == "/models/ckpt/eagle3"
    args = dgd["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--model-path") + 1] == "/models/ckpt/target"
    assert str(host) not in p.files["dynamo.yaml"]


@pytest.mark.parametrize("host_root, message", [
    (None, "outside --mount /models"), ("/elsewhere", "outside --host-root /elsewhere")])
def test_paths_outside_the_mount_are_refused(tmp_path: Path, host_root: str | None,
                                             message: str) -> None:
    _, d = _host_dir(tmp_path)
    with pytest.raises(SpecserveError) as e:
        plan_deploy(DeployConfig(engine=str(d), out=str(tmp_path / "o"), targets=("dynamo",),
                                 host_root=host_root))
    assert message in str(e.value)


def test_hub_ids_are_left_to_the_pod(tmp_path: Path) -> None:
    _, d = _host_dir(tmp_path)
    hub = PATHS["hub_id_example"]
    p = plan_deploy(DeployConfig(engine=str(d), out=str(tmp_path / "o"), targets=("dynamo",),
                                 host_root=str(tmp_path / "host"), model=hub))
    args = p.objects["dynamo.yaml"][1]["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"][
        "mainContainer"]["args"]
    assert args[args.index("--model-path") + 1] == hub


def test_slurm_mounts_the_checkpoint_and_the_head(tmp_path: Path) -> None:
    """Pyxis mounts the engine, the target checkpoint and the EAGLE-3 head."""
    host, d = _host_dir(tmp_path, "1.2.1")
    script = plan_deploy(DeployConfig(engine=str(d), out=str(tmp_path / "o"),
                                      targets=("slurm",))).files["slurm.sbatch"]
    flag = PATHS["container_mount_flag"]
    mounts = script.split(flag, 1)[1].split()[0].split(",")
    assert sorted(m.split(":")[0] for m in mounts) == sorted(
        [str(host / "ckpt" / "eagle3"), str(host / "ckpt" / "target"), str(d.resolve())])
    assert all(a == b for a, b in (m.split(":") for m in mounts))
    assert f"trtllm-serve {host / 'ckpt' / 'target'} " in script


LWS_EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "lws_trtllm_example.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_everything_referenced_is_generated(tmp_path: Path, case: str) -> None:
    """The TP8xPP2 two-node set (and every other) names no object it does not generate,
    except the --pvc it lists under ``requires``."""
    from tests.deploy.closure import missing, references

    p, _ = plan(tmp_path, case)
    for objects in p.objects.values():
        assert missing(objects, p.summary["requires"]) == []
    if case == "tp8-pp2-two-nodes":
        objs = p.objects["leaderworkerset.yaml"]
        kinds = {k for o in objs for k, _ in references(o)}
        assert {"ServiceAccount", "ConfigMap", "Role"} <= kinds
        assert missing(objs[3:], []) == ["PersistentVolumeClaim/specserve-models",
                                         "ServiceAccount/tp8-pp2-two-nodes-mpi"]


def test_leader_waits_for_every_worker_then_uses_kubessh(tmp_path: Path) -> None:
    """The LWS example's start-up (data/lws_trtllm_example.json): kubessh as Open MPI's
    rsh agent, a Role that may list and exec pods, and a wait for the whole group before
    mpirun; workers run no sshd."""
    p, _ = plan(tmp_path, "tp8-pp2-two-nodes")
    account, role, binding, kubessh, lws, _ = p.objects["leaderworkerset.yaml"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    script = leader["args"][0]
    wait, launch = script.index("until ["), script.index("exec mpirun")
    assert wait < launch
    assert f'-l "{LWS_EXAMPLE["group_key_label"]}=$GROUP_KEY"' in script[wait:launch]
    assert f"--field-selector {LWS_EXAMPLE['running_selector']}" in script[wait:launch]
    assert f"-ge {lwt['size']} ]" in script[wait:launch]
    assert f"plm_rsh_agent /opt/specserve/bin/{LWS_EXAMPLE['plm_rsh_agent']}" in script
    assert {"name": "GROUP_KEY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"
            "['leaderworkerset.sigs.k8s.io/group-key']"}}} in leader["env"]
    rules = {r["resources"][0]: sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {k: sorted(v) for k, v in LWS_EXAMPLE["rbac_needs"].items()}
    assert lwt["leaderTemplate"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert "kubectl\" exec -i \"$pod\"" in kubessh["data"]["kubessh"]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "sshd" not in " ".join(worker["command"]) and "ssh -p" not in script


def test_torch_engine_behind_dynamo_runs_our_worker(tmp_path: Path) -> None:
    """CPU worker pods run specserve's Dynamo worker on the engine as the pods see it, with its
    counters port; the Frontend re-sends requests of a dead worker; no GPU anywhere."""
    p, _ = plan(tmp_path, "dynamo-torch")
    assert p.summary["targets"] == ["dynamo"] and list(p.objects) == ["dynamo.yaml"]
    (dgd,) = p.objects["dynamo.yaml"]
    worker = dgd["spec"]["services"]["SpecserveWorker"]
    main = worker["extraPodSpec"]["mainContainer"]
    assert main["command"] == ["python3", "-m", "specserve.frontends.dynamo_worker"]
    assert main["args"][:2] == ["--engine", "/models/dynamo-torch"]
    assert "gpu" not in json.dumps(dgd) and worker["replicas"] == 2
    front = dgd["spec"]["services"]["Frontend"]
    assert front["envs"] == [{"name": "DYN_MIGRATION_LIMIT", "value": "3"}]
    # the frontend with TCP_NODELAY (our launcher), on the port the Service points at
    assert front["extraPodSpec"]["mainContainer"]["command"] == [
        "python3", "-m", "specserve.frontends.dynamo_frontend"]
    assert front["extraPodSpec"]["mainContainer"]["args"] == ["--http-port", "8000"]


@pytest.mark.parametrize(("args", "message"), [
    ((), "give --image, an image with specserve and ai-dynamo"),
    (("--image", "r.example.com/s:1", "--target", "dynamo-disagg"),
     "--target dynamo-disagg: not for the engine flow"),
])
def test_torch_engine_behind_dynamo_bad_input(tmp_path: Path, args: tuple[str, ...],
                                             message: str) -> None:
    d = torch_dir(tmp_path, "e", 1, 1)
    r = CliRunner().invoke(cli, ["deploy", "--engine", str(d), "--out", str(tmp_path / "o"),
                                 "--target", "dynamo", "--host-root", str(tmp_path), *args])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output
    assert not (tmp_path / "o").exists()
