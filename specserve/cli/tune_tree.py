"""``specserve tune-tree``: a Medusa sparse tree tuned to measured acceptance.

Parses the options into a :class:`specserve.tune_tree.TuneTreeConfig`, calls
:func:`specserve.tune_tree.tune_tree` (reads the summary or accuracies, greedy tree of
:mod:`specserve.spec.tree_tuning`, writes OUT and OUT.txt) and prints the report. Input contract:
docs/architecture.md, "tune-tree input".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.tune_tree import TuneTreeConfig, tune_tree

EXAMPLES = """
\b
Examples:
  # from a benchmark of the default tree (mc_sim_7b_63), at most 63 nodes
  specserve tune-tree --from reports/x/summary.json --nodes 63 --out trees/tuned.json
  specserve build --model M --medusa H --medusa-choices trees/tuned.json --out engines/t
\b
  # from per-head accuracies: [[rank0, rank1, ...], ...] per head (P(rank r is right)),
  # {"topk_accuracy": [[top1, top2, ...], ...]} (cumulative), or a demo eval.json
  specserve tune-tree --from acc.json --nodes 31 --out trees/t31.json --format json

Writes OUT (JSON list of lists) and OUT with suffix .txt (TensorRT-LLM brace form, one line).
--nodes is a maximum: nodes that can never be accepted (estimated accuracy 0) are left out.
"""


def _text(r: dict[str, Any]) -> str:
    lines = [f"input: {r['source']} ({r['input']}"
             + (f", {r['steps']} verify steps, measured tree {r['measured_tree']}"
                if r["steps"] else "") + ")", "per-head accuracy by rank:"]
    for h, row in enumerate(r["accuracies"]):
        lines.append(f"  head {h}: " + " ".join(f"{a:.3f}" for a in row[:10]))
    d = r["default_tree"]
    lines += [f"tuned tree: {r['nodes']} nodes, depth {r['depth']}, expected tau "
              f"{r['tau_expected']:.3f}",
              f"{d['name']}: {d['nodes']} nodes, expected tau {d['tau_expected']:.3f}"
              + (f" (measured {r['measured_tau']:.3f})" if r["measured_tau"] else ""),
              f"brace: {r['brace']}"]
    if r["files"]:
        lines.append("wrote " + ", ".join(r["files"]))
    return "\n".join(lines)


@click.command("tune-tree", epilog=EXAMPLES,
               short_help="Build a Medusa tree from measured acceptance (greedy, Medusa paper).")
@click.option("--from", "src", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="bench summary.json, or a per-head accuracy JSON.")
@click.option("--nodes", type=int, default=63, show_default=True, help="Node budget (maximum).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Tree JSON to write (brace form goes to the same name with .txt).")
@click.option("--measured-tree", default=None,
              help="Tree the summary was measured with: FILE, mc_sim_7b_63, or none "
                   "[default: the summary's medusa_choices, else mc_sim_7b_63].")
@click.option("--max-depth", type=int, default=None, help="Cap the depth (<= Medusa heads).")
@FORMAT_OPTION
def command(src: Path, nodes: int, out: Path | None, measured_tree: str | None,
            max_depth: int | None, fmt: str) -> None:
    """Tune a Medusa sparse tree for a node budget from measured acceptance."""
    emit(tune_tree(TuneTreeConfig(src, nodes, out, measured_tree, max_depth)), fmt, _text)
