"""Grammar-forced drafts on the real model (:mod:`specserve.runtime.forced_drafts`): JSON
extraction under a schema, c = 1, T = 0, per-user tokens/s of each configuration over plain
constrained decoding, measured side by side.

Records: HumanEval problems (Chen et al. 2021; ``HumanEval.jsonl.gz``, as ``specserve prompts``
reads it), evenly spaced, each a chat request (the model's chat template) asking for the
function's interface as JSON under :data:`SCHEMA`. Configurations: plain constrained decoding,
forced drafts alone, n-gram (K = 4, or k <= K per step under ``--draft-len-policy adaptive``)
alone and merged with forced drafts, the EAGLE-3 head (likewise; when ``--drafts``/eagle3
exists) alone and merged (``--no-skip-too``: the merges also with the proposer run on rows
whose draft the grammar's chain fills). Every record runs through every configuration before
the next record (the order reversed on odd records), so load from other processes hits them
alike. Per-user tok/s = generated tokens / the request's seconds (prefill included; ``--clock
cpu``: the thread's CPU seconds); a configuration's ratio is its total tokens / total seconds
over plain's, with a 95% bootstrap interval over records. Every answer is checked against the
schema and against plain constrained decoding's (greedy is lossless). Prints ratios, never
asserts on time.

    .venv/bin/python benchmarks/structured_forced.py --records 32 \\
        --model checkpoints/smollm2 --drafts checkpoints/smollm2-drafts
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object",
          "properties": {
              "function_name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,39}$"},
              "parameter_names": {"type": "array", "maxItems": 4,
                                  "items": {"type": "string",
                                            "pattern": "^[a-z_][a-z0-9_]{0,19}$"}},
              "return_type": {"type": "string", "enum": ["int", "float", "str", "bool", "list",
                                                          "dict", "tuple", "None", "other"]},
              "one_line_summary": {"type": "string",
                                   "pattern": "^[A-Za-z0-9 ,.'_()-]{1,80}$"},
              "has_doctest_examples": {"type": "boolean"}},
          "required": ["function_name", "parameter_names", "return_type", "one_line_summary",
                       "has_doctest_examples"]}
ASK = ("Extract the interface of the Python function below as JSON with the keys "
       "function_name, parameter_names, return_type, one_line_summary and "
       "has_doctest_examples.\n\n```python\n{code}```")
CONFIGS = [("plain", "plain", None), ("forced", "plain", "skip"), ("ngram", "ngram", None),
           ("ngram+forced", "ngram", "skip"), ("eagle3", "eagle3", None),
           ("eagle3+forced", "eagle3", "skip")]
# --no-skip-too: the merges also with the proposer run on rows the grammar's chain covers
NO_SKIP = [("ngram+forced/no-skip", "ngram", "run"), ("eagle3+forced/no-skip", "eagle3", "run")]


def records(path: Path, n: int) -> list[str]:
    """``n`` HumanEval prompts, evenly spaced over the set."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line)["prompt"] for line in f if line.strip()]
    step = max(len(rows) // n, 1)
    return rows[::step][:n]


def _decoders(model: Path, drafts: Path, k: int, policy: str) -> dict[str, Any]:
    from specserve.runtime.loader import build_decoder

    out = {"plain": build_decoder(model),
           "ngram": build_decoder(model, ngram=True, max_draft_len=k, draft_len_policy=policy)}
    if (drafts / "eagle3" / "config.json").is_file():
        out["eagle3"] = build_decoder(model, eagle3_dir=drafts / "eagle3", max_draft_len=k,
                                      draft_len_policy=policy)
    return out


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per configuration, per record: tokens, seconds, steps, emitted, forced, valid, same."""
    from transformers import AutoTokenizer

    from specserve.runtime.forced_drafts import ForcedDrafts
    from specserve.runtime.grammar import Guide, GuideCompiler
    from specserve.runtime.params import SamplingParams

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    tok = AutoTokenizer.from_pretrained(str(args.model))
    decs = _decoders(args.model, args.drafts, args.k, args.draft_len_policy)
    vocab = decs["plain"].target.cfg.vocab_size
    guide = GuideCompiler(tok, vocab, [tok.eos_token_id]).compile(
        Guide("json_schema", json.dumps(SCHEMA)))
    params = SamplingParams(max_tokens=args.max_tokens, end_id=tok.eos_token_id, guide=guide)
    configs = [c for c in CONFIGS + (NO_SKIP if args.no_skip_too else [])
               if c[1] in decs and (not args.only or c[0] == "plain" or c[0] in args.only)]
    prompts = []
    for code in records(args.data, args.records):
        msgs = [{"role": "user", "content": ASK.format(code=code)}]
        enc: Any = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)
        prompts.append(list(enc["input_ids"]))
    for d in decs.values():  # warm-up: kernels built, caches touched
        d.generate([prompts[0]], SamplingParams(max_tokens=8))
    cols: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i, ids in enumerate(prompts):
        outs: dict[str, list[int]] = {}
        for name, base, forced in (configs if i % 2 == 0 else configs[::-1]):
            dec = decs[base]
            dec.forced = None if forced is None else ForcedDrafts(skip_covered=forced == "skip")
            t0 = clock()
            (res,) = dec.generate([ids], params)
            c, outs[name] = cols[name], list(res.token_ids)
            c["seconds"].append(clock() - t0)
            c["tokens"].append(len(res.token_ids))
            c["steps"].append(res.stats.steps)
            c["emitted"].append(res.stats.emitted_tokens)
            c["forced"].append(res.accepted_forced_tokens)
            c["valid"].append(float(_valid(tok.decode(res.token_ids))))
        for name in outs:
            cols[name]["same"].append(float(outs[name] == outs["plain"]))
        print(f"record {i + 1}/{len(prompts)} done", flush=True)
        if args.out is not None:  # what is done so far, should the run be cut short
            _write(args.out, cols)
    return cols


def _ratio(c: dict[str, list[float]], base: dict[str, list[float]], idx: list[int]) -> float:
    tps = sum(c["tokens"][i] for i in idx) / sum(c["seconds"][i] for i in idx)
    return tps / (sum(base["tokens"][i] for i in idx) / sum(base["seconds"][i] for i in idx))


def table(cols: dict[str, dict[str, list[float]]], seed: int = 0) -> str:
    """The Markdown table: ratio over plain constrained (95% bootstrap interval), tau, accepted
    forced drafts per answer, valid answers, answers equal to plain's."""
    rng, base = random.Random(seed), cols["plain"]
    n = len(base["tokens"])
    lines = ["| config | tok/s vs plain constrained (95% CI) | tau | accepted forced / answer "
             "| tokens / answer | valid | equal to plain |", "|---|---|---|---|---|---|---|"]
    for name, c in cols.items():
        boots = sorted(_ratio(c, base, [rng.randrange(n) for _ in range(n)])
                       for _ in range(1000))
        lines.append(
            f"| {name} | {_ratio(c, base, list(range(n))):.2f}x ({boots[25]:.2f}-{boots[974]:.2f})"
            f" | {sum(c['emitted']) / max(sum(c['steps']), 1):.2f}"
            f" | {sum(c['forced']) / n:.1f} | {sum(c['tokens']) / n:.1f}"
            f" | {sum(c['valid']):.0f}/{n} | {sum(c['same']):.0f}/{n} |")
    return "\n".join(lines)


def _write(path: Path, cols: dict[str, dict[str, list[float]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cols, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--drafts", type=Path, default=ROOT / "checkpoints" / "smollm2-drafts")
    ap.add_argument("--data", type=Path, default=ROOT / ".cache" / "data" / "HumanEval.jsonl.gz")
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4, help="draft length of n-gram and EAGLE-3")
    ap.add_argument("--draft-len-policy", choices=["fixed", "adaptive"], default="fixed",
                    help="fixed: K drafts per step; adaptive: the engine's draft-length policy "
                         "(k <= K per step from measured acceptance and step cost)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: this thread's CPU time (with --threads 1: what a request used, "
                         "barely moved by other processes on a loaded machine)")
    ap.add_argument("--no-skip-too", action="store_true",
                    help="also the merges that run the proposer on rows the grammar covers")
    ap.add_argument("--out", type=Path, default=None,
                    help="also write the raw columns (JSON; after every record)")
    ap.add_argument("--only", nargs="+", default=None, metavar="CONFIG",
                    help="these configurations only (plain always first)")
    args = ap.parse_args()
    cols = run(args)
    if args.out is not None:
        _write(args.out, cols)
    print(table(cols))


if __name__ == "__main__":
    main()
