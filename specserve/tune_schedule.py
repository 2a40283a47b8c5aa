"""The ``specserve tune-schedule`` flow: a load-aware draft schedule from measured sweeps.

Input: one or more ``specserve bench --sweep`` summaries, each of an engine drafting a fixed
budget K (chain K, or Medusa tree nodes), told by the user (``K=PATH``); every sweep's baseline
phases measure no speculation. At each swept concurrency the option with the highest output
tok/s wins (no speculation included; per-user tok/s breaks ties); the winners, as batch-size
lower bounds, are the schedule (:class:`specserve.spec.schedule.DraftSchedule`).

Written for three consumers:

- specserve: ``specserve build --draft-len-schedule`` (lower bounds, key 1);
- TensorRT-LLM's PyTorch route in the pinned 1.2 semantics (each key a lower bound, key 1
  required and equal to ``max_draft_len``; two-model paths only), and the upper-bound form of
  later releases (NVIDIA/TensorRT-LLM #10860, #12262) labelled as such;
- vLLM 0.32: ``speculative_config.num_speculative_tokens_per_batch_size``, inclusive
  ``(range_start, range_end, num_speculative_tokens)`` batch-size ranges from 1, K >= 0, the last
  K carried past the last range (``vllm/config/speculative.py`` and
  ``vllm/v1/spec_decode/dynamic/utils.py``), with ``num_speculative_tokens`` its largest K;
- SGLang, which takes one static setting (``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``): the setting that wins at
  each concurrency, for the load the user expects.

Upstream names and their sources: ``tests/data/schedule_engine_keys.json``.

Sweeps with a context axis (``bench --sweep --input-lengths``) give a schedule per input length
(``by_context``). No engine here takes a (batch, context) table (vLLM's
``num_speculative_tokens_per_seq_len`` is PR #54801, open; TensorRT-LLM and SGLang have no context
axis; specserve's schedule keys on batch size), so every engine gets the batch-only schedule of
one length (``context``: the smallest measured length at or above the expected one, else the
longest) with :data:`CONTEXT_CAVEAT`; the other lengths' schedules are there to deploy per pool.

Fixed-length configurations slower than no speculation are flagged with their ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import read_json, write_json_atomic
from specserve.errors import SpecserveError
from specserve.spec.schedule import DraftSchedule


@dataclass(frozen=True)
class TuneScheduleConfig:
    """``sweeps``: (budget K, sweep summary.json) pairs; ``out``: JSON to write (optional)."""

    sweeps: tuple[tuple[int, Path], ...]
    out: Path | None = None
    context: int | None = None      # the input length the deployment expects (context sweeps)


CONTEXT_CAVEAT = (
    "batch-only: specserve's --draft-len-schedule, TensorRT-LLM's draft_len_schedule (1.2, 1.3), "
    "vLLM 0.32's num_speculative_tokens_per_batch_size and SGLang's static flags take no context "
    "length (vLLM num_speculative_tokens_per_seq_len is PR #54801, open); this schedule was "
    "measured at {length} input tokens: serve other lengths from a pool with their own schedule "
    "(by_context) or route by prompt length")


def parse_source(text: str) -> tuple[int, Path]:
    """``4=reports/sweep/summary.json`` -> (4, path); a directory means its summary.json."""
    k, sep, path = text.partition("=")
    try:
        budget = int(k)
    except ValueError as e:
        raise SpecserveError(f"--from {text!r}: expected K=SWEEP (the sweep's draft budget, "
                             "e.g. 4=reports/sweep)") from e
    if not sep or budget < 1:
        raise SpecserveError(f"--from {text!r}: expected K=SWEEP with K >= 1")
    p = Path(path)
    return budget, p / "summary.json" if p.is_dir() else p


Cell = tuple[int | None, int]   # (input length or None, concurrency)


def _levels(path: Path) -> dict[Cell, dict[str, Any]]:
    data = read_json(path)
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not levels:
        raise SpecserveError(f"{path}: not a `specserve bench --sweep` summary (no levels)")
    try:
        return {(None if lv.get("input_length") is None else int(lv["input_length"]),
                 int(lv["concurrency"])): lv for lv in levels}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SpecserveError(f"{path}: a level without its concurrency") from e


def _tok_s(fig: dict[str, Any]) -> tuple[float, float]:
    return float(fig.get("output_token_throughput_tok_s") or 0.0), \
        float(fig.get("per_user_tok_s_mean") or 0.0)


def choose(sweeps: dict[int, dict[Cell, dict[str, Any]]]) -> tuple[list[dict[str, Any]],
                                                                   list[str]]:
    """Per (input length, concurrency) cell every sweep has: every option's output tok/s and the
    winner; plus the flags (fixed budgets slower than no speculation). Pure."""
    common = sorted(set.intersection(*(set(s) for s in sweeps.values())),
                    key=lambda lc: (lc[0] or 0, lc[1]))
    if not common:
        raise SpecserveError("the sweeps share no concurrency level")
    rows, flags = [], []
    for cell in common:
        length, c = cell
        at = "" if length is None else f" and {length} input tokens"
        base = [_tok_s(s[cell]["baseline"]) for s in sweeps.values()]
        options = {0: max(base)}  # the baseline phases of all sweeps: the best of them
        for k, s in sweeps.items():
            options[k] = _tok_s(s[cell]["spec"])
            if options[k][0] < options[0][0]:
                flags.append(f"K={k} at concurrency {c}{at}: {options[k][0]:.1f} output tok/s, "
                             f"{options[k][0] / options[0][0]:.2f}x no speculation "
                             f"({options[0][0]:.1f})")
        best = max(options, key=lambda k: options[k])
        row = {"concurrency": c, "best": best,
               "output_tok_s": {str(k): v[0] for k, v in options.items()},
               "per_user_tok_s": {str(k): v[1] for k, v in options.items()}}
        rows.append(row if length is None else {"input_length": length, **row})
    return rows, flags


def schedule_of(rows: list[dict[str, Any]]) -> DraftSchedule:
    """Winners as lower bounds: key 1 takes the smallest level's, equal neighbours merge."""
    pts: list[tuple[int, int]] = []
    for i, r in enumerate(rows):
        key = 1 if i == 0 else int(r["concurrency"])
        if not pts or pts[-1][1] != r["best"]:
            pts.append((key, int(r["best"])))
    return DraftSchedule(tuple(pts))


def trtllm_forms(s: DraftSchedule, largest: int) -> dict[str, Any]:
    """The schedule for TensorRT-LLM's ``speculative_config``: 1.2 (lower bounds; key 1 =
    ``max_draft_len``) and later releases (upper bounds, 0 above the largest key; the last
    drafting range ends at ``largest``, the largest concurrency measured)."""
    pts = list(s.points)
    upper: dict[str, int] = {}
    for (_, k), nxt in zip(pts, [*pts[1:], None], strict=True):
        if k > 0:
            upper[str(largest if nxt is None else nxt[0] - 1)] = k
    return {
        "1.2": {"max_draft_len": pts[0][1], "draft_len_schedule": {str(b): k for b, k in pts},
                "note": "two-model paths only in 1.2; keys are lower bounds, key 1 required"},
        "later": {"draft_len_schedule": upper,
                  "note": "from #10860/#12262 each key is an upper bound, 0 above the largest "
                          f"(measured up to concurrency {largest})"},
    }


def vllm_guidance(rows: list[dict[str, Any]]) -> str:
    """The winner per concurrency, in words (the table itself: :func:`vllm_config`)."""
    parts = [f"c={r['concurrency']}: {r['best'] or 'off'}" for r in rows]
    return ("num_speculative_tokens per concurrency (off = no speculation; as "
            "speculative_config.num_speculative_tokens_per_batch_size in vllm_config): "
            + ", ".join(parts))


def vllm_config(s: DraftSchedule, largest: int) -> dict[str, Any]:
    """vLLM 0.32's ``speculative_config`` fields for the schedule: inclusive batch-size ranges
    ``[start, end, K]`` from 1 (the last range ends at ``largest``, the largest concurrency
    measured; vLLM carries its K on), ``num_speculative_tokens`` = the largest K (vLLM requires
    it > 0); ``{}`` when no K > 0 wins anywhere (serve without speculation)."""
    pts = list(s.points)
    top = max(k for _, k in pts)
    if top == 0:
        return {}
    ranges = [[b, (nxt[0] - 1) if nxt else max(largest, b), k]
              for (b, k), nxt in zip(pts, [*pts[1:], None], strict=True)]
    return {"num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": ranges}


def sglang_flags(rows: list[dict[str, Any]]) -> dict[str, str]:
    """SGLang's one static setting per concurrency (a chain of K: K steps, top-k 1, K + 1 draft
    tokens with the root, as SGLang's launch examples pair them); off = no
    ``--speculative-algorithm``."""
    return {str(r["concurrency"]): (
        f"--speculative-num-steps {r['best']} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {r['best'] + 1}" if r["best"] else "off")
        for r in rows}


def engine_forms(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every engine's schedule for the rows of one context (or a batch-only sweep)."""
    sched = schedule_of(rows)
    largest = int(rows[-1]["concurrency"])
    return {"schedule": sched.text(), "build_option": f"--draft-len-schedule {sched.text()}",
            "trtllm_pytorch": trtllm_forms(sched, largest), "vllm": vllm_guidance(rows),
            "vllm_config": vllm_config(sched, largest), "sglang": sglang_flags(rows)}


def context_bucket(lengths: list[int], expected: int | None) -> int:
    """The measured length whose schedule to deploy: the smallest at or above ``expected``,
    else the longest (also when nothing is expected)."""
    at_or_above = [n for n in lengths if expected is not None and n >= expected]
    return min(at_or_above) if at_or_above else max(lengths)


def tune_schedule(cfg: TuneScheduleConfig) -> dict[str, Any]:
    """Read the sweeps, choose, and write ``cfg.out``; the report."""
    if not cfg.sweeps:
        raise SpecserveError("give at least one --from K=SWEEP")
    sweeps = {k: _levels(p) for k, p in cfg.sweeps}
    if len(sweeps) != len(cfg.sweeps):
        raise SpecserveError("--from: the same K twice")
    rows, flags = choose(sweeps)
    lengths = sorted({r["input_length"] for r in rows if "input_length" in r})
    if cfg.context is not None and not lengths:
        raise SpecserveError("--context needs sweeps with --input-lengths")
    extra: dict[str, Any] = {}
    if lengths:
        by = {n: engine_forms([r for r in rows if r.get("input_length") == n]) for n in lengths}
        pick = context_bucket(lengths, cfg.context)
        forms = by[pick]
        extra = {"by_context": {str(n): f for n, f in by.items()},
                 "context": {"input_length": pick, "expected": cfg.context,
                             "caveat": CONTEXT_CAVEAT.format(length=pick)}}
    else:
        forms = engine_forms(rows)
    report = {"sources": {str(k): str(p) for k, p in cfg.sweeps}, "levels": rows, **forms,
              **extra, "flags": flags, "files": []}
    if cfg.out is not None:
        write_json_atomic(cfg.out, report)
        report["files"] = [str(cfg.out)]
    return report
