"""Bad input to ``specserve build`` (``docs/reliability.md``): each case exits 2
with one line naming the problem (no traceback) and leaves nothing on disk. Real torch builds
(not dry runs), so "nothing left" covers the staging directory too."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specserve.cli.main import cli
from tests.helpers.tiny import TinyCheckpoint


def _copy(tiny: TinyCheckpoint, root: Path) -> TinyCheckpoint:
    shutil.copytree(tiny.root, root)
    return TinyCheckpoint(root=root, target=root / "target", draft=root / "draft",
                          medusa=root / "medusa", tokenizer=root / "tokenizer")


def _no_config(c: TinyCheckpoint) -> list[str]:
    (c.target / "config.json").unlink()
    return ["--ngram"]


def _no_weights(c: TinyCheckpoint) -> list[str]:
    (c.target / "model.safetensors").unlink()
    return ["--ngram"]


def _bad_header(c: TinyCheckpoint) -> list[str]:
    f = c.target / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"not json!!!!"  # the JSON header starts after the 8-byte length
    f.write_bytes(bytes(data))
    return ["--ngram"]


def _huge_header(c: TinyCheckpoint) -> list[str]:
    f = c.target / "model.safetensors"
    f.write_bytes((2**40).to_bytes(8, "little") + f.read_bytes()[8:])
    return ["--ngram"]


def _truncated(c: TinyCheckpoint) -> list[str]:
    f = c.target / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return ["--ngram"]


def _heads(hidden: int, vocab_delta: int) -> Callable[[TinyCheckpoint], list[str]]:
    def make(c: TinyCheckpoint) -> list[str]:
        from tests.helpers.tiny import make_medusa_heads

        shutil.rmtree(c.medusa)
        vocab = json.loads((c.target / "config.json").read_text())["vocab_size"]
        make_medusa_heads(c.medusa, hidden, vocab + vocab_delta)
        return ["--medusa", str(c.medusa)]
    return make


def _other_tokenizer(vocab: int) -> Callable[[TinyCheckpoint], list[str]]:
    def make(c: TinyCheckpoint) -> list[str]:
        from tests.helpers.tiny import make_llama, make_tokenizer

        text = "completely different text, other merges " * 50
        tok = make_tokenizer(c.root / "tok2", vocab_size=vocab, text=text)
        shutil.rmtree(c.draft)
        make_llama(c.draft, tok, hidden_size=32, layers=1, heads=2, kv_heads=1)
        return ["--draft", str(c.draft)]
    return make


def _swapped_ids(c: TinyCheckpoint) -> list[str]:
    """Same vocab size, two token ids exchanged: a different tokenizer all the same."""
    f = c.draft / "tokenizer.json"
    tok = json.loads(f.read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.__getitem__)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    f.write_text(json.dumps(tok))
    return ["--draft", str(c.draft)]


def _deep_tree(c: TinyCheckpoint) -> list[str]:
    return ["--medusa", str(c.medusa), "--medusa-choices",
            "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0, 0}"]


def _plain(*args: str) -> Callable[[TinyCheckpoint], list[str]]:
    return lambda c: ["--ngram", *args]


# (case id, how to break the input, the reason: phrases the one-line message must contain)
CASES: list[tuple[str, Callable[[TinyCheckpoint], list[str]], tuple[str, ...]]] = [
    ("missing config.json", _no_config, ("target/config.json: not found",)),
    ("no weights", _no_weights,
     ("target: no model.safetensors or model.safetensors.index.json",)),
    ("corrupted safetensors header", _bad_header,
     ("target/model.safetensors: unreadable safetensors header",)),
    ("safetensors header length huge", _huge_header,
     ("target/model.safetensors: truncated or corrupt safetensors header",
      "1099511627776 bytes declared")),
    ("truncated safetensors", _truncated, ("target/model.safetensors: truncated: tensor",)),
    ("heads wrong hidden size", _heads(32, 0),
     ("medusa/config.json: hidden_size 32 does not match the target's 64",)),
    ("heads wrong vocab", _heads(64, 7),
     ("medusa/config.json: vocab_size 267 does not match the target's 260",)),
    ("draft tokenizer, other vocab size", _other_tokenizer(300),
     ("draft/config.json: vocab_size", "differs from the target's 260")),
    ("draft tokenizer, same size, ids swapped", _swapped_ids,
     ("draft/tokenizer.json: vocab differ from the target's tokenizer",)),
    ("tree deeper than the heads", _deep_tree, ("medusa_choices depth 5 exceeds the 4 heads",)),
    ("unknown dtype", _plain("--dtype", "float8"),
     ("invalid value for '--dtype': 'float8' is not one of",)),
    ("tp does not divide the heads", _plain("--tp", "3", "--backend", "trtllm", "--dry-run"),
     ("num_attention_heads 4 is not divisible by --tp 3",)),
    ("tp > 1 on the torch backend", _plain("--tp", "2"),
     ("--tp/--pp: the torch backend runs on one device",)),
    ("max_input_len > max_seq_len", _plain("--max-input-len", "900", "--max-seq-len", "512"),
     ("--max-input-len 900 must be smaller than --max-seq-len 512",)),
]


def _invoke(args: list[str]) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, ["build", "--backend", "torch", *args])
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    return result.exit_code, lines


def _check_one_line(code: int, lines: list[str], words: tuple[str, ...]) -> None:
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].lower().startswith("error"), lines
    assert "Traceback" not in lines[0]
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])


@pytest.mark.parametrize(("case", "breaker", "words"), CASES, ids=[c[0] for c in CASES])
def test_build_bad_input(tiny_ckpt: TinyCheckpoint, tmp_path: Path, record_property: Any,
                         case: str,
                         breaker: Callable[[TinyCheckpoint], list[str]],
                         words: tuple[str, ...]) -> None:
    c = _copy(tiny_ckpt, tmp_path / "ckpt")
    out_root = tmp_path / "engines"
    out_root.mkdir()
    code, lines = _invoke(["--model", str(c.target), *breaker(c), "--out", str(out_root / "e")])
    record_property("message", " | ".join(lines))
    _check_one_line(code, lines, words)
    assert list(out_root.iterdir()) == [], "something was left on disk"


def test_unwritable_output(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, lines = _invoke(["--model", str(tiny_ckpt.target), "--ngram",
                           "--out", str(blocker / "e")])
    _check_one_line(code, lines, ("a-file",))
    assert blocker.read_text() == "not a directory"


def test_existing_output_without_force(tiny_ckpt: TinyCheckpoint, tmp_path: Path) -> None:
    out = tmp_path / "e"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, lines = _invoke(["--model", str(tiny_ckpt.target), "--ngram", "--out", str(out)])
    _check_one_line(code, lines, ("--force",))
    assert [p.name for p in tmp_path.iterdir()] == ["e"]
    assert (out / "keep.txt").read_text() == "mine"
