"""``specserve build --flow pytorch``: the LLM-API YAML per method against TensorRT-LLM 1.2.1's
field set (``data/llmapi_fields_1.2.1.json``, read from upstream ``llm_args.py``; its ``source``
says which copy), golden YAMLs, the draft_len_schedule hazards, and bad input (one line,
exit 2, nothing written).

Regenerate goldens after a deliberate change: ``SPECSERVE_UPDATE_GOLDEN=1 pytest tests/build``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from specserve.build import llmapi, llmapi_keys, llmapi_plan
from specserve.build.builder import validate_for_route
from specserve.build.config import BuildConfig
from specserve.cli.main import cli
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint

HERE = Path(__file__).parent
FIELDS: dict[str, Any] = json.loads((HERE / "data" / "llmapi_fields_1.2.1.json").read_text())

BASE = BuildConfig(model="ckpt/llama-3.1-8b", out="engines/l3", spec_mode="eagle3",
                   eagle3="ckpt/eagle3-l3", backend="trtllm", flow="pytorch", dtype="bfloat16",
                   max_batch_size=16, max_input_len=1024, max_seq_len=4096, max_draft_len=3)
CASES: dict[str, BuildConfig] = {
    "eagle3": BASE,
    "eagle3_fp8": replace(BASE, quantize="fp8", kv_cache_dtype="fp8"),
    "draft_target": replace(BASE, spec_mode="draft", eagle3=None, draft="ckpt/llama-3.2-1b",
                            max_draft_len=4, draft_len_schedule="1:4,4:2,8:0"),
    "draft_target_tp2": replace(BASE, spec_mode="draft", eagle3=None, draft="ckpt/llama-3.2-1b",
                                max_draft_len=4, tp_size=2, kv_cache_fraction=0.8),
    "ngram": replace(BASE, spec_mode="ngram", eagle3=None, max_draft_len=4, ngram_size=3,
                     max_concurrency=8, block_reuse=True),
    "mtp": replace(BASE, model="ckpt/deepseek-v3", spec_mode="mtp", eagle3=None,
                   max_draft_len=1, tp_size=8, max_batch_size=64, kv_cache_dtype="fp8"),
}


def options(cfg: BuildConfig) -> dict[str, Any]:
    validate_for_route(cfg)
    data: dict[str, Any] = yaml.safe_load(llmapi.render_options(cfg))
    return data


def unknown_keys(opts: dict[str, Any]) -> list[str]:
    """Every key of the YAML that 1.2.1's classes do not declare, as ``where.key``."""
    bad = [k for k in opts if k not in FIELDS["TorchLlmArgs"]]
    for key, cls in (("kv_cache_config", "KvCacheConfig"),
                     ("cuda_graph_config", "CudaGraphConfig")):
        bad += [f"{key}.{k}" for k in opts.get(key, {}) if k not in FIELDS[cls]]
    spec = opts.get("speculative_config", {})
    dec = FIELDS["decoding_configs"].get(spec.get("decoding_type"))
    if dec is None:
        return [*bad, f"speculative_config.decoding_type={spec.get('decoding_type')}"]
    return bad + [f"speculative_config.{k}" for k in spec if k not in dec["fields"]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_yaml(name: str) -> None:
    text = llmapi.render_options(CASES[name])
    path = HERE / "golden" / "llmapi" / f"{name}.yaml"
    if os.environ.get("SPECSERVE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_key_in_the_pinned_field_set(name: str) -> None:
    assert unknown_keys(options(CASES[name])) == []


def test_unknown_key_is_caught() -> None:
    opts = options(BASE)
    opts["speculative_config"]["use_rejection_sampling"] = True
    opts["kv_cache_config"]["host_offload"] = True
    assert unknown_keys(opts) == ["kv_cache_config.host_offload",
                                  "speculative_config.use_rejection_sampling"]


def test_decoding_type_spellings_are_the_pinned_literals() -> None:
    for mode, name in llmapi_keys.DECODING_TYPES.items():
        assert name in FIELDS["decoding_configs"], (mode, name)
    assert llmapi_keys.DECODING_TYPES["draft"] == "Draft_Target"  # not the docs' "DraftTarget"
    assert "DraftTarget" not in FIELDS["decoding_configs"]


def test_draft_models_named_by_speculative_model_dir() -> None:
    for name in ("eagle3", "draft_target"):
        spec = options(CASES[name])["speculative_config"]
        assert spec["speculative_model_dir"] == CASES[name].source_dir
        assert "speculative_model" not in spec


def test_fp8_serves_the_modelopt_export_and_fp8_kv() -> None:
    cfg = CASES["eagle3_fp8"]
    opts = options(cfg)
    assert opts["kv_cache_config"]["dtype"] == "fp8"
    step = llmapi_plan.quantize_step(cfg)
    assert step is not None and "--qformat=fp8" in step.argv and "--export_fmt=hf" in step.argv
    assert "--kv_cache_qformat=fp8" in step.argv
    assert llmapi_plan.served_model(cfg) == os.path.join(cfg.out, llmapi_plan.FP8_EXPORT_DIR)
    assert llmapi_plan.serve_argv(cfg)[1] == llmapi_plan.served_model(cfg)


def test_modelopt_checkpoint_needs_no_step(tmp_path: Path) -> None:
    (tmp_path / "hf_quant_config.json").write_text("{}")
    cfg = replace(CASES["eagle3_fp8"], model=str(tmp_path))
    assert llmapi_plan.quantize_step(cfg) is None
    assert llmapi_plan.served_model(cfg) == str(tmp_path)


def test_schedule_keeps_lower_bound_keys_and_key_one() -> None:
    spec = options(CASES["draft_target"])["speculative_config"]
    assert spec["draft_len_schedule"] == {1: 4, 4: 2, 8: 0}
    assert spec["draft_len_schedule"][1] == spec["max_draft_len"]
    from specserve.spec.schedule import DraftSchedule

    sched = DraftSchedule.parse("1:4,4:2,8:0")  # 1.2: 4 for 1-3, 2 for 4-7, 0 from 8
    assert [sched.at(b) for b in (1, 3, 4, 7, 8, 100)] == [4, 4, 2, 2, 0, 0]


@pytest.mark.parametrize("change, message", [
    ({"draft_len_schedule": "1:3,4:2"}, "draft_len_schedule[1] == max_draft_len"),
    ({"draft_len_schedule": "1:4,4:5"}, "must be <= draft_len_schedule[1]"),
    ({"draft_len_schedule": "1:4", "max_concurrency": 4}, "mutually exclusive"),
    ({"spec_options": (("use_rejection_sampling", "true"),)}, "not in TensorRT-LLM 1.2.1"),
    ({"spec_options": (("acceptance_rate_threshold", "0.5"),)}, "#12905"),
    ({"spec_options": (("eagle_choices", "x"),)}, "not a 1.2.1 field"),
    ({"ngram_size": 3}, "only with --ngram"),
    ({"spec_mode": "medusa", "medusa": "heads", "draft": None}, "no Medusa path"),
    ({"kv_cache_fraction": 1.5}, "must be in (0, 1]"),
    ({"cuda_graph_batch_sizes": (1, 32)}, "each must be in 1..--max-batch-size"),
])
def test_refused(change: dict[str, Any], message: str) -> None:
    cfg = replace(CASES["draft_target"], **change)
    with pytest.raises(SpecserveError, match=None) as e:
        validate_for_route(cfg)
    assert message in str(e.value)


def test_eagle3_schedule_goes_two_model() -> None:
    cfg = replace(BASE, max_concurrency=8)
    spec = options(cfg)["speculative_config"]
    assert spec["eagle3_one_model"] is False and spec["max_concurrency"] == 8
    assert options(BASE)["speculative_config"]["eagle3_one_model"] is True


def test_mtp_refuses_schedule() -> None:
    with pytest.raises(SpecserveError, match="two-model Drafter paths only"):
        validate_for_route(replace(CASES["mtp"], max_concurrency=4))


def test_pass_through_options_are_pinned_fields() -> None:
    for mode, keys in llmapi_keys.SPEC_OPTIONS.items():
        fields = FIELDS["decoding_configs"][llmapi_keys.DECODING_TYPES[mode]]["fields"]
        assert set(keys) <= set(fields), mode
    later = set(llmapi_keys.LATER_KEYS)
    assert later == set(FIELDS["not_in_1.2.1"])
    for dec in FIELDS["decoding_configs"].values():
        assert not later & set(dec["fields"])


def test_engine_flow_record_config_unchanged() -> None:
    cfg = BuildConfig(model="m", out="o", spec_mode="ngram", backend="trtllm")
    assert "flow" not in cfg.to_dict() and "eagle3" not in cfg.to_dict()
    assert BuildConfig.from_dict(cfg.to_dict()) == cfg


# --- through the CLI, on the tiny checkpoint -------------------------------------------------

def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["build", *args], catch_exceptions=False)


def make_eagle3(root: Path, hidden: int, vocab: int, draft_vocab: int | None = None,
                d2t: bool = True, arch: str = "LlamaForCausalLMEagle3") -> Path:
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    cfg: dict[str, Any] = {"architectures": [arch], "hidden_size": hidden, "vocab_size": vocab,
                           "num_hidden_layers": 1}
    dv = draft_vocab or vocab
    if draft_vocab is not None:
        cfg["draft_vocab_size"] = draft_vocab
    (root / "config.json").write_text(json.dumps(cfg))
    tensors = {"fc.weight": torch.zeros(hidden, 3 * hidden), "lm_head.weight":
               torch.zeros(dv, hidden)}
    if d2t:
        tensors["d2t"] = torch.zeros(dv, dtype=torch.int64)
    save_file(tensors, str(root / "model.safetensors"))
    return root


def _target(c: TinyCheckpoint) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((c.target / "config.json").read_text())
    return cfg


def test_dry_run_prints_yaml_and_commands(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    t = _target(ckpt)
    head = make_eagle3(tmp_path / "eagle3", t["hidden_size"], t["vocab_size"], 64)
    out = tmp_path / "engines" / "e3"
    result = run("--model", str(ckpt.target), "--eagle3", str(head), "--flow", "pytorch",
                 "--out", str(out), "--dry-run")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "engines").exists()
    for text in ("decoding_type: Eagle\n", "speculative_model_dir:", "trtllm-serve ",
                 "--extra_llm_api_options", "trtllm-bench --model", "throughput",
                 "trtllm-bench --model"):
        assert text in result.output, text


def test_build_writes_yaml_and_flow(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "ng"
    result = run("--model", str(ckpt.target), "--ngram", "--flow", "pytorch", "--tp", "2",
                 "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "build_config.json").read_text())
    assert rec["flow"] == "pytorch" and rec["spec_mode"] == "ngram"
    opts = yaml.safe_load((out / llmapi.LLMAPI_FILE).read_text())
    assert opts["speculative_config"]["decoding_type"] == "NGram"
    assert opts["tensor_parallel_size"] == 2 and unknown_keys(opts) == []
    from specserve.engine_record import read_engine_record

    assert read_engine_record(out).get("flow") == "pytorch"


def test_engine_flow_records_flow_engine(ckpt: TinyCheckpoint) -> None:
    from specserve.build.record import make_record

    cfg = BuildConfig(model=str(ckpt.target), out="o", spec_mode="ngram", backend="trtllm")
    assert make_record(cfg, [])["flow"] == "engine"


def _bad_hidden(c: TinyCheckpoint, tmp: Path) -> list[str]:
    t = _target(c)
    return ["--eagle3", str(make_eagle3(tmp / "h", t["hidden_size"] * 2, t["vocab_size"]))]


def _not_eagle3(c: TinyCheckpoint, tmp: Path) -> list[str]:
    t = _target(c)
    return ["--eagle3", str(make_eagle3(tmp / "h", t["hidden_size"], t["vocab_size"],
                                        arch="LlamaForCausalLM"))]


def _no_d2t(c: TinyCheckpoint, tmp: Path) -> list[str]:
    t = _target(c)
    return ["--eagle3", str(make_eagle3(tmp / "h", t["hidden_size"], t["vocab_size"], 64,
                                        d2t=False))]


def _bad_draft_vocab(c: TinyCheckpoint, tmp: Path) -> list[str]:
    t = _target(c)
    return ["--eagle3", str(make_eagle3(tmp / "h", t["hidden_size"], t["vocab_size"],
                                        t["vocab_size"] + 1))]


def _draft_tokenizer(c: TinyCheckpoint, tmp: Path) -> list[str]:
    """A draft whose tokenizer differs (one vocabulary entry renamed)."""
    draft = tmp / "other-tokenizer"
    shutil.copytree(c.draft, draft)
    tj = json.loads((draft / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    first = next(iter(vocab))
    vocab["zz" + first] = vocab.pop(first)
    (draft / "tokenizer.json").write_text(json.dumps(tj))
    return ["--draft", str(draft)]


@pytest.mark.parametrize("make, message", [
    (_bad_hidden, "hidden_size"),
    (_not_eagle3, "not an EAGLE-3 head"),
    (_no_d2t, "no 'd2t'"),
    (_bad_draft_vocab, "draft_vocab_size"),
    (_draft_tokenizer, "vocab differ from the target's tokenizer"),
    (lambda c, t: ["--mtp"], "needs MTP layers"),
    (lambda c, t: ["--ngram", "--tp", "3"], "not divisible by --tp 3"),
    (lambda c, t: ["--medusa", str(c.medusa)], "no Medusa path"),
    (lambda c, t: ["--eagle", str(c.medusa)], "EAGLE-1/2"),
    (lambda c, t: ["--ngram", "--spec-option", "use_rejection_sampling=true"],
     "not in TensorRT-LLM 1.2.1"),
])
def test_bad_input_one_line_exit_2_nothing_written(ckpt: TinyCheckpoint, tmp_path: Path,
                                                   make: Any, message: str) -> None:
    args = make(ckpt, tmp_path)
    out = tmp_path / "engines" / "bad"
    result = CliRunner().invoke(cli, ["build", "--model", str(ckpt.target), *args, "--flow",
                                      "pytorch", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "engines").exists()


def test_mtp_with_layers(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    cfg_path = ckpt.target / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_nextn_predict_layers"] = 1
    cfg_path.write_text(json.dumps(cfg))
    result = run("--model", str(ckpt.target), "--mtp", "--flow", "pytorch", "--out",
                 str(tmp_path / "m"), "--dry-run", "--format", "json")
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)["llm_api"]["options"]["speculative_config"]
    assert spec == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    shutil.rmtree(tmp_path / "m", ignore_errors=True)


SUPPORTED: dict[str, Any] = json.loads((HERE / "data" / "llmapi_supported_models.json")
                                       .read_text())


def _as_deepseek_v3(ckpt: TinyCheckpoint, tmp_path: Path) -> Path:
    """A DeepSeek-V3 config.json (data/llmapi_supported_models.json) over the tiny weights."""
    target = tmp_path / "deepseek-v3"
    shutil.copytree(ckpt.target, target)
    cfg = {k: v for k, v in SUPPORTED["deepseek_v3_config"].items() if k != "source"}
    (target / "config.json").write_text(json.dumps(cfg))
    return target


def test_pytorch_route_plans_mtp_for_deepseek_v3(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """--mtp is the DeepSeek-V3 path; the engine flow's family check must not run here."""
    assert "DeepseekV3ForCausalLM" in SUPPORTED["mtp_yes"]
    target = _as_deepseek_v3(ckpt, tmp_path)
    result = run("--model", str(target), "--mtp", "--flow", "pytorch", "--tp", "8", "--out",
                 str(tmp_path / "m"), "--dry-run", "--format", "json")
    assert result.exit_code == 0, result.output
    opts = json.loads(result.stdout)["llm_api"]["options"]
    assert opts["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    assert opts["tensor_parallel_size"] == 8


@pytest.mark.parametrize("arch", SUPPORTED["pytorch_backend_architectures"])
def test_every_llmapi_architecture_passes_the_route_checks(tmp_path: Path, arch: str) -> None:
    from specserve.build.validate import validate_target

    cfg = {"architectures": [arch], "model_type": arch.lower(), "hidden_size": 64,
           "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert validate_target(tmp_path, any_architecture=True)["hidden_size"] == 64


def test_route_keeps_its_own_checks(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """TP must divide the heads, and --mtp needs MTP layers, on any architecture."""
    target = _as_deepseek_v3(ckpt, tmp_path)
    result = run("--model", str(target), "--mtp", "--flow", "pytorch", "--tp", "3", "--out",
                 str(tmp_path / "m"), "--dry-run")
    assert result.exit_code == 2 and "not divisible by --tp 3" in result.output
    cfg = json.loads((target / "config.json").read_text())
    del cfg["num_nextn_predict_layers"]
    (target / "config.json").write_text(json.dumps(cfg))
    result = run("--model", str(target), "--mtp", "--flow", "pytorch", "--out",
                 str(tmp_path / "m"), "--dry-run")
    assert result.exit_code == 2 and "needs MTP layers" in result.output


VOCAB: dict[str, Any] = json.loads((HERE / "data" / "vocab_pairs.json").read_text())


def _padded_draft(ckpt: TinyCheckpoint, tmp_path: Path) -> Path:
    """The tiny draft with its config.json vocab_size padded as Qwen2.5-0.5B's is against
    7B's (data/vocab_pairs.json), the tokenizer unchanged."""
    draft = tmp_path / "padded-draft"
    shutil.copytree(ckpt.draft, draft)
    cfg = json.loads((draft / "config.json").read_text())
    pair = VOCAB["qwen2.5"]
    pad = pair["target_vocab_size"] - pair["draft_vocab_size"]
    cfg["vocab_size"] += pad
    (draft / "config.json").write_text(json.dumps(cfg))
    import torch
    from safetensors.torch import load_file, save_file

    for f in draft.glob("*.safetensors"):  # padded rows, as a padded checkpoint has
        sd = load_file(str(f))
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            if k in sd:
                sd[k] = torch.cat([sd[k], sd[k].new_zeros(pad, sd[k].shape[1])])
        save_file(sd, str(f))
    return draft


def test_same_tokenizer_padded_widths_on_the_pytorch_route(ckpt: TinyCheckpoint,
                                                           tmp_path: Path) -> None:
    """Acceptance by token ids needs the tokenizer, not equal vocab_size."""
    draft = _padded_draft(ckpt, tmp_path)
    result = run("--model", str(ckpt.target), "--draft", str(draft), "--flow", "pytorch",
                 "--out", str(tmp_path / "d"), "--dry-run")
    assert result.exit_code == 0, result.output


def test_engine_flow_accepts_a_padded_draft_by_token_ids(ckpt: TinyCheckpoint,
                                                         tmp_path: Path) -> None:
    # as upstream's tensorrt_llm_bls with use_draft_logits false (tests/build/test_padded_draft.py)
    draft = _padded_draft(ckpt, tmp_path)
    result = CliRunner().invoke(cli, ["build", "--model", str(ckpt.target), "--draft",
                                      str(draft), "--backend", "trtllm", "--out",
                                      str(tmp_path / "e"), "--dry-run"])
    assert result.exit_code == 0 and "accepted by token ids" in result.output, result.output


BENCH: dict[str, Any] = json.loads((HERE / "data" / "trtllm_bench_prepare_dataset.json")
                                   .read_text())


def test_bench_dataset_from_trtllm_bench_prepare_dataset() -> None:
    """The dataset comes from the CLI subcommand, with its own option names
    (data/trtllm_bench_prepare_dataset.json), not from a script path in the image."""
    import shlex

    prepare, bench = (shlex.split(line) for line in llmapi_plan.bench_commands(CASES["eagle3"]))
    assert prepare[0] == "trtllm-bench" and "prepare-dataset" in prepare
    group = prepare.index("prepare-dataset")
    sub = prepare.index(BENCH["synthetic_command"])
    assert prepare[1:group] == ["--model", llmapi_plan.served_model(CASES["eagle3"])]
    group_opts = {a for a in prepare[group + 1:sub] if a.startswith("--")}
    sub_opts = {a for a in prepare[sub + 1:] if a.startswith("--")}
    assert group_opts <= set(BENCH["group_options"]) and sub_opts == set(BENCH[
        "synthetic_options"])
    dataset = prepare[prepare.index("--output") + 1]
    assert bench[bench.index("--dataset") + 1] == dataset
    assert not any(a.endswith("prepare_dataset.py") for a in prepare)
