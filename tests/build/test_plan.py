"""TensorRT-LLM 1.2.1 plans: golden JSON per scenario, and every flag of every argv checked
against the pinned release's flag sets (test data typed by hand from TensorRT-LLM 1.2.1's sources).

Regenerate goldens after a deliberate change: ``SPECSERVE_UPDATE_GOLDEN=1 pytest tests/build``
(then review the diff).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specserve.build.config import BuildConfig, resolve
from specserve.build.plan import BuildPlan, render_text
from specserve.build.trtllm import (
    DEFAULT_EXAMPLES_DIR,
    TRTLLM_VERSION,
    PlanInputs,
    make_trtllm_plan,
)
from specserve.errors import SpecserveError

HERE = Path(__file__).parent
FLAGS = json.loads((HERE / "data" / "trtllm_1.2.1_flags.json").read_text())
TARGET_CFG = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192,
              "model_type": "llama"}
BASE = BuildConfig(model="ckpt/llama-3-8b", out="engines/demo", spec_mode="medusa",
                   medusa="ckpt/medusa-heads", backend="trtllm", max_batch_size=16,
                   max_input_len=2048, max_seq_len=4096)
SCENARIOS: dict[str, BuildConfig] = {
    "medusa_fp16": BASE,
    "medusa_fp8_kv_fp8": replace(BASE, quantize="fp8", kv_cache_dtype="fp8"),
    "draft_target": replace(BASE, spec_mode="draft", medusa=None, draft="ckpt/llama-3.2-1b",
                            max_draft_len=5),
    "eagle": replace(BASE, spec_mode="eagle", medusa=None, eagle="ckpt/eagle-llama3-8b"),
    "medusa_tp2": replace(BASE, tp_size=2),
    "ngram": replace(BASE, spec_mode="ngram", medusa=None),
    "lookahead": replace(BASE, spec_mode="lookahead", medusa=None, lookahead="7,7,7"),
}


def plan_for(cfg: BuildConfig) -> BuildPlan:
    resolved = resolve(cfg, TARGET_CFG, num_medusa_heads=4 if cfg.spec_mode == "medusa" else None)
    return make_trtllm_plan(resolved, PlanInputs("llama", 4, 1, DEFAULT_EXAMPLES_DIR))


def tool_of(argv: tuple[str, ...]) -> str:
    if argv[0] == "trtllm-build":
        return "trtllm-build"
    assert argv[0] == "python3"
    prefix = DEFAULT_EXAMPLES_DIR + "/"
    assert argv[1].startswith(prefix)
    return "examples/" + argv[1][len(prefix):]


def flag_values(argv: tuple[str, ...], tool: str) -> list[tuple[str, str | None]]:
    """(flag, value) pairs; store_true flags have None."""
    spec, i = FLAGS[tool], 1 if tool == "trtllm-build" else 2
    out: list[tuple[str, str | None]] = []
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("-"), f"{tool}: positional {flag!r} where a flag was expected"
        if flag in spec["store_true"]:
            out.append((flag, None))
            i += 1
        else:
            out.append((flag, argv[i + 1]))
            i += 2
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_plan(name: str) -> None:
    got = plan_for(SCENARIOS[name]).to_dict()
    path = HERE / "golden" / f"plan_{name}.json"
    if os.environ.get("SPECSERVE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_flag_belongs_to_the_pinned_release(name: str) -> None:
    for step in plan_for(SCENARIOS[name]).steps:
        tool = tool_of(step.argv)
        spec = FLAGS[tool]
        pairs = flag_values(step.argv, tool)
        flags = [f for f, _ in pairs]
        assert len(flags) == len(set(flags)), f"{step.name}: a flag is repeated"
        for flag, value in pairs:
            assert flag in spec["flags"], f"{step.name}: {flag} is not a {tool} flag at 1.2.1"
            assert flag not in spec.get("never_pass", []), f"{step.name}: {flag} must not be used"
            if flag in spec.get("choices", {}):
                assert value in spec["choices"][flag], f"{step.name}: {flag} {value}"


def _argv(plan: BuildPlan, kind_or_name: str) -> dict[str, str | None]:
    (step,) = [s for s in plan.steps if kind_or_name in s.name]
    return dict(flag_values(step.argv, tool_of(step.argv)))


def test_medusa_facts() -> None:
    plan = plan_for(BASE)
    conv, build = _argv(plan, "convert target"), _argv(plan, "build target")
    n = len(resolve(BASE, TARGET_CFG, 4).medusa_choices or ())
    assert (conv["--num_medusa_heads"], conv["--num_medusa_layers"]) == ("4", "1")
    assert conv["--max_medusa_token_len"] == build["--max_draft_len"] == str(n) == "63"
    assert build["--speculative_decoding_mode"] == "medusa"


def test_medusa_fp8_facts() -> None:
    plan = plan_for(SCENARIOS["medusa_fp8_kv_fp8"])
    q = _argv(plan, "quantize target")
    assert (q["--qformat"], q["--kv_cache_dtype"]) == ("fp8", "fp8")
    assert q["--medusa_model_dir"] == "ckpt/medusa-heads" and q["--num_medusa_heads"] == "4"
    assert "--quant_medusa_head" not in q


def test_draft_target_facts() -> None:
    plan = plan_for(SCENARIOS["draft_target"])
    target, draft = _argv(plan, "build target"), _argv(plan, "build draft")
    assert target["--speculative_decoding_mode"] == "draft_tokens_external"
    assert target["--max_draft_len"] == "5"
    assert target["--use_paged_context_fmha"] == draft["--use_paged_context_fmha"] == "enable"
    assert "--gather_generation_logits" in draft and "--speculative_decoding_mode" not in draft
    assert len(plan.steps) == 4


def test_eagle_and_tp2_facts() -> None:
    eagle = plan_for(SCENARIOS["eagle"])
    assert _argv(eagle, "build target")["--speculative_decoding_mode"] == "eagle"
    conv = _argv(eagle, "convert target")
    assert conv["--eagle_model_dir"] == "ckpt/eagle-llama3-8b" and "--pp_size" not in conv
    tp2 = plan_for(SCENARIOS["medusa_tp2"])
    assert tp2.world_size == 2 and _argv(tp2, "convert target")["--tp_size"] == "2"
    assert _argv(tp2, "build target")["--workers"] == "2"


def test_pin_is_recorded_and_rendered() -> None:
    plan = plan_for(BASE)
    assert plan.pin["tensorrt_llm"] == TRTLLM_VERSION == "1.2.1"
    text = render_text(plan)
    assert "tensorrt_llm=1.2.1" in text and "trtllm-build --checkpoint_dir" in text


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"spec_mode": "eagle", "medusa": None, "eagle": "e", "pp_size": 2}, "EAGLE conversion"),
     ({"kv_cache_dtype": "fp8"}, "needs --quantize fp8"),
     ({"spec_mode": "eagle", "medusa": None, "eagle": "e", "max_batch_size": 513}, "at most 512"),
     ({"max_input_len": 4096}, "must be smaller than --max-seq-len"),
     ({"medusa_choices": ((0,), (0, 0)), "max_draft_len": 1}, "tree has 2 nodes")],
)
def test_invalid_configs(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(SpecserveError, match=match):
        plan_for(replace(BASE, **changes))


@pytest.mark.parametrize(("changes", "refused"), [
    ({"tp_size": 2}, True), ({"pp_size": 2}, True), ({}, False),
    ({"tp_size": 2, "quantize": "fp8"}, False),  # quantize.py (ModelOpt) shards the base model
])
def test_qwen2_medusa_needs_one_rank(changes: dict[str, Any], refused: bool) -> None:
    """examples/medusa/convert_checkpoint.py, qwen2 branch: QWenForCausalLM.from_hugging_face(
    args.model_dir, args.dtype) with no mapping, its named_parameters() saved unsplit per rank."""
    cfg = resolve(replace(BASE, **changes), {**TARGET_CFG, "model_type": "qwen2"}, 4)
    inputs = PlanInputs("qwen2", 4, 1, DEFAULT_EXAMPLES_DIR)
    if not refused:
        make_trtllm_plan(cfg, inputs)
        return
    with pytest.raises(SpecserveError, match=r"^ckpt/llama-3-8b/config.json: model_type 'qwen2' "
                       r"with --medusa and --tp \d --pp \d: .* does not shard a Qwen2 base "
                       r"model .*; use --tp 1 --pp 1$"):
        make_trtllm_plan(cfg, inputs)
    make_trtllm_plan(cfg, PlanInputs("llama", 4, 1, DEFAULT_EXAMPLES_DIR))  # llama is sharded


def test_eagle_below_the_default_tree_notes_eagle_choices() -> None:
    short = plan_for(replace(SCENARIOS["eagle"], max_draft_len=20))
    assert any("eagle_choices to its first 20 nodes" in n for n in short.notes)
    assert _argv(short, "convert target")["--max_draft_len"] == "20"
    assert not any("eagle_choices" in n for n in plan_for(SCENARIOS["eagle"]).notes)


def test_two_model_plans_note_the_serving_recipe() -> None:
    draft = " ".join(plan_for(SCENARIOS["draft_target"]).notes)
    for fact in ("non-decoupled", "KV reuse", "0.5 each", "TRTLLM_ORCHESTRATOR=1"):
        assert fact in draft, fact
    ngram = " ".join(plan_for(SCENARIOS["ngram"]).notes)
    assert "non-decoupled tensorrt_llm with KV reuse" in ngram and "draft_input_ids" in ngram
