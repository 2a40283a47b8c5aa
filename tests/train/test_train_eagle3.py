"""``specserve train-eagle3`` (specserve.train.eagle3): the loss is scored against the right
positions, training lowers it, the trained head is accepted more often than an untrained one
when it decodes the tiny target's own generations, the saved directory loads and decodes
losslessly, and bad input is refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.runtime.eagle3_dir import load_eagle3
from specserve.runtime.model import load_model
from specserve.train.eagle3 import Eagle3Result, run_train_eagle3
from specserve.train.eagle3_config import Eagle3TrainConfig
from specserve.train.eagle3_data import draft_vocabulary, vocab_maps
from specserve.train.eagle3_loss import ttt_loss
from tests.helpers.crash import Crash, CrashAt
from tests.helpers.tiny import TinyCheckpoint

SHARPEN = 10.0  # a random-init target is near uniform; scaled logits give it a clear argmax


@pytest.fixture(scope="module")
def sharp_target(tiny_ckpt: TinyCheckpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with its LM head scaled by SHARPEN (peaked next-token distributions)."""
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("sharp") / "target"
    shutil.copytree(tiny_ckpt.target, d)
    sd = load_file(str(d / "model.safetensors"))
    sd["lm_head.weight"] = sd["lm_head.weight"] * SHARPEN
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _cfg(model: Path, out: Path, steps: int) -> Eagle3TrainConfig:
    return Eagle3TrainConfig(model=str(model), out=str(out), samples=48, prompt_len=8,
                             gen_len=40, steps=steps, draft_vocab=128, heldout_fraction=0.17,
                             eval_prompts=4, eval_gen_len=32, seed=0)


@pytest.fixture(scope="module")
def runs(sharp_target: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Eagle3Result, Eagle3Result]:
    """One step (an untrained head: random layer, lm_head from the target) and 80 steps, same
    seed, so the same self-distilled sequences and held-out prompts."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("e3")
    return (run_train_eagle3(_cfg(sharp_target, root / "untrained", 1)),
            run_train_eagle3(_cfg(sharp_target, root / "trained", 80)))


def test_the_loss_scores_step_j_against_position_t_plus_j_plus_1() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(2, 9, 5, generator=g) * 3, dim=-1)  # [B, N, Vd]
    top = logp.argmax(-1)
    exact = [torch.roll(logp, -(j + 1), dims=1) for j in range(3)]  # index t -> t + j + 1
    loss, kls, accs = ttt_loss(exact, logp, top, [1.0, 0.8, 0.64])
    assert float(loss) == pytest.approx(0.0, abs=1e-5) and accs == [1.0, 1.0, 1.0]
    late = [torch.roll(logp, -(j + 2), dims=1) for j in range(3)]  # one position too far
    loss2, _, accs2 = ttt_loss(late, logp, top, [1.0, 0.8, 0.64])
    assert float(loss2) > 0.5 and max(accs2) < 1.0
    # a target outside the draft vocabulary (-1) is a miss
    _, _, accs3 = ttt_loss(exact, logp, torch.full_like(top, -1), [1.0, 0.8, 0.64])
    assert accs3 == [0.0, 0.0, 0.0]


def test_draft_vocabulary_is_the_most_frequent_ids_and_d2t_maps_back() -> None:
    seqs = torch.tensor([[7, 7, 7, 3, 3, 9], [9, 9, 1, 7, 3, 2]])  # 7: 4, 3: 3, 9: 3, 1, 2
    ids = draft_vocabulary(seqs, 12, 3)
    assert ids.tolist() == [3, 7, 9]
    assert draft_vocabulary(seqs, 12, 4).tolist() == [1, 3, 7, 9]  # tie 1 vs 2: lower id
    assert draft_vocabulary(seqs, 12, 7).tolist() == [0, 1, 2, 3, 4, 7, 9]  # unseen: by id
    d2t, t2d = vocab_maps(ids, 12)
    assert (torch.arange(3) + d2t).tolist() == [3, 7, 9]
    assert t2d.nonzero().squeeze(-1).tolist() == [3, 7, 9]


def test_training_lowers_the_loss_and_raises_acceptance(runs: tuple[Eagle3Result, ...]
                                                        ) -> None:
    untrained, trained = runs
    # measured (seed 0, 1 thread): loss 2.65 -> 0.54; tau 1.03 untrained, 1.51 trained
    assert trained.final_loss < 0.4 * trained.first_loss
    assert trained.train["heldout"]["kl_per_step"][0] < 0.5 * untrained.train["heldout"][
        "kl_per_step"][0]
    assert trained.eval["tau"] > untrained.eval["tau"] + 0.25, (untrained.eval, trained.eval)
    pos = trained.eval["per_position_acceptance"]
    assert len(pos) == 4 and pos[0] > 0.2 and pos == sorted(pos, reverse=True)
    for r in runs:  # lossless at T = 0 whatever the head
        assert r.eval["matches_baseline"] == 1.0
    saved = json.loads((trained.out / "eval.json").read_text())
    assert saved["tau"] == trained.eval["tau"]


def test_the_saved_directory_loads_and_decodes_like_plain(runs: tuple[Eagle3Result, ...],
                                                          sharp_target: Path) -> None:
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.params import SamplingParams

    out = runs[1].out
    info = json.loads((out / "train_info.json").read_text())
    head = load_eagle3(out, load_model(sharp_target).cfg)
    assert int(head.t2d.sum()) == info["draft_vocab"] == 128
    assert torch.equal(head.target_ids(), head.t2d.nonzero().squeeze(-1))
    prompts = [[1, 5, 9, 13, 2, 4], [3, 3, 8]]
    params = SamplingParams(max_tokens=24, temperature=0.0, end_id=None)
    plain = build_decoder(sharp_target).generate(prompts, params)
    spec = build_decoder(sharp_target, eagle3_dir=out, max_draft_len=3).generate(prompts,
                                                                                  params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert sum(r.stats.accepted_tokens for r in spec) > 0
    tree = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]]  # a static tree of the same depth
    got = build_decoder(sharp_target, eagle3_dir=out, eagle_choices=tree).generate(prompts,
                                                                                   params)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    # a trained head keeps accepting with the tree (which holds the chain's first branch)
    assert sum(r.stats.accepted_tokens for r in got) >= sum(r.stats.accepted_tokens
                                                          for r in spec)


def _invoke(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args)
    return res.exit_code, res.output


FLAGS = ["--samples", "6", "--prompt-len", "4", "--gen-len", "8", "--steps", "2",
         "--eval-prompts", "0", "--threads", "1"]


def test_cli_writes_the_portable_directory(sharp_target: Path, tmp_path: Path) -> None:
    out = tmp_path / "e3"
    code, text = _invoke(["train-eagle3", "--model", str(sharp_target), "--out", str(out),
                          "--draft-vocab", "64", *FLAGS, "--format", "json"])
    assert code == 0, text
    data = json.loads(text[text.index("{"):])
    assert data["steps"] == 2 and data["draft_vocab"] == 64
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
    assert not list(tmp_path.glob(".e3*"))
    code, text = _invoke(["train-eagle3", "--model", str(sharp_target), "--out", str(out),
                          *FLAGS, "--force"])  # ours: --force replaces it
    assert code == 0, text
    vocab = json.loads((sharp_target / "config.json").read_text())["vocab_size"]
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == vocab
    code, text = _invoke(["train-eagle3", "--model", str(sharp_target), "--out", str(out),
                          *FLAGS, "--force", "--intermediate-size", "24", "--num-heads", "1"])
    assert code == 0, text  # a slimmer head: its own MLP width and head count, as vLLM reads
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["intermediate_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"]) == (24, 1, 1)
    assert load_eagle3(out, load_model(sharp_target).cfg).cfg.num_heads == 1


def test_bad_input_is_one_line_and_writes_nothing(sharp_target: Path, tmp_path: Path) -> None:
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"],
                                                  "model_type": "bert"}))
    vocab = json.loads((sharp_target / "config.json").read_text())["vocab_size"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    cases = [
        (["--model", str(bert), "--out", str(tmp_path / "a")], "bert"),
        (["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "a")], "not found"),
        (["--model", str(sharp_target), "--out", str(tmp_path / "a"), "--draft-vocab",
          str(vocab + 1)], f"--draft-vocab {vocab + 1} > the target's vocabulary ({vocab})"),
        (["--model", str(sharp_target), "--out", str(tmp_path / "a"), "--draft-vocab", "0"],
         "--draft-vocab must be >= 1"),
        (["--model", str(sharp_target), "--out", str(tmp_path / "a"), "--num-heads", "0"],
         "--num-heads"),
        (["--model", str(sharp_target), "--out", str(mine), "--force"], "not written by"),
        (["--model", str(sharp_target), "--out", str(mine)], "already exists"),
    ]
    for args, match in cases:
        code, text = _invoke(["train-eagle3", *args, *FLAGS])
        assert code == 2, (args, text)
        assert match in text and "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a*"))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"


def test_minutes_set_the_steps_and_data_prompts_work(sharp_target: Path, tmp_path: Path
                                                      ) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "def add(a, b):\n    return a + b\n" * 8})
                              for _ in range(3)))
    cfg = Eagle3TrainConfig(model=str(sharp_target), out=str(tmp_path / "m"), samples=6,
                            prompt_len=4, gen_len=8, minutes=0.005, data=str(data),
                            heldout_fraction=0.2, eval_prompts=0)
    res = run_train_eagle3(cfg)
    info = json.loads((tmp_path / "m" / "train_info.json").read_text())
    # 0.3 s of training at the tiny size: the probe-timed count, never below 10
    assert res.steps == info["steps"] >= 10 and info["config"]["minutes"] == 0.005
    assert info["train_sequences"] == [5, 12]
    assert len(info["heldout"]["top1_per_step"]) == 3  # the 6th sequence is held out


def test_an_interrupted_run_resumes_to_the_same_head(sharp_target: Path, tmp_path: Path) -> None:
    """Killed in step 26 (checkpoint at 20), rerun with the same flags: the sequences are not
    regenerated and the head equals an uninterrupted run's, bit for bit."""
    from safetensors.torch import load_file

    from specserve.train.eagle3_loop import SAVE_EVERY

    torch.set_num_threads(1)

    def cfg(out: Path) -> Eagle3TrainConfig:
        return Eagle3TrainConfig(model=str(sharp_target), out=str(out), samples=12,
                                 prompt_len=8, gen_len=16, steps=30, draft_vocab=64,
                                 eval_prompts=0, seed=3)

    run_train_eagle3(cfg(tmp_path / "a" / "e3"))
    assert not (tmp_path / "a" / ".e3.partial").exists()
    with pytest.raises(Crash):
        run_train_eagle3(cfg(tmp_path / "b" / "e3"), CrashAt("eagle3 head", SAVE_EVERY + 5))
    work = tmp_path / "b" / ".e3.partial"
    assert torch.load(work / "state.pt", weights_only=True)["step"] == SAVE_EVERY
    assert (work / "sequences.safetensors").is_file() and not (tmp_path / "b" / "e3").exists()
    rep = CrashAt("eagle3 head", 10**6)  # never crashes: keeps the log lines
    run_train_eagle3(cfg(tmp_path / "b" / "e3"), rep)
    assert any("resuming at step 20" in ln for ln in rep.logs)
    assert any("reusing the sequences" in ln for ln in rep.logs)
    a = load_file(str(tmp_path / "a" / "e3" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "e3" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
