"""The ``specserve tune-schedule`` flow: a load-aware draft schedule from measured sweeps.

Input: one or more ``specserve bench --sweep`` summaries, each of an engine drafting a fixed
budget K (chain K, or Medusa tree nodes), told by the user (``K=PATH``); every sweep's baseline
phases measure no speculation. At each swept concurrency the option with the highest output
tok/s wins (no speculation included; per-user tok/s breaks ties); the winners, as batch-size
lower bounds, are the schedule (:class:`specserve.spec.schedule.DraftSchedule`).

Written for three consumers:

- specserve: ``specserve build --draft-len-schedule`` (lower bounds, key 1);
- TensorRT-LLM's PyTorch route in the pinned 1.2 semantics (``llmapi-route.md`` §1.4, hazard 1:
  each key a lower bound, key 1 required and equal to ``max_draft_len``; two-model paths only),
  and the upper-bound form of later releases (#10860, #12262) labelled as such;
- vLLM 0.32, which takes one ``num_speculative_tokens``: the K that wins at the concurrency the
  user expects, and where speculation should be off.

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


def _levels(path: Path) -> dict[int, dict[str, Any]]:
    data = read_json(path)
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not levels:
        raise SpecserveError(f"{path}: not a `specserve bench --sweep` summary (no levels)")
    try:
        return {int(lv["concurrency"]): lv for lv in levels}
    except (KeyError, TypeError, ValueError) as e:
        raise SpecserveError(f"{path}: a level without its concurrency") from e


def _tok_s(fig: dict[str, Any]) -> tuple[float, float]:
    return float(fig.get("output_token_throughput_tok_s") or 0.0), \
        float(fig.get("per_user_tok_s_mean") or 0.0)


def choose(sweeps: dict[int, dict[int, dict[str, Any]]]) -> tuple[list[dict[str, Any]],
                                                                  list[str]]:
    """Per concurrency (those every sweep has): every option's output tok/s and the winner;
    plus the flags (fixed budgets slower than no speculation). Pure."""
    common = sorted(set.intersection(*(set(s) for s in sweeps.values())))
    if not common:
        raise SpecserveError("the sweeps share no concurrency level")
    rows, flags = [], []
    for c in common:
        base = [_tok_s(s[c]["baseline"]) for s in sweeps.values()]
        options = {0: max(base)}  # the baseline phases of all sweeps: the best of them
        for k, s in sweeps.items():
            options[k] = _tok_s(s[c]["spec"])
            if options[k][0] < options[0][0]:
                flags.append(f"K={k} at concurrency {c}: {options[k][0]:.1f} output tok/s, "
                             f"{options[k][0] / options[0][0]:.2f}x no speculation "
                             f"({options[0][0]:.1f})")
        best = max(options, key=lambda k: options[k])
        rows.append({"concurrency": c, "best": best,
                     "output_tok_s": {str(k): v[0] for k, v in options.items()},
                     "per_user_tok_s": {str(k): v[1] for k, v in options.items()}})
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
    """One ``num_speculative_tokens`` per expected concurrency (vLLM 0.32 has one K)."""
    parts = [f"c={r['concurrency']}: {r['best'] or 'off'}" for r in rows]
    return ("num_speculative_tokens at the concurrency you expect (0/off = serve without "
            "speculation): " + ", ".join(parts))


def tune_schedule(cfg: TuneScheduleConfig) -> dict[str, Any]:
    """Read the sweeps, choose, and write ``cfg.out``; the report."""
    if not cfg.sweeps:
        raise SpecserveError("give at least one --from K=SWEEP")
    sweeps = {k: _levels(p) for k, p in cfg.sweeps}
    if len(sweeps) != len(cfg.sweeps):
        raise SpecserveError("--from: the same K twice")
    rows, flags = choose(sweeps)
    sched = schedule_of(rows)
    report = {"sources": {str(k): str(p) for k, p in cfg.sweeps}, "levels": rows,
              "schedule": sched.text(), "build_option": f"--draft-len-schedule {sched.text()}",
              "trtllm_pytorch": trtllm_forms(sched, int(rows[-1]["concurrency"])),
              "vllm": vllm_guidance(rows),
              "flags": flags, "files": []}
    if cfg.out is not None:
        write_json_atomic(cfg.out, report)
        report["files"] = [str(cfg.out)]
    return report
