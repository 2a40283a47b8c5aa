"""Validation: each bad input gives one line naming the file and the mismatch."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from specserve.build.validate import (
    validate_eagle,
    validate_medusa,
    validate_parallelism,
    validate_target,
)
from specserve.checkpoint import (
    check_tokenizers_match,
    read_safetensors_header,
    tokenizer_fingerprint,
)
from specserve.errors import SpecserveError
from tests.helpers.tiny import TinyCheckpoint, make_llama, make_medusa_heads, make_tokenizer


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _raises(match: str) -> Any:
    return pytest.raises(SpecserveError, match=match)


def test_tiny_checkpoint_is_valid(tiny_ckpt: TinyCheckpoint) -> None:
    cfg = validate_target(tiny_ckpt.target)
    info = validate_medusa(tiny_ckpt.medusa, cfg, tree=[(0,), (0, 0), (1,)])
    assert (info.num_heads, info.num_layers) == (4, 1)
    assert (info.hidden_size, info.vocab_size) == (cfg["hidden_size"], cfg["vocab_size"])
    check_tokenizers_match(tiny_ckpt.target, tiny_ckpt.draft)
    validate_parallelism(cfg, 2, 2)


def test_safetensors_header_shapes(tiny_ckpt: TinyCheckpoint) -> None:
    hdr = read_safetensors_header(tiny_ckpt.target / "model.safetensors")
    vocab = json.loads((tiny_ckpt.target / "config.json").read_text())["vocab_size"]
    assert hdr["model.embed_tokens.weight"].shape == (vocab, 64)


def test_truncated_safetensors(ckpt: TinyCheckpoint) -> None:
    f = ckpt.target / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with _raises(r"model\.safetensors: truncated"):
        validate_target(ckpt.target)


def test_garbage_safetensors_header(tmp_path: Path) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes(struct.pack("<Q", 4) + b"nope")
    with _raises(r"x\.safetensors: unreadable safetensors header"):
        read_safetensors_header(f)
    f.write_bytes(b"abc")
    with _raises(r"x\.safetensors: truncated"):
        read_safetensors_header(f)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel' is not supported"),
        ({"num_attention_heads": 3}, "hidden_size 64 is not divisible by num_attention_heads 3"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide"),
        ({"vocab_size": 300}, r"embed_tokens.weight has shape \[\d+, 64\] but config.json says "
                              r"\[vocab_size, hidden_size\] = \[300, 64\]"),
        ({"hidden_size": "64"}, "'hidden_size' must be a positive integer"),
    ],
)
def test_bad_target_config(ckpt: TinyCheckpoint, changes: dict[str, Any], match: str) -> None:
    _edit_json(ckpt.target / "config.json", **changes)
    with _raises(rf"target/config.json: {match}|target: .*{match}"):
        validate_target(ckpt.target)


def test_missing_weights(ckpt: TinyCheckpoint) -> None:
    (ckpt.target / "model.safetensors").unlink()
    with _raises("target: no model.safetensors"):
        validate_target(ckpt.target)


def test_medusa_hidden_mismatch(ckpt: TinyCheckpoint) -> None:
    cfg = validate_target(ckpt.target)
    make_medusa_heads(ckpt.medusa, 32, cfg["vocab_size"])
    with _raises("medusa/config.json: hidden_size 32 does not match the target's 64"):
        validate_medusa(ckpt.medusa, cfg)
    _edit_json(ckpt.medusa / "config.json", hidden_size=64)  # config lies; tensors tell
    with _raises(r"medusa_lm_head.safetensors: 0.0.linear.weight has shape \[32, 32\]"):
        validate_medusa(ckpt.medusa, cfg)


def test_medusa_vocab_mismatch(ckpt: TinyCheckpoint) -> None:
    cfg = validate_target(ckpt.target)
    vocab = cfg["vocab_size"]
    make_medusa_heads(ckpt.medusa, 64, 300)
    with _raises(f"medusa/config.json: vocab_size 300 does not match the target's {vocab}"):
        validate_medusa(ckpt.medusa, cfg)
    _edit_json(ckpt.medusa / "config.json", vocab_size=vocab)  # config lies; tensors tell
    with _raises(rf"0.1.weight has shape \[300, 64\], expected \[{vocab}, 64\]"):
        validate_medusa(ckpt.medusa, cfg)


@pytest.mark.parametrize("config_heads", [2, 5])
def test_medusa_head_count_from_the_weights(ckpt: TinyCheckpoint, config_heads: int,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Upstream's converter ignores the heads' config.json (--num_medusa_heads decides), and the
    public medusa-vicuna-7b-v1.3 config is wrong: a warning line, the weights' count."""
    _edit_json(ckpt.medusa / "config.json", medusa_num_heads=config_heads)
    info = validate_medusa(ckpt.medusa, validate_target(ckpt.target))
    assert info.num_heads == 4
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"warning: {ckpt.medusa / 'medusa_lm_head.safetensors'}: holds 4 heads but config.json "
        f"says medusa_num_heads={config_heads}; using 4 (the count in the weights, passed to the "
        "converter as --num_medusa_heads)"]


def test_medusa_heads_must_be_numbered_from_zero(ckpt: TinyCheckpoint) -> None:
    from safetensors.torch import load_file, save_file

    f = ckpt.medusa / "medusa_lm_head.safetensors"
    sd = load_file(str(f))
    save_file({k.replace("2.", "7.", 1) if k.startswith("2.") else k: v for k, v in sd.items()},
              str(f))
    with _raises(r"heads \[0, 1, 3, 7\] are not numbered 0..N-1"):
        validate_medusa(ckpt.medusa, validate_target(ckpt.target))


def _eagle_dir(root: Path, target: Path, weights: str) -> Path:
    import torch

    d = root / "eagle"
    d.mkdir()
    cfg = json.loads((target / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({k: cfg[k] for k in ("hidden_size",
                                                                    "vocab_size")}))
    torch.save({"fc.weight": torch.zeros(2, 2)}, d / weights)
    return d


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "eagle.pth"])
def test_eagle_weights_the_converter_reads(ckpt: TinyCheckpoint, tmp_path: Path,
                                           weights: str) -> None:
    validate_eagle(_eagle_dir(tmp_path, ckpt.target, weights), validate_target(ckpt.target))


def test_eagle_pt_weights_are_refused(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    """ModelWeightsLoader.detect_format reads *.safetensors, *.bin, *.pth only."""
    d = _eagle_dir(tmp_path, ckpt.target, "model.pt")
    with _raises(r"model\.pt: EAGLE weights as \*\.pt are not read by the pinned TensorRT-LLM "
                 r"\(examples/eagle/convert_checkpoint.py loads \*\.safetensors, \*\.bin or "
                 r"\*\.pth: ModelWeightsLoader.detect_format\); save them as safetensors") as e:
        validate_eagle(d, validate_target(ckpt.target))
    assert "\n" not in str(e.value)


def test_medusa_layer_count_mismatch(ckpt: TinyCheckpoint) -> None:
    _edit_json(ckpt.medusa / "config.json", medusa_num_layers=2)
    with _raises(r"missing '0.1.linear.weight' \(config.json says medusa_num_layers=2\)"):
        validate_medusa(ckpt.medusa, validate_target(ckpt.target))


def test_medusa_tree_deeper_than_heads(tiny_ckpt: TinyCheckpoint) -> None:
    cfg = validate_target(tiny_ckpt.target)
    with _raises("medusa_choices depth 5 exceeds the 4 heads"):
        validate_medusa(tiny_ckpt.medusa, cfg, tree=[(0,), (0, 0, 0, 0, 0)])


def _edit_tokenizer(model_dir: Path, part: str) -> None:
    path = model_dir / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    if part == "vocab":  # swap the ids of two tokens: same size, different mapping
        a, b = sorted(vocab)[10:12]
        vocab[a], vocab[b] = vocab[b], vocab[a]
    else:
        data["model"]["merges"] = [*data["model"]["merges"], ["a", "b"]]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("part", ["vocab", "merges"])
def test_tokenizer_mismatch(ckpt: TinyCheckpoint, part: str) -> None:
    check_tokenizers_match(ckpt.target, ckpt.draft)
    _edit_tokenizer(ckpt.draft, part)
    with _raises(f"draft/tokenizer.json: {part} differ from the target's tokenizer"):
        check_tokenizers_match(ckpt.target, ckpt.draft)


def test_tokenizer_from_other_corpus(ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    other = make_tokenizer(tmp_path / "tok2", vocab_size=300, text="other words " * 50)
    vocab = json.loads((ckpt.target / "config.json").read_text())["vocab_size"]
    make_llama(ckpt.draft, other, hidden_size=32, layers=1, heads=2, kv_heads=1, vocab_size=vocab)
    with _raises("draft/tokenizer.json: tokenizer has"):
        check_tokenizers_match(ckpt.target, ckpt.draft)


def test_tokenizer_mismatch_special(ckpt: TinyCheckpoint) -> None:
    _edit_json(ckpt.draft / "tokenizer_config.json", eos_token="<pad>")
    with _raises("draft/tokenizer.json: special tokens differ"):
        check_tokenizers_match(ckpt.target, ckpt.draft)


def test_tokenizer_vocab_size_mismatch(ckpt: TinyCheckpoint) -> None:
    _edit_json(ckpt.draft / "config.json", vocab_size=300)
    with _raises(r"draft/config.json: vocab_size 300 differs from the target's \d+ \(.*target"):
        check_tokenizers_match(ckpt.target, ckpt.draft)


def test_fingerprint_is_stable(tiny_ckpt: TinyCheckpoint) -> None:
    a, b = tokenizer_fingerprint(tiny_ckpt.target), tokenizer_fingerprint(tiny_ckpt.tokenizer)
    vocab = json.loads((tiny_ckpt.target / "config.json").read_text())["vocab_size"]
    assert a.sha256 == b.sha256 and a.vocab_size == vocab


@pytest.mark.parametrize(
    ("tp", "pp", "match"),
    [(3, 1, "num_attention_heads 4 is not divisible by --tp 3"),
     (0, 1, "must be >= 1"),
     (1, 3, "--pp 3 exceeds num_hidden_layers 2")],
)
def test_bad_parallelism(tiny_ckpt: TinyCheckpoint, tp: int, pp: int, match: str) -> None:
    with _raises(match):
        validate_parallelism(validate_target(tiny_ckpt.target), tp, pp)


def test_kv_heads_vs_tp() -> None:
    cfg = {"num_attention_heads": 12, "num_key_value_heads": 4, "num_hidden_layers": 2}
    validate_parallelism(cfg, 2, 1)  # kv split
    validate_parallelism(cfg, 12, 1)  # kv replicated
    with _raises("num_key_value_heads 4 and --tp 6"):
        validate_parallelism(cfg, 6, 1)
