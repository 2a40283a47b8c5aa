"""``specserve train-draft`` (specserve.train.draft_train): the SVD init is the target's
embedding on its top singular directions, only the target's continuation is scored, training
raises the draft's acceptance on the tiny target's own generations, the saved directory is a
Llama with the target's vocabulary and tokenizer that the reference decoder's draft path loads
and decodes losslessly, an interrupted run resumes to the same weights, and bad input is refused
in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.train.draft_train import (
    IGNORE,
    SAVE_EVERY,
    DraftResult,
    DraftTrainConfig,
    continuation_labels,
    run_train_draft,
    svd_embedding,
)
from tests.helpers.crash import Crash, CrashAt
from tests.helpers.tiny import TinyCheckpoint

SHARPEN = 10.0  # a random-init target is near uniform; scaled logits give it a clear argmax


@pytest.fixture(scope="module")
def sharp_target(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its LM head scaled by SHARPEN (peaked next-token distributions)."""
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("sharp-draft") / "target"
    shutil.copytree(tiny_ckpt.target, d)
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = sd["lm_head.weight"] * SHARPEN
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _cfg(model: Path, out: Path, steps: int) -> DraftTrainConfig:
    return DraftTrainConfig(model=str(model), out=str(out), hidden=32, layers=2, heads=2,
                            samples=48, prompt_len=8, gen_len=40, steps=steps, lr=1e-2,
                            heldout_fraction=0.17, eval_prompts=4, eval_gen_len=32, seed=0)


@pytest.fixture(scope="module")
def runs(sharp_target: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[DraftResult, DraftResult]:
    """One step (an untrained draft) and 100 steps, same seed: the same self-distilled
    sequences and held-out prompts."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("draft")
    return (run_train_draft(_cfg(sharp_target, root / "untrained", 1)),
            run_train_draft(_cfg(sharp_target, root / "trained", 100)))


def test_svd_embedding_keeps_the_top_singular_directions() -> None:
    g = torch.Generator().manual_seed(0)
    e = torch.randn(40, 8, generator=g) * torch.linspace(3, 0.1, 8)  # [V, H], uneven spread
    s = torch.linalg.svdvals(e)
    for d in (1, 3, 8):
        r = svd_embedding(e, d)  # [V, d]
        assert r.shape == (40, d)
        # the projection keeps exactly the energy of the top d singular values
        assert float((r ** 2).sum()) == pytest.approx(float((s[:d] ** 2).sum()), rel=1e-4)
    full = svd_embedding(e, 8)  # all directions: an isometry, inner products unchanged
    assert torch.allclose(full @ full.T, e @ e.T, atol=1e-4)
    with pytest.raises(Exception, match="at most the target's hidden size"):
        svd_embedding(e, 9)


def test_only_the_continuation_is_scored() -> None:
    seqs = torch.arange(12).reshape(2, 6)
    labels = continuation_labels(seqs, 4)
    assert (labels[:, :4] == IGNORE).all()
    assert torch.equal(labels[:, 4:], seqs[:, 4:])  # the first answer token is scored
    assert torch.equal(seqs, torch.arange(12).reshape(2, 6))  # the input is not modified


def test_training_raises_acceptance_and_decodes_losslessly(runs: tuple[DraftResult, ...]
                                                           ) -> None:
    untrained, trained = runs
    # measured (seed 0, 1 thread): loss 5.59 -> 1.24, held-out top-1 0.10 -> 0.46,
    # tau 1.03 -> 2.07
    assert trained.final_loss < 0.3 * trained.first_loss
    assert trained.train["heldout"]["top1"] > untrained.train["heldout"]["top1"] + 0.25
    assert trained.eval["tau"] > untrained.eval["tau"] + 0.5, (untrained.eval, trained.eval)
    for r in runs:  # lossless at T = 0 whatever the draft
        assert r.eval["matches_baseline"] == 1.0
    assert json.loads((trained.out / "eval.json").read_text())["tau"] == trained.eval["tau"]


def test_the_saved_directory_is_a_llama_with_the_targets_tokenizer(
        runs: tuple[DraftResult, ...], sharp_target: Path) -> None:
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams

    out = runs[1].out
    cfg = json.loads((out / "config.json").read_text())
    target = json.loads((sharp_target / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"]
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (
        target["vocab_size"], 32, 2)
    assert (out / "tokenizer.json").read_bytes() == (sharp_target / "tokenizer.json").read_bytes()
    info = json.loads((out / "train_info.json").read_text())
    assert info["config"]["embed_init"] == "svd" and info["steps"] == 100
    # early stopping: the weights kept are those of the lowest held-out cross-entropy
    curve = info["heldout_curve"]
    assert [row[0] for row in curve] == [50, 100]
    assert info["kept_step"] == min(curve, key=lambda row: row[1])[0]
    assert info["heldout"]["cross_entropy"] == pytest.approx(min(r[1] for r in curve), abs=2e-3)
    prompts = [[1, 5, 9, 13, 2, 4], [3, 3, 8]]
    params = SamplingParams(max_tokens=24, temperature=0.0, end_id=None)
    plain = build_decoder(sharp_target).generate(prompts, params)
    spec = build_decoder(sharp_target, draft_dir=out, max_draft_len=3).generate(prompts, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert sum(r.stats.accepted_tokens for r in spec) > 0


def _invoke(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args)
    return res.exit_code, res.output


FLAGS = ["--hidden", "32", "--heads", "2", "--samples", "6", "--prompt-len", "4",
         "--gen-len", "8", "--steps", "2", "--eval-prompts", "0", "--threads", "1"]


def test_cli_writes_the_draft_directory(sharp_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "d"
    code, text = _invoke(["train-draft", "--model", str(sharp_target), "--out", str(out),
                          *FLAGS, "--embed-init", "random", "--format", "json"])
    assert code == 0, text
    data = json.loads(text[text.index("{"):])
    assert data["steps"] == 2 and data["parameters"] > 0
    assert json.loads((out / "train_info.json").read_text())["config"]["embed_init"] == "random"
    assert not list(tmp_path.glob(".d*"))
    code, text = _invoke(["train-draft", "--model", str(sharp_target), "--out", str(out),
                          *FLAGS, "--layers", "1", "--force"])  # ours: --force replaces it
    assert code == 0, text
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1


def test_bad_input_is_one_line_and_writes_nothing(sharp_target: Path, tmp_path: Path) -> None:
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"],
                                                  "model_type": "bert"}))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    a = str(tmp_path / "a")
    cases = [
        (["--model", str(bert), "--out", a], "bert"),
        (["--model", str(tmp_path / "nope"), "--out", a], "not found"),
        (["--model", str(sharp_target), "--out", a, "--hidden", "128"],
         "--hidden 128 with --embed-init svd needs at most the target's hidden size (64)"),
        (["--model", str(sharp_target), "--out", a, "--hidden", "30"],
         "--hidden 30 must be --heads 2 times an even head size"),
        (["--model", str(sharp_target), "--out", a, "--kv-heads", "3"], "--kv-heads 3"),
        (["--model", str(sharp_target), "--out", a, "--minutes", "0"], "--minutes must be > 0"),
        (["--model", str(sharp_target), "--out", a, "--data", str(tmp_path / "no.jsonl")],
         "data file not found"),
        (["--model", str(sharp_target), "--out", str(mine), "--force"], "not written by"),
        (["--model", str(sharp_target), "--out", str(mine)], "already exists"),
    ]
    for args, match in cases:
        code, text = _invoke(["train-draft", *FLAGS, *args])
        assert code == 2, (args, text)
        assert match in text and "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a*"))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_an_interrupted_run_resumes_to_the_same_draft(sharp_target: Path, tmp_path: Path) -> None:
    """Killed after a checkpoint, rerun with the same flags: the sequences are not regenerated
    and the draft, its losses and its held-out curve equal an uninterrupted run's, bit for
    bit."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)

    def cfg(out: Path) -> DraftTrainConfig:
        return DraftTrainConfig(model=str(sharp_target), out=str(out), hidden=16, heads=2,
                                layers=1, samples=12, prompt_len=8, gen_len=16,
                                steps=SAVE_EVERY + 10, eval_prompts=0, seed=3)

    run_train_draft(cfg(tmp_path / "a" / "d"))
    assert not (tmp_path / "a" / ".d.partial").exists()
    with pytest.raises(Crash):
        run_train_draft(cfg(tmp_path / "b" / "d"), CrashAt("draft model", SAVE_EVERY + 5))
    work = tmp_path / "b" / ".d.partial"
    assert torch.load(work / "state.pt", weights_only=True)["step"] == SAVE_EVERY
    assert (work / "sequences.safetensors").is_file() and not (tmp_path / "b" / "d").exists()
    rep = CrashAt("draft model", 10**6)  # never crashes: keeps the log lines
    run_train_draft(cfg(tmp_path / "b" / "d"), rep)
    assert any(f"resuming at step {SAVE_EVERY}" in ln for ln in rep.logs)
    assert any("reusing the sequences" in ln for ln in rep.logs)
    a = load_file(str(tmp_path / "a" / "d" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "d" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    # the kept weights may predate the crash (early stopping): the losses after it must agree too
    info_a, info_b = (json.loads((tmp_path / r / "d" / "train_info.json").read_text())
                      for r in "ab")
    assert info_a["final_loss"] == info_b["final_loss"]
    assert info_a["heldout_curve"] == info_b["heldout_curve"] and len(info_a["heldout_curve"]) == 2
