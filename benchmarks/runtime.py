"""Reference decoder benchmark: tokens/s side by side in one run.

Workload (a), "oracle": a random-init Llama in ``--oracle-dtype`` (default ``auto``: bfloat16
where this CPU has bf16 instructions, else float32; :mod:`specserve.cpu_dtype`), ``--oracle-size``
(``1b`` is a
~1.1B model, the default ``small`` ~190M keeps the run practical on a shared 2-core machine).
HF ``generate()`` plain, ours plain, ours with an oracle proposer that proposes the target's own
greedy continuation (chain K=4 and K=8): this isolates the machinery from acceptance.

Workload (b), "pair": a target with a draft model and Medusa heads (``--target/--draft/--medusa``;
default: the random tiny checkpoint of the tests, whose draft accepts almost nothing). HF plain,
HF assisted generation (``assistant_model=`` the same draft), HF prompt lookup, and ours plain,
draft (fixed K, adaptive K, and K <= ``--confidence-k`` with chains ended at a draft below
``--confidence``, as HF's ``assistant_confidence_threshold``), n-gram and Medusa.

All runs are greedy with EOS off and ``--new-tokens`` tokens; the best of ``--repeats`` timed runs
after one warm-up is reported. ``--doc FILE`` rewrites this benchmark's section of FILE.

    python benchmarks/runtime.py [--oracle-size small|1b|none] [--new-tokens 128] [--doc F]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specserve.cpu_dtype import choose_dtype
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.loader import build_decoder
from specserve.runtime.model import ModelConfig, Transformer, _convert
from specserve.runtime.proposers import OracleProposer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers: tiny models

SIZES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "small": (1024, 8, 16, 4, 4096, 32000),
    "1b": (2048, 16, 32, 8, 8192, 32000),
}
SMALL_TREE = "{0}, {1}, {2}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 0, 0, 0}"
START, END = "<!-- bench-runtime:start -->", "<!-- bench-runtime:end -->"


Row = tuple[str, float, str]


@dataclass
class Case:
    """One configuration: ``fn`` generates and returns the number of new tokens."""

    name: str
    fn: Callable[[], int]
    stats: dict[str, float] = field(default_factory=dict)


def measure(cases: list[Case], repeats: int) -> list[Row]:
    """Best tokens/s per case. One warm-up each, then ``repeats`` rounds that run every case in
    turn, so load from other processes on a shared machine hits all cases alike."""
    for c in cases:
        c.fn()
    best = {c.name: 0.0 for c in cases}
    for _ in range(repeats):
        for c in cases:
            t0 = time.perf_counter()
            n = c.fn()
            best[c.name] = max(best[c.name], n / (time.perf_counter() - t0))
    for c in cases:
        print(f"  {c.name}: {best[c.name]:.1f} tok/s", file=sys.stderr, flush=True)
    return [(c.name, best[c.name], f"tau {c.stats['tau']:.2f}" if "tau" in c.stats else "")
            for c in cases]


def hf_generate(model: Any, ids: torch.Tensor, n: int, **kw: Any) -> Callable[[], int]:
    def run() -> int:
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, **kw)
        return int(out.shape[1] - ids.shape[1])
    return run


def ours(name: str, dec: SpecDecoder, prompt: list[int], n: int) -> Case:
    case = Case(name, lambda: 0)

    def run() -> int:
        (r,) = dec.generate([prompt], SamplingParams(max_tokens=n))
        if dec.proposer is not None:
            case.stats["tau"] = r.stats.tau
        return len(r.token_ids)
    case.fn = run
    return case


def random_llama(size: str, dtype: torch.dtype) -> tuple[Any, Transformer]:
    """The same random weights in ``dtype`` as an HF LlamaForCausalLM and as our Transformer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    h, layers, heads, kv, inter, vocab = SIZES[size]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, max_position_embeddings=2048)
    torch.manual_seed(0)
    hf: Any = LlamaForCausalLM(cfg)
    hf = hf.to(dtype).eval()
    mc = ModelConfig.from_hf(cfg.to_dict())
    model = Transformer(mc)
    model.load_state_dict(_convert(hf.state_dict(), mc, Path("random")))
    model = model.to(dtype).eval()
    model.inv_freq = model.inv_freq.float()
    return hf, model.decode_layout()


def oracle_reference(model: Transformer, prompt: list[int], n: int, k: int,
                     max_rounds: int = 8) -> list[int]:
    """The target's own greedy continuation as computed by K-chain verification.

    In bfloat16 a K+1-token forward rounds differently from a 1-token forward, so near-ties in
    a random model's logits can flip the greedy token; plain decoding is then not the chain's
    continuation. Iterate "decode with the oracle, use its output as the next oracle" until the
    output repeats: every round keeps the already consistent prefix and extends it.
    """
    params = SamplingParams(max_tokens=n)
    ref = SpecDecoder(model).generate([prompt], params)[0].token_ids
    for _ in range(max_rounds):
        dec = SpecDecoder(model, OracleProposer([prompt + ref], max_draft_len=k))
        out = dec.generate([prompt], params)[0].token_ids
        if out == ref:
            break
        ref = out
    return ref


def oracle_rows(size: str, n: int, repeats: int, dtype: str = "bfloat16") -> list[Row]:
    hf, model = random_llama(size, getattr(torch, dtype))
    params = sum(p.numel() for p in hf.parameters()) / 1e9
    prompt = list(range(100, 164))
    ids = torch.tensor([prompt])
    label = f"(a) random Llama {params:.2f}B {dtype}"
    cases = [Case(f"{label}: HF generate plain", hf_generate(hf, ids, n)),
             ours(f"{label}: ours plain", SpecDecoder(model), prompt, n)]
    for k in (4, 8):
        ref = oracle_reference(model, prompt, n, k)
        dec = SpecDecoder(model, OracleProposer([prompt + ref], max_draft_len=k))
        cases.append(ours(f"{label}: ours oracle chain K={k}", dec, prompt, n))
    return measure(cases, repeats)


def pair_rows(target: Path, draft: Path | None, medusa: Path | None, n: int, k: int,
              repeats: int, dtype: str = "float32",
              confidence: tuple[int, float] = (32, 0.6)) -> list[Row]:
    from transformers import AutoModelForCausalLM

    from specserve.runtime.loader import load_tokenizer
    from tests.helpers.tiny import TINY_TEXT

    tok = load_tokenizer(target)
    prompt = list(tok(TINY_TEXT[:240])["input_ids"])
    ids = torch.tensor([prompt])
    tdt = getattr(torch, dtype)
    hf_t = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True,
                                                dtype=tdt).eval()
    label = f"(b) {target.parent.name}/{target.name} {dtype}"
    cases = [Case(f"{label}: HF generate plain", hf_generate(hf_t, ids, n))]
    if draft is not None:
        hf_d = AutoModelForCausalLM.from_pretrained(str(draft), local_files_only=True,
                                                    dtype=tdt).eval()
        cases.append(Case(f"{label}: HF assisted generation",
                          hf_generate(hf_t, ids, n, assistant_model=hf_d)))
    cases.append(Case(f"{label}: HF prompt lookup K={k}",
                      hf_generate(hf_t, ids, n, prompt_lookup_num_tokens=k)))
    variants: list[tuple[str, dict[str, Any]]] = [("plain", {})]
    if draft is not None:
        variants.append((f"draft K={k}", {"draft_dir": draft}))
        variants.append((f"draft K<={k} adaptive", {"draft_dir": draft,
                                                   "adaptive_draft_len": True}))
        ck, conf = confidence
        if conf > 0:
            variants.append((f"draft K<={ck} confidence stop {conf:g}", {
                "draft_dir": draft, "max_draft_len": ck, "draft_min_confidence": conf}))
            if dtype != "float32":  # the draft's dtype is free (lossless): fp32 is faster here
                variants.append((f"draft K<={ck} confidence stop {conf:g}, float32 draft", {
                    "draft_dir": draft, "max_draft_len": ck, "draft_min_confidence": conf,
                    "draft_dtype": "float32"}))
    variants.append((f"ngram K={k}", {"ngram": True}))
    if medusa is not None:
        variants.append(("medusa mc_sim_7b_63", {"medusa_dir": medusa}))
        variants.append(("medusa 8-node tree", {"medusa_dir": medusa,
                                                "medusa_choices": SMALL_TREE}))
    for name, kw in variants:
        dec = build_decoder(target, **{"max_draft_len": k, "dtype": dtype, **kw})
        cases.append(ours(f"{label}: ours {name}", dec, prompt, n))
    return measure(cases, repeats)


def table(rows: list[Row]) -> str:
    lines = ["| run | tokens/s | x HF plain | x ours plain | note |", "|---|---:|---:|---:|---|"]
    for name, rate, note in rows:
        group = name.split(":")[0]
        hf = next(r for n, r, _ in rows if n.startswith(group) and n.endswith("HF generate plain"))
        op = next(r for n, r, _ in rows if n.startswith(group) and n.endswith("ours plain"))
        lines.append(f"| {name} | {rate:.1f} | {rate / hf:.2f} | {rate / op:.2f} | {note} |")
    return "\n".join(lines)


def write_doc(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"{START}\n{body}\n{END}"
    if START in text and END in text:
        text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle-size", choices=[*SIZES, "none"], default="small")
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--medusa", type=Path)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="draft length for draft/ngram")
    ap.add_argument("--confidence-k", type=int, default=32,
                    help="max draft length of the confidence-stop draft row")
    ap.add_argument("--confidence", type=float, default=0.6,
                    help="draft_min_confidence of that row (0: no such row)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "auto"], default="float32",
                    help="dtype of workload (b), for HF and ours alike (auto: specserve.cpu_dtype)")
    ap.add_argument("--oracle-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="dtype of workload (a) (auto: bfloat16 only where this CPU runs it fast)")
    ap.add_argument("--doc", type=Path, help="rewrite this benchmark's section of a markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    oracle_dtype, pair_dtype = (choose_dtype(d) for d in (args.oracle_dtype, args.dtype))
    for what, c in (("(a)", oracle_dtype), ("(b)", pair_dtype)):
        print(f"{what} dtype {c.dtype} ({c.reason})", file=sys.stderr)
    rows: list[Row] = []
    if args.oracle_size != "none":
        rows += oracle_rows(args.oracle_size, args.new_tokens, args.repeats, oracle_dtype.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft, medusa = args.target, args.draft, args.medusa
        if target is None:
            from tests.helpers.tiny import make_tiny_checkpoint

            ck = make_tiny_checkpoint(Path(tmp) / "tiny")
            target, draft, medusa = ck.target, ck.draft, ck.medusa
        rows += pair_rows(target, draft, medusa, args.new_tokens, args.k, args.repeats,
                          pair_dtype.dtype, (args.confidence_k, args.confidence))
    out = table(rows)
    print(out)
    if args.doc is not None:
        cmd = "python benchmarks/runtime.py " + shlex.join(argv)
        write_doc(args.doc, f"Command: `{cmd.strip()}` (torch threads: {args.threads}; "
                            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n{out}")


if __name__ == "__main__":
    main(sys.argv[1:])
