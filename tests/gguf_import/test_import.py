"""``specserve import`` on tiny GGUF files written by gguf's own writer (no download).

A float32 GGUF made from a tiny Hugging Face checkpoint must come back tensor for tensor (names,
shapes, the Q/K rotary permutation, tied embeddings); a quantized one must give the logits of
transformers' own GGUF load; every bad input is one line, exit 2, nothing written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from specserve.checkpoint import load_state_dict
from specserve.cli.main import cli
from specserve.gguf_import import ImportConfig, import_gguf
from tests.helpers.gguf_files import write_gguf, write_raw_tensor_gguf

CHAT = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"


@dataclass(frozen=True)
class Sources:
    root: Path
    llama: Path
    qwen3: Path


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    from tests.helpers.tiny import make_llama, make_qwen3, make_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gguf")
    tok = make_tokenizer(root / "tok", vocab_size=320)  # > 260: the vocabulary has merges
    return Sources(root, make_llama(root / "llama", tok), make_qwen3(root / "qwen3", tok))


def _run(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of ``specserve ARGS``."""
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_float32_gguf_comes_back_tensor_for_tensor(src: Sources, tmp_path: Path,
                                                   family: str) -> None:
    hf = getattr(src, family)
    gguf_path = write_gguf(hf, tmp_path / f"{family}.gguf", chat_template=CHAT)
    out = tmp_path / "out"
    code, text, err = _run("import", str(gguf_path), "--out", str(out), "--format", "json")
    assert code == 0, err
    _same_tensors(load_file(str(hf / "model.safetensors")), load_state_dict(out))
    want, got = (json.loads((d / "config.json").read_text()) for d in (hf, out))
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "vocab_size",
                "tie_word_embeddings"):
        assert got[key] == want[key], key
    assert got.get("head_dim", 16) == want.get("head_dim", 16)
    assert json.loads(text)["source"]["sha256"] == hashlib.sha256(
        gguf_path.read_bytes()).hexdigest()


def test_tokenizer_and_chat_template_survive(src: Sources, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    out = import_gguf(ImportConfig(write_gguf(src.llama, tmp_path / "m.gguf",
                                              chat_template=CHAT), tmp_path / "out")).out
    theirs = AutoTokenizer.from_pretrained(str(src.llama))
    ours = AutoTokenizer.from_pretrained(str(out))
    text = "def add(a, b):\n    return a + b  数据 😂👍 </s> x"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    msgs = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(msgs, tokenize=False) == "<|user|>hi</s>"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == theirs.eos_token_id


def test_missing_output_weight_means_tied_embeddings(src: Sources, tmp_path: Path) -> None:
    import gguf

    full = write_gguf(src.llama, tmp_path / "full.gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(full).tensors}
    assert "output.weight" in tensors
    tied = write_gguf(src.llama, tmp_path / "tied.gguf", drop=("output.weight",))
    out = import_gguf(ImportConfig(tied, tmp_path / "out")).out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_state_dict(out)


def test_quantized_gguf_matches_transformers_own_load(src: Sources, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    name = "q.gguf"
    path = write_gguf(src.llama, tmp_path / name, qtypes={"ffn_": "Q4_1", "attn_": "Q8_0",
                                                          "token_embd": "Q4_0"})
    out = import_gguf(ImportConfig(path, tmp_path / "out")).out
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=name,
                                               dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 20, 33, 7, 100, 250]])
    with torch.no_grad():
        diff = (ref(ids).logits - ours(ids).logits).abs().max().item()
    assert diff <= 1e-3
    # and it is really quantized: not the float32 weights
    orig = load_file(str(src.llama / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"]
    assert not torch.equal(load_state_dict(out)["model.layers.0.mlp.up_proj.weight"], orig)


def test_dtype_and_shards(src: Sources, tmp_path: Path) -> None:
    path = write_gguf(src.llama, tmp_path / "m.gguf")
    res = import_gguf(ImportConfig(path, tmp_path / "out", dtype="bfloat16",
                                   shard_bytes=40_000))
    assert len(res.weight_files) > 1
    assert (res.out / "model.safetensors.index.json").is_file()
    sd = load_state_dict(res.out)
    orig = load_file(str(src.llama / "model.safetensors"))
    _same_tensors({k: v.to(torch.bfloat16) for k, v in orig.items()}, sd)
    assert json.loads((res.out / "config.json").read_text())["dtype"] == "bfloat16"


def _refused(args: list[str], needle: str) -> None:
    code, text, err = _run("import", *args)
    assert code == 2, text + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert not text and len(lines) == 1, err
    assert lines[0].startswith("error: ") and needle in lines[0], err


def test_bad_files_are_refused_in_one_line(src: Sources, tmp_path: Path) -> None:
    good = write_gguf(src.llama, tmp_path / "good.gguf")
    out = tmp_path / "out"
    (tmp_path / "text.gguf").write_text("not a model\n")
    _refused([str(tmp_path / "text.gguf"), "--out", str(out)], "not a GGUF file")
    _refused([str(tmp_path / "absent.gguf"), "--out", str(out)], "no such file")
    data = good.read_bytes()
    for cut in (len(data) // 2, 200):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        _refused([str(tmp_path / "cut.gguf"), "--out", str(out)], "truncated")
    other = write_gguf(src.llama, tmp_path / "phi.gguf", arch="phi3")
    _refused([str(other), "--out", str(out)], "architecture 'phi3' not supported")
    raw = np.random.default_rng(0).integers(0, 256, size=(2, 84), dtype=np.uint8)
    q2k = write_raw_tensor_gguf(tmp_path / "q2k.gguf", {"blk.0.ffn_up.weight": ("Q2_K", raw, 0)})
    _refused([str(q2k), "--out", str(out)], "tensor type Q2_K not supported")
    extra = write_gguf(src.llama, tmp_path / "extra.gguf",
                       extra={"rope_freqs.weight": np.ones(8, dtype=np.float32)})
    _refused([str(extra), "--out", str(out)], "rope_freqs.weight has no counterpart")
    missing = write_gguf(src.llama, tmp_path / "missing.gguf", drop=("blk.1.ffn_down.weight",))
    _refused([str(missing), "--out", str(out)], "no tensor for model.layers.1.mlp.down_proj")
    assert not out.exists()
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_out_holding_other_files_is_never_touched(src: Sources, tmp_path: Path) -> None:
    good = write_gguf(src.llama, tmp_path / "good.gguf")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    _refused([str(good), "--out", str(mine)], "already exists")
    _refused([str(good), "--out", str(mine), "--force"], "not written by specserve")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"
    ours = tmp_path / "ours"
    assert _run("import", str(good), "--out", str(ours))[0] == 0
    assert _run("import", str(good), "--out", str(ours), "--force")[0] == 0


def test_no_tokenizer_is_refused_before_writing(src: Sources, tmp_path: Path) -> None:
    path = write_gguf(src.llama, tmp_path / "m.gguf", tokenizer=False)
    _refused([str(path), "--out", str(tmp_path / "out")], "cannot read its tokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_an_interrupt_after_the_weights_leaves_nothing(src: Sources, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C once the weights are written (planted in the config writer): no --out, no
    stage, the earlier output of the same name kept."""
    import specserve.gguf_import.convert as convert

    path = write_gguf(src.llama, tmp_path / "m.gguf")
    out = import_gguf(ImportConfig(path, tmp_path / "out")).out
    before = load_state_dict(out)

    def interrupted(*_: object) -> None:
        assert any((tmp_path / ".out.building").glob("*.safetensors"))
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "_write_config", interrupted)
    with pytest.raises(KeyboardInterrupt):
        import_gguf(ImportConfig(path, out, dtype="bfloat16", force=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]
    _same_tensors(before, load_state_dict(out))
