"""``specserve repo`` / ``specserve serve`` for a ``--flow pytorch`` engine: Triton's ``llmapi``
Python model (upstream's ``config.pbtxt`` + ``1/model.yaml`` layout), its ``config.pbtxt``
parsed with Triton's own proto, ``model.yaml`` keys against 1.2.1's field set, and ``serve``
refusing in one line where ``tensorrt_llm`` does not import."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specserve.cli.main import cli
from tests.build.test_llmapi import FIELDS, unknown_keys
from tests.helpers.tiny import TinyCheckpoint

# upstream's T1 I/O (config.pbtxt @c8c6df08): name -> (data type, dims)
INPUTS = {"text_input": ("TYPE_STRING", [-1]), "streaming": ("TYPE_BOOL", [1]),
          "sampling_param_max_tokens": ("TYPE_INT32", [1]),
          "sampling_param_seed": ("TYPE_UINT64", [1]),
          "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1]),
          "sampling_param_stop": ("TYPE_STRING", [-1])}
OUTPUTS = {"text_output": ("TYPE_STRING", [-1]), "acceptance_rate": ("TYPE_FP32", [1]),
           "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
           "total_draft_tokens": ("TYPE_INT32", [1]),
           "arrival_time_ns": ("TYPE_INT64", [1]), "kv_cache_hit_rate": ("TYPE_FP32", [-1])}


@pytest.fixture()
def engine(ckpt: TinyCheckpoint, tmp_path: Path) -> Path:
    out = tmp_path / "engines" / "dt"
    result = CliRunner().invoke(cli, ["build", "--model", str(ckpt.target), "--draft",
                                      str(ckpt.draft), "--flow", "pytorch", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _repo(engine: Path, out: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["repo", "--engine", str(engine), "--out", str(out), *extra,
                                    "--format", "json"])


def test_llmapi_repository_renders_and_parses(engine: Path, tmp_path: Path) -> None:
    upstream = tmp_path / "upstream" / "1"
    upstream.mkdir(parents=True)
    (upstream / "model.py").write_text("# upstream model.py stand-in\n")
    result = _repo(engine, tmp_path / "repo", "--llmapi-model-dir", str(upstream))
    assert result.exit_code == 0, result.output
    repo = tmp_path / "repo"
    assert json.loads(result.stdout)["models"] == ["tensorrt_llm"]
    mc = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(),
                           model_config_pb2.ModelConfig())
    assert mc.name == "tensorrt_llm" and mc.backend == "python" and mc.max_batch_size == 0
    assert [g.kind for g in mc.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    ins = {i.name: (model_config_pb2.DataType.Name(i.data_type), list(i.dims), i.optional)
           for i in mc.input}
    outs = {o.name: (model_config_pb2.DataType.Name(o.data_type), list(o.dims))
            for o in mc.output}
    for name, (dtype, dims) in INPUTS.items():
        assert ins[name][:2] == (dtype, dims), name
    assert ins["text_input"][2] is False and ins["streaming"][2] is True
    for name, want in OUTPUTS.items():
        assert outs[name] == want, name
    assert len(ins) == 17 and len(outs) == 16
    assert (repo / "tensorrt_llm" / "1" / "model.py").read_text().startswith("# upstream")
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert doc["backend"] == "pytorch" and doc["speculative_config"]["decoding_type"] == \
        "Draft_Target"
    llm_kw = {k: v for k, v in doc.items() if k != "triton_config"}
    assert unknown_keys(llm_kw) == [] and {"model", "backend"} <= set(FIELDS["TorchLlmArgs"])


def test_llmapi_repo_refuses_cpp_options(engine: Path, tmp_path: Path) -> None:
    result = _repo(engine, tmp_path / "repo", "--kv-cache-fraction", "0.5")
    assert result.exit_code == 2 and "not for the llmapi model" in result.output
    assert not (tmp_path / "repo").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                    reason="tensorrt_llm is importable here")
def test_serve_refuses_without_tensorrt_llm(engine: Path, tmp_path: Path) -> None:
    assert _repo(engine, tmp_path / "repo").exit_code == 0
    result = CliRunner().invoke(cli, ["serve", "--repo", str(tmp_path / "repo")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "tensorrt_llm is not importable" in lines[0]


def test_relative_paths_are_written_absolute(ckpt: TinyCheckpoint, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed relative, the YAML, the record and Triton's model.yaml name absolute paths
    (tests/deploy/data/paths.json: a relative speculative_model is taken for a Hub id)."""
    import shutil

    shutil.copytree(ckpt.target, tmp_path / "ck" / "target")
    shutil.copytree(ckpt.draft, tmp_path / "ck" / "draft")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["build", "--model", "ck/target", "--draft", "ck/draft",
                                      "--flow", "pytorch", "--out", "engines/rel"])
    assert result.exit_code == 0, result.output
    monkeypatch.chdir("/")
    engine = tmp_path / "engines" / "rel"
    opts = yaml.safe_load((engine / "extra_llm_api_options.yaml").read_text())
    assert opts["speculative_config"]["speculative_model_dir"] == str(tmp_path / "ck" / "draft")
    assert _repo(engine, tmp_path / "repo").exit_code == 0
    doc = yaml.safe_load((tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert doc["model"] == str(tmp_path / "ck" / "target")
    assert doc["speculative_config"]["speculative_model_dir"] == str(tmp_path / "ck" / "draft")


DECOUPLED = json.loads((Path(__file__).parent / "data" / "triton_llmapi_decoupled.json")
                       .read_text())


@pytest.mark.parametrize("decoupled", [True, False])
def test_config_pbtxt_carries_the_transaction_policy(engine: Path, tmp_path: Path,
                                                     decoupled: bool) -> None:
    """`specserve serve` passes --disable-auto-complete-config, so upstream's model.py
    never sets the policy; config.pbtxt must say it, equal to model.yaml's triton_config."""
    from specserve.triton.launch import TritonInstall, build_command

    argv = build_command(TritonInstall(binary=Path("tritonserver"), bundled=False),
                         tmp_path, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3,
                         backend_dir=None, shm_prefix="x", world_size=1)
    assert DECOUPLED["serve_flag"] in argv
    args = () if decoupled else ("--no-decoupled",)
    result = _repo(engine, tmp_path / "repo", *args)
    assert result.exit_code == 0, result.output
    repo = tmp_path / "repo" / "tensorrt_llm"
    mc = text_format.Parse((repo / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    field, sub = DECOUPLED["config_field"]
    assert getattr(getattr(mc, field), sub) is decoupled
    assert yaml.safe_load((repo / "1" / "model.yaml").read_text())["triton_config"][
        "decoupled"] is decoupled


STAND_IN = '''"""Test stand-in for upstream's llmapi model.py (which needs tensorrt_llm): it refuses
to load unless Triton gave it a decoupled transaction policy, and streams two responses."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("loaded non-decoupled")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for word in (b"a", b"b"):
                out = pb_utils.Tensor("text_output", np.array([word], dtype=object))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


@pytest.mark.server
def test_triton_loads_the_llmapi_model_decoupled(engine: Path, tmp_path: Path) -> None:
    """The llmapi model against a real tritonserver, started as `specserve serve` starts it
    (auto-complete off): the model loads decoupled and streams several responses to one request."""
    import tritonclient.grpc as grpcclient

    from specserve.triton.server import TritonServer

    stand_in = tmp_path / "stand_in" / "1"
    stand_in.mkdir(parents=True)
    (stand_in / "model.py").write_text(STAND_IN)
    assert _repo(engine, tmp_path / "repo", "--llmapi-model-dir", str(stand_in)).exit_code == 0
    server = TritonServer(tmp_path / "repo", log_path=tmp_path / "server.log").start(180)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        cfg = client.get_model_config("tensorrt_llm", as_json=True)["config"]
        assert cfg["model_transaction_policy"]["decoupled"] is True
        got: list[Any] = []
        client.start_stream(callback=lambda result, error: got.append(error or result))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hi"], dtype=object))
        client.async_stream_infer("tensorrt_llm", [text])
        client.stop_stream()
        outs = [r.as_numpy("text_output")[0] for r in got if hasattr(r, "as_numpy")
                and r.as_numpy("text_output") is not None]
        assert outs == [b"a", b"b"], got
    finally:
        server.stop()
