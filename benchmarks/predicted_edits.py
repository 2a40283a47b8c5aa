"""Predicted Outputs on real code edits with the real model: per-user tokens/s at c = 1, T = 0,
of the reference engine with each request's ``prediction`` (the unedited code) against the same
engine without it, in one process (docs/methods/predicted-outputs.md).

Records: :mod:`specserve.client.code_edits` (standard-library functions and HumanEval's
canonical solutions, one edit asked each, "Return the full updated function."), chat template
applied, ``max_tokens`` room for the whole function, ending at the end-of-turn token. Engines:
``plain`` (the target alone) and ``ngram`` (prompt lookup, ``--k`` drafts), each without a
prediction and with one at every ``--chunks`` size (the most prediction drafts a step,
``num_draft_tokens``: a long verify step costs more than a plain one on a CPU, so a shorter
chunk may pay more; 16 is the engine's own cap). All runs of one record are interleaved, so a
noisy neighbour slows them alike. Per record: tok/s = generated tokens / (last token time -
submit time) and its ratio to the same engine without the prediction; the table gives the
median and range of the ratios over records. Checks: every output equals plain decoding's
token for token; ``accepted_prediction_tokens`` equals the client's own recount from the emitted
tokens and the prediction (:mod:`specserve.client.prediction_usage`); the edit rate is how many
answers made the asked edit (and made nothing else: the reference edit's syntax tree). The JSON
is rewritten after every record; ``--offset``/``--records`` split the set over processes and
``--summarize A.json B.json`` prints the table of the parts joined.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/predicted_edits.py --chunks 16,8,4 \\
        --json reports/predicted-edits.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    """One record, ready to run: prompt ids, prediction ids, max_tokens."""

    source: str
    kind: str
    ids: list[int]
    pred: tuple[int, ...]
    max_tokens: int


def _decoders(model: Path, k: int) -> dict[str, Any]:
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.loader import build_decoder
    from specserve.runtime.proposers import NgramProposer

    plain = build_decoder(model)
    return {"plain": plain, "ngram": SpecDecoder(plain.target, NgramProposer(k))}


def _cases(recs: list[Any], tok: Any) -> list[Case]:
    out = []
    for r in recs:
        enc: Any = tok.apply_chat_template(r.messages(), add_generation_prompt=True,
                                           tokenize=True, return_dict=True)
        pred = tuple(tok(r.prediction, add_special_tokens=False)["input_ids"])
        out.append(Case(r.source, r.edit.kind, list(enc["input_ids"]), pred, r.max_tokens))
    return out


def _run(dec: Any, ids: list[int], params: Any) -> tuple[Any, float]:
    start = time.time_ns()
    (res,) = dec.generate([ids], params)
    return res, len(res.token_ids) / max((res.last_token_time_ns - start) / 1e9, 1e-9)


def _recount(case: Case, out: list[int], engine: str, k: int, chunk: int) -> int:
    """The client's accepted_prediction_tokens; the n-gram engine's own drafts fill the
    steps where the prediction misses (replayed from prompt + output)."""
    from specserve.client.prediction_usage import accepted_prediction_tokens
    from specserve.runtime.proposers.ngram import ngram_lookup

    def ngram(at: int) -> list[int]:
        return ngram_lookup(case.ids + out[:at], min(k, chunk, case.max_tokens - at - 1))

    return accepted_prediction_tokens(out, case.pred, case.max_tokens, min(chunk, 16),
                                      ngram if engine == "ngram" else None)


def _record(case: Case, decs: dict[str, Any], chunks: list[int], k: int,
            end_id: int) -> dict[str, Any]:
    from specserve.runtime.params import SamplingParams

    row: dict[str, Any] = {"source": case.source, "kind": case.kind}
    want: list[int] | None = None
    for engine, dec in decs.items():
        res, base = _run(dec, case.ids, SamplingParams(max_tokens=case.max_tokens,
                                                      end_id=end_id))
        want = list(res.token_ids) if want is None else want
        row[engine] = {"tok_s": base, "tokens": len(res.token_ids),
                       "equal": list(res.token_ids) == want}
        for c in chunks:
            p = SamplingParams(max_tokens=case.max_tokens, end_id=end_id,
                               prediction=case.pred, num_draft_tokens=c)
            res, rate = _run(dec, case.ids, p)
            out = list(res.token_ids)
            row[f"{engine}+pred{c}"] = {
                "tok_s": rate, "x": rate / base, "tau": res.stats.tau, "equal": out == want,
                "accepted": res.accepted_prediction_tokens,
                "recount": _recount(case, out, engine, k, c)}
    row["output"] = want
    return row


def _summary(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    lines = ["| engine | chunk | median x | range | mean tau | equal to plain | "
             "accepted = client recount |", "|---|---|---|---|---|---|---|"]
    for key in keys:
        xs = [r[key] for r in rows]
        if "+pred" not in key:
            rate = statistics.median(x["tok_s"] for x in xs)
            lines.append(f"| {key} | - | 1.00 | median {rate:.1f} tok/s | - | "
                         f"{sum(x['equal'] for x in xs)}/{len(xs)} | - |")
            continue
        engine, chunk = key.split("+pred")
        ratios = [x["x"] for x in xs]
        lines.append(f"| {engine} | {chunk} | {statistics.median(ratios):.2f}x | "
                     f"{min(ratios):.2f}-{max(ratios):.2f}x | "
                     f"{statistics.mean(x['tau'] for x in xs):.2f} | "
                     f"{sum(x['equal'] for x in xs)}/{len(xs)} | "
                     f"{sum(x['accepted'] == x['recount'] for x in xs)}/{len(xs)} |")
    return lines


def _mark_edit(row: dict[str, Any], rec: Any, tok: Any) -> None:
    from specserve.client.code_edits import edit_made, same_as_reference

    text = tok.decode(row["output"], skip_special_tokens=True)
    row["edit_made"] = edit_made(text, rec.edit)
    row["same_as_reference"] = same_as_reference(text, rec)


def _edits(rows: list[dict[str, Any]]) -> str:
    from collections import Counter

    made: Counter[str] = Counter()
    exact: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for row in rows:
        for key in (row["kind"], "all"):
            total[key] += 1
            made[key] += row["edit_made"]
            exact[key] += row["same_as_reference"]
    return "edit made (and nothing else: the reference edit): " + ", ".join(
        f"{k} {made[k]}/{total[k]} ({exact[k]})" for k in sorted(total))


def report(rows: list[dict[str, Any]]) -> str:
    """The table and the edit rate of per-record ``rows`` (one run's, or shards' joined)."""
    keys = [k for k, v in rows[0].items() if isinstance(v, dict) and all(k in r for r in rows)]
    return "\n".join([f"{len(rows)} code edits, c=1, T=0", *_summary(rows, keys), _edits(rows)])


def _measure(a: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoTokenizer

    from specserve.client.code_edits import build_code_edits
    from specserve.runtime.params import SamplingParams

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(str(a.model))
    recs = build_code_edits(a.humaneval if a.humaneval.is_file() else None, a.per_source)
    recs = recs[a.offset:a.offset + a.records] if a.records else recs[a.offset:]
    cases, decs = _cases(recs, tok), _decoders(a.model, a.k)
    chunks = [int(c) for c in a.chunks.split(",")]
    for d in decs.values():  # warm-up
        d.generate([cases[0].ids], SamplingParams(max_tokens=8))
    rows = []
    for i, (case, rec) in enumerate(zip(cases, recs, strict=True)):
        rows.append(_record(case, decs, chunks, a.k, tok.eos_token_id))
        _mark_edit(rows[-1], rec, tok)
        if a.json is not None:  # after every record: a long run stopped keeps what it measured
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
        print(f"record {i + 1}/{len(cases)} {case.source} done", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "smollm2")
    ap.add_argument("--humaneval", type=Path,
                    default=ROOT / ".cache" / "data" / "HumanEval.jsonl.gz")
    ap.add_argument("--per-source", type=int, default=24)
    ap.add_argument("--offset", type=int, default=0, help="skip the first N records")
    ap.add_argument("--records", type=int, default=0, help="only N records (0: all)")
    ap.add_argument("--k", type=int, default=4, help="n-gram drafts per step")
    ap.add_argument("--chunks", default="16", help="prediction drafts per step, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="per-record results (JSON)")
    ap.add_argument("--summarize", type=Path, nargs="+", default=None,
                    help="measure nothing: the table of these --json files joined (shards)")
    a = ap.parse_args()
    if a.summarize:
        rows = [r for f in a.summarize for r in json.loads(f.read_text(encoding="utf-8"))]
    else:
        rows = _measure(a)
        print(f"{a.threads} thread(s), {platform.processor() or platform.machine()}, "
              f"{time.strftime('%Y-%m-%d')}")
    print(report(rows))


if __name__ == "__main__":
    main()
