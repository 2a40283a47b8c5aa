"""``--trtllm-version``: the PyTorch-route YAML written for a named TensorRT-LLM release line,
each checked against that line's field set (``data/llmapi_fields_1.2.1.json``,
``data/llmapi_fields_1.3.json``; their ``source`` names the upstream copy and commit), with that
line's ``draft_len_schedule`` semantics (1.2: lower-bound keys; 1.3: upper-bound keys, #10860 /
#12262) and field names (#12905's renamed acceptance pair; no ``eagle3_one_model`` in 1.3)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from specserve.build import llmapi
from specserve.build.builder import validate_for_route
from specserve.build.config import BuildConfig
from specserve.errors import SpecserveError
from specserve.spec.schedule import DraftSchedule
from tests.build.test_llmapi import CASES

DATA = Path(__file__).parent / "data"
FIELDS = {v: json.loads((DATA / f"llmapi_fields_{v}.json").read_text()) for v in ("1.2.1", "1.3")}


def options(cfg: BuildConfig) -> dict[str, Any]:
    validate_for_route(cfg)
    data: dict[str, Any] = yaml.safe_load(llmapi.render_options(cfg))
    return data


def unknown_keys(opts: dict[str, Any], version: str) -> list[str]:
    fields = FIELDS[version]
    bad = [k for k in opts if k not in fields["TorchLlmArgs"]]
    for key, cls in (("kv_cache_config", "KvCacheConfig"),
                     ("cuda_graph_config", "CudaGraphConfig")):
        bad += [f"{key}.{k}" for k in opts.get(key, {}) if k not in fields[cls]]
    spec = opts["speculative_config"]
    dec = fields["decoding_configs"][spec["decoding_type"]]
    return bad + [f"speculative_config.{k}" for k in spec if k not in dec["fields"]]


@pytest.mark.parametrize("version", ["1.2.1", "1.3"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_key_in_that_releases_field_set(name: str, version: str) -> None:
    cfg = replace(CASES[name], trtllm_version=version)
    opts = options(cfg)
    assert unknown_keys(opts, version) == []
    assert f"TensorRT-LLM {version} LLM API options" in llmapi.render_options(cfg)


def test_13_eagle3_has_no_eagle3_one_model_and_names_speculative_model() -> None:
    spec = options(replace(CASES["eagle3"], trtllm_version="1.3"))["speculative_config"]
    assert "eagle3_one_model" not in FIELDS["1.3"]["decoding_configs"]["Eagle3"]["fields"]
    assert "eagle3_one_model" not in spec and spec["speculative_model"] == "ckpt/eagle3-l3"
    assert options(CASES["eagle3"])["speculative_config"]["eagle3_one_model"] is True


def test_13_schedule_keys_are_upper_bounds_with_the_same_draft_lengths() -> None:
    cfg = replace(CASES["draft_target"], trtllm_version="1.3")  # 1:4,4:2,8:0, batch <= 16
    sched = options(cfg)["speculative_config"]["draft_len_schedule"]
    assert sched == {3: 4, 7: 2}
    example = FIELDS["1.3"]["draft_len_schedule"]["same_in_1.3_at_max_batch_16"]
    assert sched == {int(k): v for k, v in example.items()}

    def k_13(batch: int) -> int:  # 1.3: the smallest key >= batch, 0 above the largest
        return next((sched[key] for key in sorted(sched) if batch <= key), 0)

    lower = DraftSchedule.parse(cfg.draft_len_schedule or "")
    assert [k_13(b) for b in range(1, 17)] == [lower.at(b) for b in range(1, 17)]
    assert options(CASES["draft_target"])["speculative_config"]["draft_len_schedule"] == {
        1: 4, 4: 2, 8: 0}  # 1.2.1 keeps lower bounds


def test_13_schedule_that_never_stops_drafting_covers_the_batch_limit() -> None:
    cfg = replace(CASES["draft_target"], trtllm_version="1.3", draft_len_schedule="1:4,4:2")
    assert options(cfg)["speculative_config"]["draft_len_schedule"] == {3: 4, 16: 2}


@pytest.mark.parametrize("version, key, message", [
    ("1.3", "acceptance_window", "renamed acceptance_rate_window_size (#12905)"),
    ("1.3", "acceptance_length_threshold", "renamed acceptance_rate_threshold"),
    ("1.3", "eagle3_one_model", "not a field of 1.3.0rc27"),
    ("1.2.1", "acceptance_rate_threshold", "not in TensorRT-LLM 1.2.1"),
])
def test_renamed_keys_refused_per_release(version: str, key: str, message: str) -> None:
    cfg = replace(CASES["eagle3"], trtllm_version=version, spec_options=((key, "1"),))
    with pytest.raises(SpecserveError) as e:
        validate_for_route(cfg)
    assert message in str(e.value)


def test_13_accepts_its_own_acceptance_keys() -> None:
    cfg = replace(CASES["eagle3"], trtllm_version="1.3",
                  spec_options=(("acceptance_rate_threshold", "0.5"),
                                ("acceptance_rate_window_size", "64")))
    spec = options(cfg)["speculative_config"]
    assert spec["acceptance_rate_threshold"] == 0.5 and unknown_keys(options(cfg), "1.3") == []


def test_engine_flow_refuses_another_release() -> None:
    cfg = BuildConfig(model="m", out="o", spec_mode="ngram", backend="trtllm",
                      trtllm_version="1.3")
    with pytest.raises(SpecserveError, match="--trtllm-version"):
        cfg.validate()


TREES: dict[str, Any] = json.loads((DATA / "eagle3_trees.json").read_text())


def test_static_tree_runs_two_model_on_121() -> None:
    """Upstream's static trees are two-model Eagle3 (data/eagle3_trees.json)."""
    cfg = replace(CASES["eagle3"], eagle_choices=((0,), (1,), (0, 0)), max_draft_len=2)
    spec = options(cfg)["speculative_config"]
    assert spec["eagle_choices"] == [[0], [1], [0, 0]]
    assert spec["eagle3_one_model"] is TREES["static_tree_eagle3_one_model"]
    with pytest.raises(SpecserveError, match="no eagle3_one_model"):
        validate_for_route(replace(cfg, trtllm_version="1.3"))


@pytest.mark.parametrize("version", ["1.2.1", "1.3"])
def test_dynamic_tree_only_where_implemented(version: str) -> None:
    """Refused for 1.2.1 (overwritten, not implemented), written for 1.3."""
    cfg = replace(CASES["eagle3"], trtllm_version=version, dynamic_tree_top_k=4,
                  max_total_draft_tokens=16)
    if not TREES["dynamic_tree_in"][version]:
        with pytest.raises(SpecserveError, match="#12062"):
            validate_for_route(cfg)
        return
    spec = options(cfg)["speculative_config"]
    assert spec["use_dynamic_tree"] is True and spec["max_total_draft_tokens"] == 16
    assert unknown_keys(options(cfg), version) == []
