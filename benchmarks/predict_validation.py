"""Check ``specserve predict`` against the reference decoder, and a tuned Medusa tree against
the default one.

For each proposer (draft chain, Medusa tree) the same prompts are decoded at T=0 with and
without speculation, interleaved prompt by prompt so machine load hits both alike. Measured
speedup = baseline decode seconds per token / speculative decode seconds per token (prefill
excluded; per prompt the fastest of ``--rounds`` decodes). Predicted speedup =
``tau * T(1) / (T_propose + T_verify(n))`` with T(n) timed by ``specserve predict --measure``'s
timer (min of ``--reps``) and tau from the run's own AcceptanceStats. Then
``tune-tree``'s greedy tree is built from the Medusa run's accepted nodes and decoded the same
way. Writes JSON to ``--out`` and prints a markdown table.

    .venv/bin/python benchmarks/predict_validation.py --ckpt checkpoints/demo --out reports/p6.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from specserve.config import write_json_atomic
from specserve.runtime.loader import build_decoder, load_tokenizer
from specserve.runtime.params import SamplingParams
from specserve.runtime.timing import STATS, measure_step_times
from specserve.spec import predictor as P
from specserve.spec import tree_tuning as TT
from specserve.spec.stats import AcceptanceStats
from specserve.spec.tree import MC_SIM_7B_63

PROMPTS = [
    "def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n", "class Stack:\n    def",
    "for i in range(10):\n", "def read_file(path):\n    with open(", "if __name__ == '__main__':",
    "def add(a, b):\n    return", "    def __init__(self, x, y):\n",
]


def decode_pair(base: Any, spec: Any, prompts: list[list[int]], max_tokens: int,
                rounds: int) -> dict[str, Any]:
    """Decode every prompt ``rounds`` times with each decoder, alternating; per prompt keep the
    fastest decode (the least disturbed by other load), then sum over prompts."""
    sec = {"base": 0.0, "spec": 0.0}
    toks = {"base": 0, "spec": 0}
    stats = AcceptanceStats()
    params = SamplingParams(max_tokens=max_tokens)
    for ids in prompts:
        best = {"base": float("inf"), "spec": float("inf")}
        for _ in range(rounds):
            for name, dec in (("base", base), ("spec", spec)):
                (res,) = dec.generate([ids], params)
                best[name] = min(best[name],
                                 (res.last_token_time_ns - res.first_token_time_ns) / 1e9)
                n_tok = len(res.token_ids) - 1
                last = res
        stats = stats.merge(last.stats)  # T=0: every round gives the same stats
        for name in sec:
            sec[name] += best[name]
            toks[name] += n_tok
    s_base, s_spec = sec["base"] / toks["base"], sec["spec"] / toks["spec"]
    return {"base_tok_s": 1 / s_base, "spec_tok_s": 1 / s_spec, "measured_speedup": s_base / s_spec,
            "stats": stats}


def predicted(kind: str, k: int, n_verify: int, tau: float, ckpt: Path, kv_len: int,
              reps: int) -> dict[str, Any]:
    """Predicted speedup from T(n) timed here: with the min (default of ``specserve predict
    --measure``) and with the median of the timed calls."""
    m = measure_step_times(ckpt / "target", [n_verify], batch=1, kv_len=kv_len, reps=reps,
                           draft_dir=ckpt / "draft" if kind == "draft" else None,
                           medusa_dir=ckpt / "medusa" if kind == "medusa" else None)
    out: dict[str, Any] = {}
    for stat in ("min", "median"):
        t = {key: float(STATS[stat](v)) for key, v in m["samples_s"].items()}
        step = t["draft"] if kind == "draft" else t["heads"]
        pt = P.speedup_point(k, tau, P.Proposer(kind, step), {1: t["t1"], n_verify:
                             t[f"t{n_verify}"]}, n_verify)
        sfx = "" if stat == "min" else "_median"
        out.update({f"predicted_speedup{sfx}": pt.speedup, f"t1_ms{sfx}": pt.baseline_s * 1e3,
                    f"t_verify_ms{sfx}": pt.verify_s * 1e3,
                    f"t_propose_ms{sfx}": pt.propose_s * 1e3})
    return out


def row(name: str, kind: str, k: int, n_verify: int, run: dict[str, Any], ckpt: Path,
        kv_len: int, reps: int) -> dict[str, Any]:
    st: AcceptanceStats = run.pop("stats")
    out = {"name": name, "kind": kind, "k": k, "n_verify": n_verify, "tau": st.tau, **run,
           **predicted(kind, k, n_verify, st.tau, ckpt, kv_len, reps)}
    out["error"] = out["predicted_speedup"] / out["measured_speedup"] - 1
    out["stats"] = st.to_dict()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, required=True, help="dir with target/, draft/, medusa/")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15, help="timed calls per T(n) (min kept)")
    ap.add_argument("--rounds", type=int, default=3, help="decodes per prompt (min kept)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budgets", default="63,31", help="tuned-tree node budgets")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.ckpt / "target")
    prompts = [list(tok(p)["input_ids"]) for p in PROMPTS]
    kv_len = sum(map(len, prompts)) // len(prompts) + a.max_tokens // 2
    base = build_decoder(a.ckpt / "target")

    def run(name: str, kind: str, dec: Any, k: int, n_verify: int) -> dict[str, Any]:
        pair = decode_pair(base, dec, prompts, a.max_tokens, a.rounds)
        return row(name, kind, k, n_verify, pair, a.ckpt, kv_len, a.reps)

    draft = build_decoder(a.ckpt / "target", draft_dir=a.ckpt / "draft", max_draft_len=a.k)
    rows = [run("draft", "draft", draft, a.k, a.k + 1)]
    med = build_decoder(a.ckpt / "target", medusa_dir=a.ckpt / "medusa")
    default = med.proposer.tree  # type: ignore[union-attr]
    rows.append(run("medusa mc_sim_7b_63", "medusa", med, default.depth, default.num_nodes + 1))
    st = rows[-1]["stats"]
    counts = TT.parse_accepted_nodes(st["accepted_nodes"], "run")
    acc = TT.accuracies_from_accepted_nodes(counts, st["steps"], default.choices)
    for budget in (int(b) for b in a.budgets.split(",")):
        tuned = TT.greedy_tree(acc, budget)
        dec = build_decoder(a.ckpt / "target", medusa_dir=a.ckpt / "medusa",
                            medusa_choices=[list(c) for c in tuned.choices])
        tree = dec.proposer.tree  # type: ignore[union-attr]
        r = run(f"medusa tuned <= {budget}", "medusa", dec, tree.depth, tree.num_nodes + 1)
        r["tau_expected"] = tuned.tau
        r["medusa_choices"] = tree.to_list()
        rows.append(r)
    rows[1]["tau_expected"] = TT.expected_tau(default.choices, acc)
    write_json_atomic(a.out, {"kv_len": kv_len, "threads": a.threads, "rows": rows,
                              "default_tree_nodes": len(MC_SIM_7B_63)})
    print("| run | n verify | tau | base tok/s | spec tok/s | measured S | predicted S (min) | err "
          "| predicted S (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['n_verify']} | {r['tau']:.2f} | {r['base_tok_s']:.1f} | "
              f"{r['spec_tok_s']:.1f} | {r['measured_speedup']:.2f} | "
              f"{r['predicted_speedup']:.2f} | {r['error']:+.0%} | "
              f"{r['predicted_speedup_median']:.2f} |")


if __name__ == "__main__":
    main()
