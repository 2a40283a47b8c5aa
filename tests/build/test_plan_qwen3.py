"""Qwen3 (dense) in TensorRT-LLM 1.2.1 engine-flow plans, against upstream facts typed into
``data/trtllm_1.2.1_qwen3.json`` (NVIDIA/TensorRT-LLM commits cited there): draft-target and
n-gram targets go through ``examples/models/core/qwen/convert_checkpoint.py`` with flags of its
argparse; Medusa, EAGLE and FP8 are refused in one line naming ``--flow pytorch``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.build.config import BuildConfig, resolve
from specserve.build.trtllm import (
    DEFAULT_EXAMPLES_DIR,
    ENGINE_CONVERTERS,
    SCRIPTS,
    PlanInputs,
    make_trtllm_plan,
)
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from tests.build.test_plan import FLAGS, flag_values, tool_of
from tests.helpers.tiny import TinyCheckpoint, make_qwen3

HERE = Path(__file__).parent
QWEN3 = json.loads((HERE / "data" / "trtllm_1.2.1_qwen3.json").read_text())
QWEN_CONVERTER = "examples/models/core/qwen/convert_checkpoint.py"
TOOLS = {**FLAGS, QWEN_CONVERTER: QWEN3[QWEN_CONVERTER]}
TARGET_CFG = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936,
              "max_position_embeddings": 40960, "model_type": "qwen3"}
BASE = BuildConfig(model="ckpt/qwen3-8b", out="engines/q", spec_mode="ngram", backend="trtllm",
                   max_batch_size=8, max_input_len=2048, max_seq_len=4096)


def _plan(cfg: BuildConfig, draft_type: str | None = None) -> Any:
    resolved = resolve(cfg, TARGET_CFG, num_medusa_heads=4 if cfg.spec_mode == "medusa" else None)
    return make_trtllm_plan(resolved, PlanInputs("qwen3", 4, 1, DEFAULT_EXAMPLES_DIR,
                                                 draft_model_type=draft_type))


def test_upstream_facts_behind_the_family_table() -> None:
    assert QWEN3["tensorrt_llm/models/__init__.py"]["MODEL_MAP"]["Qwen3ForCausalLM"] == \
        "QWenForCausalLM"
    assert "qwen3" in QWEN3["tensorrt_llm/models/qwen/config.py"]["valid_types"]
    assert "qwen3" not in QWEN3["examples/medusa/convert_checkpoint.py"]["model_type_asserted"]
    assert "examples/" + SCRIPTS[ENGINE_CONVERTERS["qwen3"]] == QWEN_CONVERTER


@pytest.mark.parametrize(("changes", "draft_type", "converters"), [
    ({}, None, [QWEN_CONVERTER]),
    ({"tp_size": 2, "pp_size": 2}, None, [QWEN_CONVERTER]),
    ({"spec_mode": "draft", "draft": "ckpt/qwen3-0.6b", "max_draft_len": 5}, None,
     [QWEN_CONVERTER, QWEN_CONVERTER]),
    ({"spec_mode": "draft", "draft": "ckpt/llama-draft"}, "llama",
     [QWEN_CONVERTER, "examples/models/core/llama/convert_checkpoint.py"]),
])
def test_qwen3_plans_use_the_qwen_converter_with_its_flags(
        changes: dict[str, Any], draft_type: str | None, converters: list[str]) -> None:
    cfg = replace(BASE, **changes)
    plan = _plan(cfg, draft_type)
    convs = [s for s in plan.steps if s.kind == "convert"]
    assert [tool_of(s.argv) for s in convs] == converters
    for step in plan.steps:
        tool = tool_of(step.argv)
        spec = TOOLS[tool]
        pairs = flag_values(step.argv, tool) if tool in FLAGS else _qwen_pairs(step.argv)
        assert len({f for f, _ in pairs}) == len(pairs), step.name
        for flag, value in pairs:
            assert flag in spec["flags"], f"{step.name}: {flag} is not a {tool} flag"
            if flag in spec.get("choices", {}):
                assert value in spec["choices"][flag], f"{step.name}: {flag} {value}"
        if tool == QWEN_CONVERTER:
            got = dict(pairs)
            assert set(spec["required"]) <= set(got)
            ranks = (cfg.tp_size, cfg.pp_size) if step.name == "convert target" else (1, 1)
            assert (got["--tp_size"], got["--pp_size"]) == tuple(str(r) for r in ranks)
            assert step.ranks == ranks[0] * ranks[1]
    (build,) = [s for s in plan.steps if s.name == "build target engine"]
    assert dict(flag_values(build.argv, "trtllm-build"))["--speculative_decoding_mode"] == \
        "draft_tokens_external"


def _qwen_pairs(argv: tuple[str, ...]) -> list[tuple[str, str | None]]:
    spec, out, i = QWEN3[QWEN_CONVERTER], [], 2
    while i < len(argv):
        assert argv[i].startswith("-"), argv[i]
        if argv[i] in spec["store_true"]:
            out.append((argv[i], None))
            i += 1
        else:
            out.append((argv[i], argv[i + 1]))
            i += 2
    return out


@pytest.mark.parametrize(("changes", "option", "why", "instead"), [
    ({"spec_mode": "medusa", "medusa": "ckpt/heads"}, "--medusa", "--model_type llama, mixtral",
     "use --backend torch, or train an EAGLE-3 head (specserve train-eagle3) and use --eagle3 "
     "--flow pytorch"),
    ({"spec_mode": "eagle", "eagle": "ckpt/eagle3"}, "--eagle", "Llama targets only",
     "train an EAGLE-3 head (specserve train-eagle3) and use --eagle3 --flow pytorch"),
    ({"quantize": "fp8"}, "--quantize fp8", "Qwen3 export is not verified",
     "use the PyTorch route: --flow pytorch (ModelOpt FP8)"),
])
def test_qwen3_engine_flow_refusals_name_a_route_that_serves_it(
        changes: dict[str, Any], option: str, why: str, instead: str) -> None:
    """The advice must not point at a route that refuses the request (the PyTorch
    backend has no Medusa, and serves EAGLE-3 heads only)."""
    with pytest.raises(SpecserveError) as err:
        _plan(replace(BASE, **changes))
    msg = str(err.value)
    assert msg.startswith(f"ckpt/qwen3-8b/config.json: model_type 'qwen3' with {option} is not "
                          "planned for the trtllm engine flow (TensorRT-LLM 1.2.1: ")
    assert why in msg and msg.endswith(instead)
    assert "\n" not in msg


def test_a_draft_of_an_unplanned_family_is_refused() -> None:
    with pytest.raises(SpecserveError, match="ckpt/d/config.json: model_type 'qwen2' with "
                       "--draft is not planned for trtllm"):
        _plan(replace(BASE, spec_mode="draft", draft="ckpt/d"), "qwen2")


@pytest.fixture()
def qwen3_dir(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> Path:
    return make_qwen3(tmp_path / "qwen3", tiny_ckpt.tokenizer)


@pytest.mark.parametrize("draft_family", ["qwen", "llama"])
def test_cli_dry_run_plans_a_qwen3_draft_target(qwen3_dir: Path, tiny_ckpt: TinyCheckpoint,
                                                tmp_path: Path, draft_family: str) -> None:
    """Each model through its own family's converter (the draft's model_type read by
    ``specserve build``); the tiny Llama draft shares the Qwen3 target's tokenizer."""
    draft = tiny_ckpt.draft if draft_family == "llama" else make_qwen3(
        tmp_path / "qdraft", tiny_ckpt.tokenizer, hidden_size=32, layers=1, heads=2,
        kv_heads=1, head_dim=8, seed=1)
    r = CliRunner().invoke(cli, ["build", "--model", str(qwen3_dir), "--draft", str(draft),
                                 "--backend", "trtllm", "--out", str(tmp_path / "e"),
                                 "--dry-run", "--format", "json"])
    assert r.exit_code == 0, r.output
    steps = json.loads(r.stdout)["plan"]["steps"]
    convs = [s["argv"][1] for s in steps if s["kind"] == "convert"]
    assert convs == [f"{DEFAULT_EXAMPLES_DIR}/models/core/{f}/convert_checkpoint.py"
                     for f in ("qwen", draft_family)]


def test_cli_refuses_qwen3_medusa_in_one_line(qwen3_dir: Path, tiny_ckpt: TinyCheckpoint,
                                              tmp_path: Path) -> None:
    from tests.helpers.tiny import make_medusa_heads

    vocab = json.loads((qwen3_dir / "config.json").read_text())["vocab_size"]
    heads = make_medusa_heads(tmp_path / "heads", 48, vocab)
    r = CliRunner().invoke(cli, ["build", "--model", str(qwen3_dir), "--medusa", str(heads),
                                 "--backend", "trtllm", "--out", str(tmp_path / "e"),
                                 "--dry-run"])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith("--eagle3 --flow pytorch")
    assert not (tmp_path / "e").exists()
    # each route the message names takes the request
    r = CliRunner().invoke(cli, ["build", "--model", str(qwen3_dir), "--medusa", str(heads),
                                 "--backend", "torch", "--out", str(tmp_path / "t"),
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["build", "--model", str(qwen3_dir), "--medusa", str(heads),
                                 "--flow", "pytorch", "--out", str(tmp_path / "p"),
                                 "--dry-run"])
    assert r.exit_code == 2 and "no Medusa path" in r.output  # what the old advice led to


def test_the_eagle3_route_it_names_takes_a_qwen3_target(qwen3_dir: Path, tmp_path: Path) -> None:
    """`--eagle3 --flow pytorch`, which the Qwen3 EAGLE/Medusa refusals point to, plans."""
    from tests.build.test_llmapi import make_eagle3

    t = json.loads((qwen3_dir / "config.json").read_text())
    head = make_eagle3(tmp_path / "h", t["hidden_size"], t["vocab_size"])
    r = CliRunner().invoke(cli, ["build", "--model", str(qwen3_dir), "--eagle3", str(head),
                                 "--flow", "pytorch", "--out", str(tmp_path / "e3"),
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
