"""Structured output under speculation on the demo checkpoint
(docs/results.md, "On which prompts?"): tau and per-user tokens/s at concurrency 1 of guided
(JSON schema) greedy requests, for the target alone and each method, in one process (the
reference engine, no server), plus the share of valid answers and a check that every guided
output equals the target's guided output (greedy is lossless under the grammar).

Every prompt runs through each decoder in turn, so load from other processes hits them alike.
Per-user tok/s = generated tokens / (last token time - submit time), mean over prompts.

    ln -s /work/main/checkpoints checkpoints   # the demo checkpoint
    PYTHONPATH=$PWD .venv/bin/python benchmarks/structured_output.py --prompts 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "^[a-z_]{1,12}$"},
                         "args": {"type": "array", "items": {"type": "string",
                                                             "pattern": "^[a-z_]{1,8}$"},
                                  "maxItems": 4},
                         "returns": {"type": "boolean"}},
          "required": ["name", "args", "returns"]}
PROMPTS = ["def add(a, b):", "class Point:", "import os", "for i in range(10):",
           "def main():", "if __name__ == '__main__':", "def parse(text):", "return x"]
METHODS = {"none": {}, "draft": {"draft_dir": "draft"}, "ngram": {"ngram": True},
           "medusa": {"medusa_dir": "medusa"}, "eagle3": {"eagle3_dir": "eagle3"}}


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    import torch

    from specserve.runtime.decoder import SamplingParams
    from specserve.runtime.grammar import Guide, GuideCompiler
    from specserve.runtime.loader import build_decoder, load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(DEMO / "tokenizer")
    decs = {}
    for m in args.methods.split(","):
        kw = {k: (DEMO / v if isinstance(v, str) else v) for k, v in METHODS[m].items()}
        decs[m] = build_decoder(DEMO / "target", **kw)
    vocab = decs["none"].target.cfg.vocab_size
    guide = GuideCompiler(tok, vocab, [tok.eos_token_id]).compile(
        Guide("json_schema", json.dumps(SCHEMA)))
    params = SamplingParams(max_tokens=args.max_tokens, end_id=tok.eos_token_id, guide=guide)
    rows: dict[str, dict[str, list[float]]] = {m: {"tps": [], "tau": [], "valid": [],
                                                   "same": []} for m in decs}
    for text in (PROMPTS * 4)[:args.prompts]:
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        ref: list[int] | None = None
        for m, dec in decs.items():
            start = time.time_ns()
            (res,) = dec.generate([ids], params)
            secs = max((res.last_token_time_ns - start) / 1e9, 1e-9)
            ref = res.token_ids if ref is None else ref
            r = rows[m]
            r["tps"].append(len(res.token_ids) / secs)
            r["tau"].append(res.stats.tau)
            r["valid"].append(float(_valid(tok.decode(res.token_ids))))
            r["same"].append(float(res.token_ids == ref))
    base = statistics.mean(rows["none"]["tps"])
    print("| method | tok/s (mean) | x target alone | tau | valid | equal to target |")
    print("|---|---|---|---|---|---|")
    for m, r in rows.items():
        tps = statistics.mean(r["tps"])
        print(f"| {m} | {tps:.1f} | {tps / base:.2f} | {statistics.mean(r['tau']):.2f} | "
              f"{statistics.mean(r['valid']):.0%} | {statistics.mean(r['same']):.0%} |")


if __name__ == "__main__":
    main()
