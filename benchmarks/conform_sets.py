"""The model sets the conformance runs point at (``--model-set``): ``demo``, the 4M-parameter
toy pair of ``specserve demo-model`` (``checkpoints/demo``, every method), and ``real``,
SmolLM2-135M-Instruct of ``make real-model`` (``checkpoints/smollm2``, its own ChatML template)
with the drafts of ``make train-real`` (``checkpoints/smollm2-drafts``: the methods whose
draft exists there, n-gram always). ``--target`` / ``--drafts`` override the directories.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "checkpoints"
K = 4   # draft tokens per step of every chain (draft, n-gram, EAGLE-3)
SEQ = {"real": ["--max-input-len", "1024", "--max-seq-len", "1536"]}   # build flags per set


@dataclass(frozen=True)
class ModelSet:
    name: str
    target: Path       # the HF directory of the target model
    drafts: Path       # draft/, medusa/, eagle3/ under it (those that exist)
    tokenizer: Path    # tokenizer.json's directory
    chat_template: bool   # the target has its own chat template

    def has(self, kind: str) -> bool:
        """Whether ``kind``'s draft exists (n-gram needs none)."""
        return kind == "ngram" or (self.drafts / kind / "config.json").is_file()

    def kinds(self) -> list[str]:
        return [k for k in ("draft", "ngram", "medusa", "eagle3") if self.has(k)]

    @property
    def none_kind(self) -> str:
        """The engine the "none" rows are served by (speculation off)."""
        return "draft" if self.has("draft") else "ngram"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model-set", choices=("demo", "real"), default="demo",
                    help="demo: the toy pair; real: SmolLM2-135M-Instruct and its drafts")
    ap.add_argument("--target", type=Path, default=None, help="the target's HF directory")
    ap.add_argument("--drafts", type=Path, default=None, help="its drafts' directory")


def from_args(args: argparse.Namespace) -> ModelSet:
    if args.model_set == "demo":
        demo = CKPT / "demo"
        ms = ModelSet("demo", demo / "target", demo, demo / "tokenizer", False)
    else:
        real = CKPT / "smollm2"
        ms = ModelSet("real", real, CKPT / "smollm2-drafts", real, True)
    target = args.target or ms.target
    return ModelSet(ms.name, target, args.drafts or ms.drafts,
                    args.target or ms.tokenizer, ms.chat_template)


def build_engine(ms: ModelSet, kind: str, out: Path) -> None:
    """The torch engine of ``kind`` on ``ms`` (float32, batch 16, K = 4; Medusa: the heads'
    own CPU tree when the set has one, else the builder's default); reused when built. The
    real model's sequences are cut to 1,536 tokens (prompts up to 1,024): its KV cache for 16
    sequences of 8,192 (the model's maximum) is ~6 GiB per engine instance, and a repository
    holds two (ensemble and baseline)."""
    if (out / "build_config.json").exists():
        return
    tree = ms.drafts / "medusa_tree_cpu.json"
    extra = {"draft": ["--draft", str(ms.drafts / "draft"), "--max-draft-len", str(K)],
             "ngram": ["--ngram", "--max-draft-len", str(K)],
             "eagle3": ["--eagle3", str(ms.drafts / "eagle3"), "--max-draft-len", str(K)],
             "medusa": ["--medusa", str(ms.drafts / "medusa"),
                        *(["--medusa-choices", str(tree)] if tree.is_file() else [])]}[kind]
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "build", "--model",
                    str(ms.target), *extra, "--backend", "torch", "--dtype", "float32",
                    "--max-batch-size", "16", *SEQ.get(ms.name, []), "--out", str(out),
                    "--force"], check=True)
