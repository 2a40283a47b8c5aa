"""``benchmarks/trtllm_check.py`` (``make trtllm-check``): here it claims nothing; in NVIDIA's
container (marked gpu) it serves each method's YAML and wants tau > 1."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "trtllm_check.py"


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                    reason="tensorrt_llm is importable here")
def test_without_tensorrt_llm_claims_nothing() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert "TensorRT-LLM is not installed" in res.stdout and "tau" not in res.stdout


@pytest.mark.gpu
def test_container_check() -> None:
    """In the container: TRTLLM_CHECK_MODEL (and optional _DRAFT / _EAGLE3) name a small model."""
    model = os.environ.get("TRTLLM_CHECK_MODEL")
    if importlib.util.find_spec("tensorrt_llm") is None or not model:
        pytest.skip("needs tensorrt_llm and TRTLLM_CHECK_MODEL")
    args = ["--model", model]
    for env, flag in (("TRTLLM_CHECK_DRAFT", "--draft"), ("TRTLLM_CHECK_EAGLE3", "--eagle3")):
        if os.environ.get(env):
            args += [flag, os.environ[env]]
    res = subprocess.run([sys.executable, str(SCRIPT), *args], text=True, timeout=3600,
                         check=False)
    assert res.returncode == 0


# --- the release gate's logic, against fake llm_args modules made from recorded field sets ---

DATA = Path(__file__).parent / "data"


def _check_module() -> Any:
    spec = importlib.util.spec_from_file_location("trtllm_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Field:
    def __init__(self, default: Any = None) -> None:
        self.default = default
        self.validation_alias = None


def fake_llm_args(version: str, classvar_layout: bool = False) -> Any:
    """A stand-in ``tensorrt_llm.llmapi.llm_args`` whose classes declare the recorded fields
    (``data/llmapi_fields_<version>.json``). ``classvar_layout``: the older ``from_dict``
    layout: ``decoding_type`` a ClassVar spelled ``Eagle`` /
    ``DraftTarget``, no Eagle3 class."""
    import types

    data = json.loads((DATA / f"llmapi_fields_{version}.json").read_text())
    mod = types.SimpleNamespace()
    for name in ("TorchLlmArgs", "KvCacheConfig", "CudaGraphConfig"):
        setattr(mod, name, type(name, (), {"model_fields": {f: _Field() for f in data[name]}}))
    for literal, dec in data["decoding_configs"].items():
        fields = {f: _Field(literal if f == "decoding_type" else None) for f in dec["fields"]}
        attrs: dict[str, Any] = {"model_fields": fields}
        if classvar_layout:
            if literal == "Eagle3":
                continue
            fields.pop("decoding_type", None)
            attrs["decoding_type"] = {"Draft_Target": "DraftTarget"}.get(literal, literal)
        setattr(mod, dec["class"], type(dec["class"], (), attrs))
    return mod


@pytest.mark.parametrize("version", ["1.2.1", "1.3"])
def test_gate_passes_on_the_release_the_yaml_targets(version: str) -> None:
    chk = _check_module()
    installed = {"1.2.1": "1.2.1", "1.3": "1.3.0rc16"}[version]
    assert chk.field_report(fake_llm_args(version), installed, version) == []


def test_gate_names_each_mismatch_on_another_release() -> None:
    """A 1.2.1 YAML under a 1.3 install: the version and each renamed/removed key, by name."""
    found = _check_module().field_report(fake_llm_args("1.3"), "1.3.0rc16", "1.2.1")
    assert found[0].startswith("tensorrt_llm 1.3.0rc16 is not the 1.2.1 line")
    for key in ("eagle3: unknown speculative_config.eagle3_one_model",
                "eagle3: unknown speculative_config.speculative_model_dir",
                "draft: unknown speculative_config.acceptance_window",
                "ngram: unknown speculative_config.acceptance_length_threshold"):
        assert key in found, found


def test_gate_reads_the_classvar_layout_without_keyerror() -> None:
    """The older layout keeps decoding_type a ClassVar; the gate reports the spelling
    (Draft_Target), and EAGLE-3's ``Eagle`` parses there too."""
    found = _check_module().field_report(fake_llm_args("1.2.1", classvar_layout=True),
                                         "1.2.1", "1.2.1")
    assert found == ["draft: decoding_type: this release spells it 'DraftTarget', specserve "
                     "wrote 'Draft_Target'"]


def test_eagle3_as_eagle3_would_fail_the_older_layout() -> None:
    """What writing ``Eagle3`` on 1.2.1 would meet in the older layout."""
    chk = _check_module()
    opts = chk.emitted_options("1.2.1")["eagle3"]
    assert opts["speculative_config"]["decoding_type"] == "Eagle"
    opts["speculative_config"]["decoding_type"] = "Eagle3"
    found = chk.live_field_findings(opts, fake_llm_args("1.2.1", classvar_layout=True))
    assert found == ["decoding_type 'Eagle3': no Eagle3DecodingConfig in this release"]
