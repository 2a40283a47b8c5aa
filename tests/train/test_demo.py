"""A tiny end-to-end demo build (seconds): loadable artifacts, exact Medusa layout, held-out
files never trained on, lossless decoder check, determinism for a seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.train.demo import DemoConfig, build_demo

SNIPPETS = [
    "def area(w, h):\n    return w * h\n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, x):\n        self.items.append(x)\n\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n\n",
]


def tiny_config(root: Path, seed: int = 0) -> DemoConfig:
    return DemoConfig(
        seed=seed, minutes=0.05, corpus_root=str(root), vocab_size=300,
        corpus_chars=100_000, heldout_files=3, target_hidden=32, target_layers=1,
        target_heads=2, draft_hidden=16, draft_layers=1, draft_heads=2, target_steps=4,
        target_batch=4, seq_len=32, distill_samples=8, prompt_len=8, gen_len=8,
        draft_steps=4, draft_batch=4, medusa_heads=3, medusa_steps=4, medusa_batch_tokens=16,
        eagle3_steps=3, eagle3_batch_seqs=4, eagle3_draft_vocab=128, eval_prompts=2,
        eval_gen_len=8, threads=1)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        text = "".join(SNIPPETS[(i + j) % len(SNIPPETS)] for j in range(6))
        (root / f"mod{i:02d}.py").write_text(f"# module {i}\n" + text * (1 + i % 3))
    return root


@pytest.fixture(scope="module")
def built(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("demo") / "demo"
    build_demo(tiny_config(corpus_dir), out)
    return out


def test_models_and_tokenizer_load_offline(built: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built / "tokenizer"), local_files_only=True)
    ids = tok("def f(x):\n    return x")["input_ids"]
    for name in ("target", "draft"):
        assert (built / name / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(str(built / name), local_files_only=True)
        assert model.config.vocab_size == len(tok)
        logits = model(input_ids=torch.tensor([ids])).logits
        assert logits.shape == (1, len(ids), len(tok))
        AutoTokenizer.from_pretrained(str(built / name), local_files_only=True)


def test_medusa_layout_is_exact(built: Path) -> None:
    from safetensors.torch import load_file

    cfg = json.loads((built / "medusa" / "config.json").read_text())
    target = json.loads((built / "target" / "config.json").read_text())
    assert {k: cfg[k] for k in ("medusa_num_heads", "medusa_num_layers", "hidden_size",
                                "vocab_size", "base_model_name_or_path")} == {
        "medusa_num_heads": 3, "medusa_num_layers": 1, "hidden_size": target["hidden_size"],
        "vocab_size": target["vocab_size"], "base_model_name_or_path": "target"}
    assert cfg["medusa_fc_bias"] is True   # else vLLM's `medusa` method drops the biases
    names = set(load_file(str(built / "medusa" / "medusa_lm_head.safetensors")))
    want = {f"{h}.0.linear.{p}" for h in range(3) for p in ("weight", "bias")}
    want |= {f"{h}.1.weight" for h in range(3)}
    assert names == want


def test_heldout_files_never_trained_on(built: Path, corpus_dir: Path) -> None:
    c = json.loads((built / "corpus.json").read_text())
    assert len(c["heldout_files"]) == 3 and c["train_files"]
    assert not set(c["heldout_files"]) & set(c["train_files"])
    assert all((corpus_dir / n).is_file() for n in c["heldout_files"] + c["train_files"])


def _steps(tokens: int, tau: float) -> int:
    """The verify steps behind ``tau = tokens / steps`` (eval.json rounds tau to 4 decimals)."""
    steps = round(tokens / tau)
    assert tokens / steps == pytest.approx(tau, abs=5e-5), (tokens, tau)
    return steps


def test_eval_json_and_reference_decoder(built: Path) -> None:
    ev = json.loads((built / "eval.json").read_text())
    assert len(ev["medusa"]["top1_accuracy"]) == 3
    # the training dtype is this CPU's fast one (specserve.cpu_dtype), recorded with evidence
    from specserve.cpu_dtype import choose_dtype

    assert ev["dtype"] == choose_dtype("auto").to_dict()
    # measured by specserve.runtime: heads and draft load there, and T=0 stays lossless
    assert "decoder_error" not in ev
    n, g = ev["heldout_prompts"], ev["gen_len"]
    for mode in ("medusa", "draft"):
        assert ev[mode]["matches_baseline"] == 1.0
        # The offline replay and the reference decoder run one step map over the same greedy
        # continuation: from committed position t, accept a(t) drafts and go to
        # min(t + a(t) + 1, end). The replay emits all g tokens (its first step also makes the
        # first token); the decoder gets the first token from the prefill and emits g - 1 (the
        # chain starts one position later, the tree ends one earlier). The map is monotone
        # (t < t' <= f(t) => f(t') >= f(t)), so per prompt the replay takes the decoder's
        # steps or one more: an exact bound instead of a tolerance on tau.
        replay = _steps(n * g, ev[mode]["tau_replay"])
        decoder = _steps(n * (g - 1), ev[mode]["tau"])
        assert decoder <= replay <= decoder + n, (mode, replay, decoder)
    for mode in ("medusa", "medusa_tuned", "draft", "eagle3", "ngram"):  # side by side
        assert ev[mode]["matches_baseline"] == 1.0, mode
        assert ev[mode]["tokens_per_s"] > 0 and 1.0 <= ev[mode]["tau"] <= 5.0, mode
    assert ev["eagle3"]["draft_vocab"] == 128
    fast = ev["fastest_method"]
    best = max(("medusa", "medusa_tuned", "draft", "eagle3", "ngram"),
               key=lambda m: ev[m]["tokens_per_s"])
    assert fast == (best if ev[best]["tokens_per_s"] > ev["baseline_tokens_per_s"] else "none")
    # what `make engine` builds (the fastest) and the tuned Medusa tree, also on the prompts
    # `specserve demo` serves: the tau its served run is checked against
    from specserve.demo import DemoRunConfig

    d = DemoRunConfig(repo="r", out="o")
    assert ev["served_prompts"] == {"prompts": "builtin-code", "seed": 0, "warmup": d.warmup,
                                    "requests": d.requests, "max_tokens": d.max_tokens}
    assert {m for m in ("medusa", "medusa_tuned", "draft", "eagle3", "ngram")
            if "tau_served_prompts" in ev[m]} == {fast, "medusa_tuned"} - {"none"}
    # the tuned tree's figure is its tau on exactly the requests the benchmark measures (its
    # own prompt plan, after the warmup), decoded as the server does (stopping at EOS)
    from specserve.client.benchmark import plan_jobs
    from specserve.client.datasets import load_prompts
    from specserve.runtime.loader import build_decoder, load_tokenizer
    from specserve.runtime.params import SamplingParams
    from specserve.spec.stats import AcceptanceStats

    tok = load_tokenizer(built / "tokenizer")
    dec = build_decoder(built / "target", medusa_dir=built / "medusa",
                        medusa_choices=ev["medusa_tuned"]["choices"])
    jobs = plan_jobs(load_prompts(None, "builtin-code", d.warmup + d.requests, 0), d.warmup,
                     d.requests, baseline=True)
    stats = AcceptanceStats()
    for job in jobs:
        if job.phase == "measure" and job.variant == "spec":
            (r,) = dec.generate([tok.encode(job.prompt.text)], SamplingParams(
                max_tokens=d.max_tokens, end_id=tok.eos_token_id))
            stats = stats.merge(r.stats)
    assert ev["medusa_tuned"]["tau_served_prompts"] == round(stats.tau, 4)


def test_eagle3_head_loads_and_fits_the_target(built: Path) -> None:
    from specserve.runtime.eagle3_dir import load_eagle3
    from specserve.runtime.model import load_model

    head = load_eagle3(built / "eagle3", load_model(built / "target").cfg)
    assert int(head.t2d.sum()) == head.cfg.draft_vocab_size == 128


def _tensors(root: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in ("target/model.safetensors", "draft/model.safetensors",
              "medusa/medusa_lm_head.safetensors", "eagle3/model.safetensors"):
        out.update({f"{f}:{k}": v for k, v in load_file(str(root / f)).items()})
    return out


def test_deterministic_for_a_seed(built: Path, corpus_dir: Path, tmp_path: Path) -> None:
    again = build_demo(tiny_config(corpus_dir), tmp_path / "again")
    a, b = _tensors(built), _tensors(again.out)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ev = json.loads((built / "eval.json").read_text())
    assert again.eval["medusa"]["top1_accuracy"] == ev["medusa"]["top1_accuracy"]
    assert (built / "tokenizer" / "tokenizer.json").read_text() == (
        again.out / "tokenizer" / "tokenizer.json").read_text()


def test_existing_output_and_bad_corpus_leave_nothing_half_written(
        built: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecserveError, match="already exists"):
        build_demo(tiny_config(tmp_path), built)
    out = tmp_path / "x"
    with pytest.raises(SpecserveError, match="not found"):
        build_demo(tiny_config(tmp_path / "missing"), out)
    assert not out.exists() and not list(tmp_path.glob(".x*"))


def test_config_rejects_non_positive_fields() -> None:
    with pytest.raises(SpecserveError, match="target_steps must be > 0"):
        DemoConfig(target_steps=0).validate()
    with pytest.raises(SpecserveError, match="--minutes must be > 0"):
        DemoConfig.for_minutes(-1)
    assert DemoConfig.for_minutes(10).target_steps == 2 * DemoConfig().target_steps
