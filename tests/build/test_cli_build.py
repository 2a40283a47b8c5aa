"""``specserve build`` through the CLI: dry-run plans, the Medusa brace form, and bad inputs
(each one line, exit code 2, nothing left on disk)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from specserve.cli.main import cli
from tests.helpers.tiny import TinyCheckpoint


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["build", *args], catch_exceptions=False)


def _json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _step(plan: dict[str, Any], name: str) -> list[str]:
    (step,) = [s for s in plan["steps"] if name in s["name"]]
    argv: list[str] = step["argv"]
    return argv


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_help_has_examples() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in ("--medusa", "--dry-run", "Examples:", "specserve build --model"):
        assert text in result.output


def test_dry_run_trtllm_touches_nothing(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "engines" / "x"
    data = _json(run("--model", str(tiny_ckpt.target), "--medusa", str(tiny_ckpt.medusa),
                     "--backend", "trtllm", "--quantize", "fp8", "--kv-cache-dtype", "fp8",
                     "--out", str(out), "--dry-run", "--format", "json"))
    assert not (tmp_path / "engines").exists()
    q = _step(data["plan"], "quantize target")
    assert _after(q, "--qformat") == "fp8" and _after(q, "--num_medusa_heads") == "4"
    assert data["plan"]["world_size"] == 1 and data["config"]["quantize"] == "fp8"


def test_dry_run_text(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    result = run("--model", str(tiny_ckpt.target), "--draft", str(tiny_ckpt.draft),
                 "--backend", "trtllm", "--out", str(tmp_path / "e"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "draft_tokens_external" in result.output and "[4/4] build draft engine" in result.output


@pytest.mark.parametrize("form", ["brace", "list", "file"])
def test_medusa_choices_forms_set_max_draft_len(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                                form: str) -> None:
    brace = "{0}, {0, 0}, {1}, {0, 1}, {0, 0, 0}"
    value = {"brace": brace, "list": "[[0], [0, 0], [1], [0, 1], [0, 0, 0]]"}.get(form)
    if value is None:
        (tmp_path / "tree.txt").write_text(brace + "\n")
        value = str(tmp_path / "tree.txt")
    data = _json(run("--model", str(tiny_ckpt.target), "--medusa", str(tiny_ckpt.medusa),
                     "--backend", "trtllm", "--medusa-choices", value, "--out",
                     str(tmp_path / "e"), "--dry-run", "--format", "json"))
    assert data["config"]["max_draft_len"] == 5
    assert data["config"]["medusa_choices"] == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    assert _after(_step(data["plan"], "convert target"), "--max_medusa_token_len") == "5"
    assert _after(_step(data["plan"], "build target"), "--max_draft_len") == "5"


def _corrupt(ckpt: TinyCheckpoint, what: str) -> list[str]:
    """Break one input; return the extra CLI args of the case."""
    if what == "arch":
        p = ckpt.target / "config.json"
        p.write_text(p.read_text().replace("LlamaForCausalLM", "GPT2LMHeadModel"))
    elif what == "qwen2":
        p = ckpt.target / "config.json"
        cfg = json.loads(p.read_text())
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
        p.write_text(json.dumps(cfg))
        return ["--ngram", "--backend", "trtllm", "--dry-run"]
    elif what == "qwen2_medusa":
        p = ckpt.target / "config.json"
        cfg = json.loads(p.read_text())
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
        p.write_text(json.dumps(cfg))
        return ["--medusa", str(ckpt.medusa), "--backend", "trtllm", "--dry-run"]
    elif what == "eagle_pt":
        import torch

        eagle = ckpt.root / "eagle"
        eagle.mkdir()
        target = json.loads((ckpt.target / "config.json").read_text())
        (eagle / "config.json").write_text(json.dumps(
            {k: target[k] for k in ("hidden_size", "vocab_size")}))
        torch.save({"fc.weight": torch.zeros(2, 2)}, eagle / "pytorch_model.pt")
        return ["--eagle", str(eagle), "--backend", "trtllm", "--dry-run"]
    elif what == "truncated":
        f = ckpt.target / "model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])
    elif what == "heads_hidden":
        from tests.helpers.tiny import make_medusa_heads

        vocab = json.loads((ckpt.target / "config.json").read_text())["vocab_size"]
        make_medusa_heads(ckpt.medusa, 32, vocab)
    elif what == "tokenizer":
        p = ckpt.draft / "tokenizer_config.json"
        cfg = json.loads(p.read_text())
        cfg["eos_token"] = "<unk>"
        p.write_text(json.dumps(cfg))
        return ["--draft", str(ckpt.draft)]
    return ["--medusa", str(ckpt.medusa)]


CASES = [
    ("arch", [], "target/config.json: architecture 'GPT2LMHeadModel' is not supported"),
    ("truncated", [], "target/model.safetensors: truncated"),
    ("qwen2", [], "model_type 'qwen2' with --ngram is not planned for trtllm"),
    ("qwen2_medusa", ["--tp", "2"], "target/config.json: model_type 'qwen2' with --medusa and "
     "--tp 2 --pp 1: the pinned TensorRT-LLM's examples/medusa/convert_checkpoint.py does not "
     "shard a Qwen2 base model"),
    ("qwen2_medusa", ["--pp", "2"], "with --medusa and --tp 1 --pp 2"),
    ("eagle_pt", [], "eagle/pytorch_model.pt: EAGLE weights as *.pt are not read by the pinned "
     "TensorRT-LLM"),
    ("heads_hidden", [], "medusa/config.json: hidden_size 32 does not match the target's 64"),
    ("tokenizer", [], "draft/tokenizer.json: special tokens differ"),
    ("none", ["--tp", "3", "--backend", "trtllm"], "num_attention_heads 4 is not divisible by"),
    ("none", ["--medusa-choices", "{0}, {0, 0, 0, 0, 0}"], "lacks its prefix"),
    ("none", ["--medusa-choices", "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0, 0}"],
     "depth 5 exceeds the 4 heads"),
    ("none", ["--medusa-choices", "{0}, {1}", "--max-draft-len", "1"], "tree has 2 nodes"),
    ("none", ["--medusa-choices", "{0} {x}"], "medusa_choices: not a brace or list form"),
    ("none", ["--ngram"], "give exactly one of --medusa DIR, --draft DIR, --ngram"),
    ("none", ["--backend", "torch", "--kv-cache-dtype", "fp8", "--quantize", "fp8"],
     "not emulated by the torch backend"),
    ("none", ["--backend", "trtllm", "--quantize", "fp8"], "needs a Hopper"),
    ("none", ["--backend", "trtllm"], "python3: not found on PATH (step 'convert target"),
]


@pytest.mark.parametrize(("what", "args", "message"), CASES)
def test_bad_input(ckpt: TinyCheckpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   what: str, args: list[str], message: str) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no trtllm-build here
    import torch

    if "Hopper" in message and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    extra = _corrupt(ckpt, what) if what != "none" else ["--medusa", str(ckpt.medusa)]
    out = tmp_path / "engines" / "bad"
    result = CliRunner().invoke(cli, ["build", "--model", str(ckpt.target), *extra, *args,
                                      "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not out.exists() and not (out.parent / ".bad.building").exists()
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())


def test_existing_out_needs_force(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "e"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--ngram",
                                      "--backend", "torch", "--out", str(out)])
    assert result.exit_code == 2 and "already exists (use --force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    shutil.rmtree(out)


def test_qwen2_medusa_one_rank_is_planned(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    args = _corrupt(ckpt, "qwen2_medusa")
    plan = _json(run("--model", str(ckpt.target), *args, "--out", str(tmp_path / "e"),
                     "--format", "json"))["plan"]
    assert _after(_step(plan, "convert target"), "--model_type") == "qwen2"


def test_public_medusa_heads_with_a_wrong_config_count_are_accepted(
        ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """FasterDecoding's medusa-vicuna-7b-v1.3 layout: medusa_lm_head.pt holding 5 heads while
    config.json says medusa_num_heads 2 (upstream's Medusa README converts it)."""
    import torch

    from tests.helpers.tiny import make_medusa_heads

    vocab = json.loads((ckpt.target / "config.json").read_text())["vocab_size"]
    heads = make_medusa_heads(ckpt.root / "vicuna-heads", 64, vocab, num_heads=5)
    from safetensors.torch import load_file

    sd = load_file(str(heads / "medusa_lm_head.safetensors"))
    (heads / "medusa_lm_head.safetensors").unlink()
    torch.save(sd, heads / "medusa_lm_head.pt")
    cfg = json.loads((heads / "config.json").read_text())
    (heads / "config.json").write_text(json.dumps({**cfg, "medusa_num_heads": 2}))
    result = run("--model", str(ckpt.target), "--medusa", str(heads), "--backend", "trtllm",
                 "--out", str(tmp_path / "e"), "--dry-run", "--format", "json")
    plan = _json(result)["plan"]
    assert _after(_step(plan, "convert target"), "--num_medusa_heads") == "5"
    assert result.stderr.strip().splitlines() == [
        f"warning: {heads / 'medusa_lm_head.pt'}: holds 5 heads but config.json says "
        "medusa_num_heads=2; using 5 (the count in the weights, passed to the converter as "
        "--num_medusa_heads)"]


def test_eagle3_on_trtllm_plans_the_pytorch_route_unless_the_engine_flow_is_asked(
        tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """EAGLE-3 has no engine-flow path in 1.2.1: --backend trtllm --eagle3 picks --flow pytorch;
    an explicit --flow engine is one line, exit 2; --backend torch builds the reference engine."""
    from specserve.runtime.eagle3_dir import save_eagle3
    from specserve.runtime.model import load_model
    from tests.runtime.test_eagle3 import random_head

    head = save_eagle3(random_head(load_model(tiny_ckpt.target)), tmp_path / "eagle3")
    base = ["--model", str(tiny_ckpt.target), "--eagle3", str(head), "--dry-run"]
    out = _json(run(*base, "--backend", "trtllm", "--out", str(tmp_path / "e"), "--format",
                    "json"))
    assert out["config"]["flow"] == "pytorch"
    assert out["llm_api"]["options"]["speculative_config"]["decoding_type"] == "Eagle"
    refused = CliRunner().invoke(cli, ["build", *base, "--backend", "trtllm", "--flow", "engine",
                                       "--out", str(tmp_path / "e2")])
    assert refused.exit_code == 2 and "no EAGLE-3 path" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    torch_plan = _json(run(*base, "--backend", "torch", "--out", str(tmp_path / "e3"),
                           "--format", "json"))
    assert torch_plan["config"]["backend"] == "torch" and "flow" not in torch_plan["config"]
    assert torch_plan["config"]["eagle3"] == str(head)  # recorded: make engine sees a change


def test_a_torch_eagle3_engine_records_its_static_tree_and_loads_it(
        tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """--backend torch --eagle3 --eagle-choices: the tree is recorded (max_draft_len = its
    depth) and the loaded engine proposes it; a --max-draft-len that is not the depth and a
    tree without its prefixes are one line, exit 2, nothing written."""
    from specserve.runtime.eagle3_dir import save_eagle3
    from specserve.runtime.engine import load_engine
    from specserve.runtime.model import load_model
    from tests.runtime.test_eagle3 import random_head

    head = save_eagle3(random_head(load_model(tiny_ckpt.target)), tmp_path / "eagle3")
    base = ["build", "--model", str(tiny_ckpt.target), "--eagle3", str(head), "--backend",
            "torch", "--dtype", "float32"]
    res = CliRunner().invoke(cli, [*base, "--eagle-choices", "{0}, {1}, {0, 0}",
                                   "--out", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    rec = json.loads((tmp_path / "e" / "build_config.json").read_text())
    assert rec["eagle_choices"] == [[0], [1], [0, 0]] and rec["max_draft_len"] == 2
    assert "--eagle-choices" in rec["command"]
    prop = load_engine(tmp_path / "e").decoder.proposer
    assert prop is not None and prop.lookahead == 3 and prop.max_draft_len == 2
    for extra, match in ((["--eagle-choices", "{0}, {0, 0}", "--max-draft-len", "4"],
                          "2 deep"), (["--eagle-choices", "{0}, {0, 1, 1}"], "lacks its prefix")):
        bad = CliRunner().invoke(cli, [*base, *extra, "--out", str(tmp_path / "bad")])
        assert bad.exit_code == 2 and match in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def test_torch_default_dtype_is_chosen_by_the_cpu(tiny_ckpt: TinyCheckpoint,
                                                  tmp_path: Path) -> None:
    # float16 is emulated on a CPU: without --dtype the torch engine gets float32 or bfloat16,
    # chosen by this CPU and recorded with its reason
    out = tmp_path / "e"
    data = _json(run("--model", str(tiny_ckpt.target), "--ngram", "--backend", "torch",
                     "--out", str(out), "--format", "json"))
    record = json.loads((out / "build_config.json").read_text())
    assert data["config"]["dtype"] == record["config"]["dtype"]
    assert record["config"]["dtype"] in ("float32", "bfloat16")
    choice = record["dtype_choice"]
    assert choice["requested"] == "auto" and choice["device"] == "cpu"
    assert choice["dtype"] == record["config"]["dtype"] and choice["reason"]


def test_explicit_float16_and_the_trtllm_default(tiny_ckpt: TinyCheckpoint,
                                                 tmp_path: Path) -> None:
    torch16 = _json(run("--model", str(tiny_ckpt.target), "--ngram", "--backend", "torch",
                        "--dtype", "float16", "--out", str(tmp_path / "a"), "--dry-run",
                        "--format", "json"))
    assert torch16["config"]["dtype"] == "float16"
    trt = _json(run("--model", str(tiny_ckpt.target), "--draft", str(tiny_ckpt.draft),
                    "--backend", "trtllm", "--out", str(tmp_path / "b"), "--dry-run",
                    "--format", "json"))
    assert trt["config"]["dtype"] == "float16"
