"""Bad input -> one-line SpecserveError naming the file and the mismatch; the CLI exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.errors import SpecserveError
from specserve.runtime.checkpoint import load_medusa_heads
from specserve.runtime.loader import build_decoder
from specserve.runtime.proposers import MedusaProposer
from specserve.spec.tree import MC_SIM_7B_63
from tests.helpers.tiny import TinyCheckpoint, make_llama, make_medusa_heads


def _fails(match: str, **kw: object) -> str:
    with pytest.raises(SpecserveError, match=match) as e:
        build_decoder(**kw)  # type: ignore[arg-type]
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_draft_with_other_vocab_size_is_refused(tiny_ckpt: TinyCheckpoint,
                                                tmp_path: Path) -> None:
    draft = make_llama(tmp_path / "d", tiny_ckpt.tokenizer, hidden_size=32, layers=1, heads=2,
                       kv_heads=1, vocab_size=300)
    _fails("vocab_size", model_dir=tiny_ckpt.target, draft_dir=draft)


def test_draft_with_other_tokenizer_is_refused(writable_ckpt: TinyCheckpoint) -> None:
    tj = writable_ckpt.draft / "tokenizer.json"
    data = json.loads(tj.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, different mapping
    tj.write_text(json.dumps(data))
    msg = _fails("differ", model_dir=writable_ckpt.target, draft_dir=writable_ckpt.draft)
    assert str(writable_ckpt.draft) in msg


@pytest.mark.parametrize(("hidden", "vocab", "what"), [(32, 260, "hidden size"),
                                                       (64, 100, "vocab size")])
def test_medusa_shape_mismatch(tiny_ckpt: TinyCheckpoint, tmp_path: Path, hidden: int,
                               vocab: int, what: str) -> None:
    heads = make_medusa_heads(tmp_path / "m", hidden, vocab)
    msg = _fails(what, model_dir=tiny_ckpt.target, medusa_dir=heads)
    assert "medusa_lm_head.safetensors" in msg


def test_fewer_heads_than_tree_depth(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    heads = make_medusa_heads(tmp_path / "m", 64, 260, num_heads=2)
    _fails("depth 3 exceeds", model_dir=tiny_ckpt.target, medusa_dir=heads,
           medusa_choices="{0}, {0, 0}, {0, 0, 0}")
    dec = build_decoder(tiny_ckpt.target, medusa_dir=heads)  # default tree cut to 2 heads
    assert isinstance(dec.proposer, MedusaProposer)
    tree = dec.proposer.tree
    assert tree.depth == 2, f"default tree depth {tree.depth}, expected the 2 heads available"
    fitting = {c for c in MC_SIM_7B_63 if len(c) <= 2}
    assert {len(c) for c in fitting} == {1, 2}  # the cut keeps paths of both depths
    got = set(tree.choices)
    assert got == fitting, f"missing {sorted(fitting - got)}, extra {sorted(got - fitting)}"


def test_medusa_pt_heads_are_loaded_weights_only(tiny_ckpt: TinyCheckpoint,
                                                 tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text((tiny_ckpt.medusa / "config.json").read_text())
    sd = load_file(str(tiny_ckpt.medusa / "medusa_lm_head.safetensors"))
    torch.save(sd, str(d / "medusa_lm_head.pt"))
    assert load_medusa_heads(d, 64, 260).num_heads == 4
    torch.save({"x": object()}, str(d / "medusa_lm_head.pt"))  # not loadable weights-only
    with pytest.raises(SpecserveError, match="weights_only"):
        load_medusa_heads(d, 64, 260)


def test_missing_and_corrupted_files(writable_ckpt: TinyCheckpoint) -> None:
    st = writable_ckpt.target / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    _fails("truncated", model_dir=writable_ckpt.target)
    st.write_bytes(b"\xff" * 64)
    _fails("safetensors", model_dir=writable_ckpt.target)
    st.unlink()
    _fails("no model.safetensors", model_dir=writable_ckpt.target)
    (writable_ckpt.medusa / "medusa_lm_head.safetensors").unlink()
    _fails("no medusa_lm_head", model_dir=writable_ckpt.draft, medusa_dir=writable_ckpt.medusa)
    (writable_ckpt.medusa / "config.json").unlink()
    _fails("config.json: not found", model_dir=writable_ckpt.draft,
           medusa_dir=writable_ckpt.medusa)
    _fails("not found", model_dir=writable_ckpt.root / "nope")


def test_unsupported_model_type(writable_ckpt: TinyCheckpoint) -> None:
    cfg_path = writable_ckpt.target / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_type"] = "gpt2"
    cfg_path.write_text(json.dumps(cfg))
    _fails("model_type 'gpt2' not supported", model_dir=writable_ckpt.target)


def test_cli_bad_input_is_one_line_exit_2(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    heads = make_medusa_heads(tmp_path / "m", 32, 260)
    r = CliRunner().invoke(cli, ["generate", "--model", str(tiny_ckpt.target), "--medusa",
                                 str(heads), "--prompt", "x"])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "hidden size" in lines[0]
    r = CliRunner().invoke(cli, ["generate", "--model", str(tiny_ckpt.target), "--draft",
                                 str(tiny_ckpt.draft), "--ngram", "--prompt", "x"])
    assert r.exit_code == 2 and "at most one" in r.output
