"""Predicted Outputs on the code-edit set (docs/results.md, "On which
prompts?"): per-user tokens/s at concurrency 1 of the demo target with and without each
request's ``prediction``, in one process (the reference engine, no server: what the
prediction changes is the decoder's steps, which this isolates).

Records come from :mod:`specserve.client.edit_dataset` (the demo corpus's held-out files; one
argument renamed; the prediction is the unedited body). Every record runs greedily through
each decoder in turn (so load from other processes hits them alike): plain (the target
alone), ``prediction`` (the target + the prediction, no engine proposer), and with
``--ngram K`` also the n-gram engine alone and with the prediction. Per-user tok/s of a
request = generated tokens / (last token time - submit time); the table gives the mean over
records, the ratio to plain, tau, accepted_prediction_tokens, and checks that every output
equals plain decoding's (greedy is lossless) and (plain+prediction, where every draft is a
prediction draft) that accepted_prediction_tokens equals the verifier's count of accepted
drafts.

``--prediction`` picks what the client predicts: ``original`` (default; the unedited function
body, the dataset's ``prediction``) or ``previous`` (the model's own answer to the unedited
request, i.e. the same prompt with the original ``def`` line: the client re-asks after a small
edit and predicts the answer it got last time). The demo target is a small base LM that does
not copy a function from its context, so only ``previous`` resembles what it writes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/predicted_outputs.py --records 16 --ngram 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"


def _run(dec: Any, ids: list[int], params: Any) -> tuple[Any, float]:
    start = time.time_ns()
    (res,) = dec.generate([ids], params)
    return res, len(res.token_ids) / max((res.last_token_time_ns - start) / 1e9, 1e-9)


def _server_check(key: str, xs: list[dict[str, Any]]) -> str:
    """plain+prediction: the reported accepted_prediction_tokens against the verifier's own
    count of accepted drafts (every draft is a prediction draft there): records equal / all."""
    if key != "plain+prediction":
        return "-"
    same = sum(x["accepted_prediction_tokens"] == x["accepted_drafts"] for x in xs)
    return f"{same}/{len(xs)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEMO / "corpus.json"))
    ap.add_argument("--model", default=str(DEMO / "target"))
    ap.add_argument("--tokenizer", default=str(DEMO / "tokenizer"))
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ngram", type=int, default=0, help="also the n-gram engine (K drafts)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prediction", choices=("original", "previous"), default="original")
    ap.add_argument("--json", help="write the per-record results here")
    a = ap.parse_args()

    import torch

    from specserve.client.edit_dataset import load_edit_records
    from specserve.runtime.decoder import SamplingParams, SpecDecoder
    from specserve.runtime.loader import load_tokenizer
    from specserve.runtime.model import load_model
    from specserve.runtime.proposers import NgramProposer

    torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.tokenizer)
    target = load_model(a.model).decode_layout()
    decoders = {"plain": SpecDecoder(target)}
    if a.ngram:
        decoders["ngram"] = SpecDecoder(target, NgramProposer(a.ngram))
    recs = load_edit_records(a.corpus, a.records, a.seed, a.max_tokens)
    rows: dict[str, list[dict[str, Any]]] = {}
    warm = tok(recs[0].prompt)["input_ids"]
    decoders["plain"].generate([warm], SamplingParams(max_tokens=8))  # warm-up
    for r in recs:
        ids = list(tok(r.prompt)["input_ids"])
        base = SamplingParams(max_tokens=r.max_tokens, end_id=None)
        if a.prediction == "original":
            pred = tuple(tok(r.prediction, add_special_tokens=False)["input_ids"])
        else:  # the answer to the unedited request: the prompt's last line is the def line
            head, _, _ = r.prompt.rpartition("\n")
            before = list(tok(head + "\n" + r.prompt.split("\n", 1)[0])["input_ids"])
            pred = tuple(decoders["plain"].generate([before], base)[0].token_ids)
        want = None
        for name, dec in decoders.items():
            for with_pred in (False, True):
                p = SamplingParams(max_tokens=r.max_tokens, end_id=None,
                                   prediction=pred) if with_pred else base
                res, rate = _run(dec, ids, p)
                want = res.token_ids if want is None else want
                key = f"{name}+prediction" if with_pred else name
                rows.setdefault(key, []).append({
                    "source": r.source, "tok_s": rate, "tokens": len(res.token_ids),
                    "tau": res.stats.tau, "equal_plain": res.token_ids == want,
                    "accepted_drafts": int(res.stats.accepted_tokens),
                    "accepted_prediction_tokens": res.accepted_prediction_tokens,
                    "rejected_prediction_tokens": res.rejected_prediction_tokens})
    plain = statistics.mean(x["tok_s"] for x in rows["plain"])
    print(f"{len(recs)} code-edit records, c=1, greedy, {a.max_tokens} tokens each, "
          f"{a.threads} thread(s)")
    print(f"{'decoder':<20} {'tok/s/user':>10} {'x plain':>8} {'tau':>6} {'acc.pred':>9} "
          f"{'equal':>6} {'acc=server':>10}")
    for key, xs in rows.items():
        rate = statistics.mean(x["tok_s"] for x in xs)
        acc = [x["accepted_prediction_tokens"] for x in xs
               if x["accepted_prediction_tokens"] is not None]
        print(f"{key:<20} {rate:>10.1f} {rate / plain:>8.2f} "
              f"{statistics.mean(x['tau'] for x in xs):>6.2f} "
              f"{(statistics.mean(acc) if acc else 0):>9.1f} "
              f"{sum(x['equal_plain'] for x in xs):>3}/{len(xs)} {_server_check(key, xs):>10}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
