"""``specserve doctor``: the healthy pair is clean, and each of the
eight planted mispairings is found with exactly one error/warning line of its own code.

The healthy pair is the tiny target with a copy of itself as the draft (acceptance 1 under
greedy verification) and a chat template on both sides; each plant changes one thing in it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.checkpoint import TensorInfo
from specserve.cli.main import cli
from specserve.doctor.checks import check_precision, check_sampler, check_shapes, quantization
from specserve.doctor.run import DoctorConfig, doctor
from specserve.doctor.sides import Kind, Side
from tests.helpers.tiny import TinyCheckpoint, make_llama, make_medusa_heads

TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
PROBE = {"probe_tokens": 16, "threads": 1}


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def _with_template(d: Path) -> Path:
    _edit_json(d / "tokenizer_config.json", chat_template=TEMPLATE)
    return d


@pytest.fixture()
def pair(writable_ckpt: TinyCheckpoint) -> tuple[Path, Path]:
    """(target, draft): the tiny target and a copy of it as the draft, both with a template."""
    target = _with_template(writable_ckpt.target)
    draft = writable_ckpt.root / "selfdraft"
    shutil.copytree(target, draft)
    return target, draft


def problems(report: dict[str, Any]) -> list[str]:
    """The codes of the error and warning findings."""
    return [f["code"] for f in report["findings"] if f["severity"] in ("error", "warning")]


def run(target: Path, probe: bool = True, **kw: Any) -> dict[str, Any]:
    return doctor(DoctorConfig(model=str(target), gpu="h200", probe=probe, **PROBE, **kw))


def test_healthy_pair_is_clean_with_acceptance_near_one(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    r = run(target, draft=str(draft))
    assert problems(r) == [] and r["exit_code"] == 0
    assert r["probe"]["status"] == "ran" and r["probe"]["acceptance_rate"] > 0.9
    codes = {f["code"] for f in r["findings"]}
    assert {"precision", "kv-budget", "acceptance-probe"} <= codes


def test_different_tokenizer_with_the_same_vocab_size(pair: tuple[Path, Path]) -> None:
    """Two tokens' ids swapped: same size and same strings, another mapping."""
    target, draft = pair
    tj = draft / "tokenizer.json"
    data = json.loads(tj.read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    tj.write_text(json.dumps(data))
    r = run(target, draft=str(draft))
    assert problems(r) == ["tokenizer-mismatch"]
    assert "same size (260)" in r["findings"][0]["message"]
    assert r["exit_code"] == 1


def test_fp8_draft_for_a_bf16_target(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    _edit_json(target / "config.json", torch_dtype="bfloat16")
    _edit_json(draft / "config.json", torch_dtype="bfloat16", quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"})
    r = run(target, draft=str(draft))
    assert problems(r) == ["precision-mismatch"]
    assert "fp8" in next(f["message"] for f in r["findings"] if f["code"] == "precision-mismatch")


def test_missing_chat_template(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    _edit_json(target / "tokenizer_config.json", chat_template=None)
    for name in ("chat_template.jinja", "chat_template.json"):  # the demo tokenizer ships one
        (target / name).unlink(missing_ok=True)
    assert problems(run(target, draft=str(draft))) == ["chat-template-missing"]


def test_sampler_default_that_differs(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    _edit_json(draft / "generation_config.json", do_sample=True, temperature=0.7)
    r = run(target, draft=str(draft))
    assert problems(r) == ["sampler-mismatch"]
    msg = next(f["message"] for f in r["findings"] if f["code"] == "sampler-mismatch")
    assert "temperature 0.7 vs 1.0" in msg


def test_draft_context_shorter_than_the_targets(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    _edit_json(draft / "config.json", max_position_embeddings=256)
    assert problems(run(target, draft=str(draft))) == ["draft-context-short"]


def test_head_trained_for_another_hidden_size(pair: tuple[Path, Path]) -> None:
    target, _ = pair
    heads = make_medusa_heads(target.parent / "medusa32", hidden_size=32, vocab_size=260)
    r = run(target, medusa=str(heads))
    assert problems(r) == ["head-hidden-size"]
    assert r["probe"]["status"] == "skipped"  # the heads do not load onto this target


def test_draft_with_random_weights_collapses_acceptance(pair: tuple[Path, Path]) -> None:
    """The target's shape, re-initialised: every static check passes, the probe does not."""
    target, _ = pair
    random = make_llama(target.parent / "random", target, seed=123)
    r = run(target, draft=str(random))
    assert problems(r) == ["acceptance-collapse"]
    assert r["probe"]["acceptance_rate"] < 0.1 and r["exit_code"] == 1


def test_kv_budget_that_cannot_hold_the_draft(pair: tuple[Path, Path]) -> None:
    """A GPU sized between what the target alone needs and what target + draft need."""
    target, draft = pair
    m = run(target, probe=False, draft=str(draft), batch=4)["memory"]

    def need(spec: str, draft_weights: int) -> int:
        side = m[spec]
        return (m["target"]["weight_bytes"] + draft_weights + side["workspace_bytes"]
                + m["needed_tokens"] * side["kv_bytes_per_token"])

    alone, both = need("without_draft", 0), need("with_draft", m["draft"]["weight_bytes"])
    assert alone < both
    gib = (alone + both) / 2 / 0.9 / (1 << 30)
    r = run(target, probe=False, draft=str(draft), batch=4, gpu_memory_gib=gib)
    assert problems(r) == ["kv-budget-exceeded"]
    assert "fits without the draft" in r["findings"][0]["message"]
    # the same pair on the real H200 fits
    assert problems(run(target, probe=False, draft=str(draft), batch=4)) == []


def test_engine_directory_supplies_paths_and_sizes(pair: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """A torch engine's build_config.json: target/ and draft/ from it, and its max_seq_len
    (1024, past the draft's 512 positions), batch and draft length."""
    target, draft = pair
    eng = tmp_path / "engine"
    shutil.copytree(target, eng / "target")
    shutil.copytree(draft, eng / "draft")
    (eng / "build_config.json").write_text(json.dumps({
        "backend": "torch", "spec_mode": "draft", "max_batch_size": 8, "max_input_len": 512,
        "max_seq_len": 1024, "max_draft_len": 3, "medusa_choices": None, "dtype": "float32",
        "quantize": None, "kv_cache_dtype": None, "tp_size": 1, "pp_size": 1,
        "world_size": 1}))
    r = doctor(DoctorConfig(engine=str(eng), probe=False))
    assert r["inputs"]["batch"] == 8 and r["inputs"]["draft_len"] == 3
    assert r["inputs"]["context"] == 1024 and r["memory"]["verify_tokens"] == 4
    assert problems(r) == ["draft-context-short"]


def test_cli_lines_json_and_exit_codes(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    runner = CliRunner()
    base = ["doctor", "--model", str(target), "--threads", "1", "--probe-tokens", "16"]
    ok = runner.invoke(cli, [*base, "--draft", str(draft)])
    assert ok.exit_code == 0, ok.output
    lines = ok.output.strip().splitlines()
    assert all(line.split(":")[0] == "info" for line in lines[:-1])
    assert lines[-1] == "doctor: 0 error(s), 0 warning(s) (exit 0)"
    _edit_json(draft / "config.json", max_position_embeddings=256)
    warned = runner.invoke(cli, [*base, "--draft", str(draft), "--no-probe", "--format", "json"])
    assert warned.exit_code == 0
    report = json.loads(warned.output)
    assert problems(report) == ["draft-context-short"] and report["probe"] == {"status": "off"}
    strict = runner.invoke(cli, [*base, "--draft", str(draft), "--no-probe", "--strict"])
    assert strict.exit_code == 1
    assert "warning: draft-context-short: " in strict.output
    bad = runner.invoke(cli, ["doctor", "--model", str(target)])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "error: doctor checks a pairing: pass --draft, --medusa or --eagle3"]


def test_special_token_ids_that_differ(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    _edit_json(draft / "generation_config.json", eos_token_id=[1, 2])
    r = run(target, probe=False, draft=str(draft))
    assert problems(r) == ["special-tokens-mismatch"]
    assert "eos_token_id (1, 2) vs (2,)" in r["findings"][0]["message"]


def test_draft_vocab_of_another_width(pair: tuple[Path, Path]) -> None:
    # the same tokenizer, embeddings padded to another width (Qwen2.5-0.5B for Qwen2.5-7B):
    # served by token-id acceptance, so a warning, not an error
    target, draft = pair
    _edit_json(draft / "config.json", vocab_size=300)
    r = run(target, probe=False, draft=str(draft))
    assert problems(r) == ["vocab-mismatch"] and r["exit_code"] == 0
    (f,) = [f for f in r["findings"] if f["code"] == "vocab-mismatch"]
    assert f["severity"] == "warning" and "accepted by token ids" in f["message"]


def test_a_head_of_another_vocab_width_is_an_error() -> None:
    target = _side("target", config={"hidden_size": 64, "vocab_size": 260})
    draft = _side("draft", config={"vocab_size": 300})
    (f,) = check_shapes(target, draft)  # the tokenizers not known to match
    assert (f.severity, f.code) == ("error", "vocab-mismatch")


def _side(kind: Kind, **kw: Any) -> Side:
    return Side(kind=kind, path=Path(kind), config=kw.pop("config", {}), **kw)


def test_quantization_read_from_each_source() -> None:
    f8 = {"w": TensorInfo("F8_E4M3", (2, 2), (0, 4)), "s": TensorInfo("F32", (2,), (4, 12))}
    assert quantization(_side("draft", config={"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3"}})) == "fp8:e4m3"
    assert quantization(_side("draft", quant_config={"quantization": {
        "quant_algo": "NVFP4"}})) == "modelopt:nvfp4"
    assert quantization(_side("draft", config={"specserve_quantization": {
        "quant_algo": "FP8_PER_CHANNEL"}})) == "specserve:fp8_per_channel"
    assert quantization(_side("draft", tensors=f8)) == "stored:fp8"
    assert quantization(_side("draft", tensors={"w": f8["s"]})) is None
    # an NVFP4 target with an unquantized head is a mismatch too (vLLM #41789)
    codes = [f.code for f in check_precision(
        _side("target", quant_config={"quantization": {"quant_algo": "NVFP4"}}),
        _side("eagle3", config={"torch_dtype": "bfloat16"}))]
    assert codes == ["precision", "precision-mismatch"]
    # the same format recorded two ways is no mismatch
    same = check_precision(_side("target", quant_config={"quantization": {"quant_algo": "FP8"}}),
                           _side("draft", tensors=f8))
    assert [f.code for f in same] == ["precision"]


def test_target_sampler_defaults_and_penalty() -> None:
    target = _side("target", generation={"do_sample": True, "temperature": 0.6,
                                         "repetition_penalty": 1.1})
    found = check_sampler(target, _side("eagle3"))
    assert [(f.severity, f.code) for f in found] == [("info", "sampler-defaults"),
                                                     ("warning", "sampler-penalty")]
    assert "temperature=0.6" in found[0].message


def test_eagle3_head_for_another_hidden_size() -> None:
    target = _side("target", config={"hidden_size": 64, "vocab_size": 260})
    head = _side("eagle3", config={"hidden_size": 64, "target_hidden_size": 4096,
                                   "vocab_size": 260})
    assert [f.code for f in check_shapes(target, head)] == ["head-hidden-size"]
    fine = _side("eagle3", config={"hidden_size": 32, "target_hidden_size": 64,
                                   "vocab_size": 260})
    assert check_shapes(target, fine) == []


def test_eagle3_head_end_to_end(pair: tuple[Path, Path]) -> None:
    """A random EAGLE-3 head for the target: read (weights, one layer of KV), loaded and
    probed by the reference engine, where its acceptance collapses."""
    import torch

    from specserve.runtime.eagle3 import Eagle3Config, Eagle3Head
    from specserve.runtime.eagle3_dir import save_eagle3
    from specserve.runtime.model_config import ModelConfig

    target, _ = pair
    cfg = ModelConfig.from_hf(json.loads((target / "config.json").read_text()))
    head = Eagle3Head(Eagle3Config.for_target(cfg, cfg.vocab_size))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    d = save_eagle3(head, target.parent / "eagle3")
    r = run(target, eagle3=str(d))
    assert problems(r) == ["acceptance-collapse"] and r["probe"]["draft_tokens"] > 0
    m = r["memory"]
    assert m["draft"]["weight_bytes"] == (d / "model.safetensors").stat().st_size
    assert m["draft"]["kv_bytes_per_token"] == 2 * 1 * cfg.num_kv_heads * cfg.head_dim * 4
