"""The demo's speculation methods served side by side on one Triton server, compared pairwise in
interleaved runs (``make bench-methods``).

One model repository holds the EAGLE-3 engine's ``ensemble`` (and ``ensemble_baseline``, no
speculation) plus an ensemble per other method (``ensemble_draft``, ``ensemble_ngram``,
``ensemble_medusa``: copies of the ``tensorrt_llm`` model pointed at that method's torch engine).
Each comparison is one ``specserve bench`` run that interleaves the two variants request by
request (``--model A --baseline-model B``), so both see the same machine state: its per-user
speedup (A over B, with the bootstrap interval) is the figure, not the absolute tok/s. T = 0
unless ``--temperature``, ``--end-id -1`` (every answer has ``--max-tokens`` tokens), builtin
code prompts.

    .venv/bin/python benchmarks/methods.py --work reports/methods
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"
OTHERS = ("draft", "ngram", "medusa")


def _peers() -> Any:
    spec = importlib.util.spec_from_file_location("peers", Path(__file__).with_name("peers.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_repo(work: Path, eagle3: Path, eagle3_k: int = 4, demo: Path = DEMO,
              chain_k: int = 4) -> Path:
    """The EAGLE-3 engine's repository plus one tensorrt_llm model + ensemble per method."""
    peers = _peers()
    engines = {k: work / f"engine-{k}" for k in ("eagle3", *OTHERS)}
    for kind, path in engines.items():
        peers.build_engine(kind, path, eagle3, eagle3_k, demo, chain_k)
    repo = work / "repo"
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine",
                    str(engines["eagle3"]), "--out", str(repo), "--baseline", "--force"],
                   check=True, capture_output=True)
    for kind in OTHERS:
        llm, ens = repo / f"tensorrt_llm_{kind}", repo / f"ensemble_{kind}"
        for src, dst in ((repo / "tensorrt_llm", llm), (repo / "ensemble", ens)):
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst)
        cfg = (llm / "config.pbtxt").read_text()
        cfg = cfg.replace('name: "tensorrt_llm"', f'name: "tensorrt_llm_{kind}"', 1)
        cfg = re.sub(r'(key: "gpt_model_path" value: \{ string_value: )"[^"]*"',
                     rf'\1"{engines[kind]}"', cfg)
        (llm / "config.pbtxt").write_text(cfg)
        e = (ens / "config.pbtxt").read_text()
        e = e.replace('name: "ensemble"', f'name: "ensemble_{kind}"', 1)
        e = e.replace('model_name: "tensorrt_llm"', f'model_name: "tensorrt_llm_{kind}"')
        (ens / "config.pbtxt").write_text(e)
    return repo


def compare(args: argparse.Namespace, url: str, a: str, b: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--url", url, "--model", a,
           "--baseline-model", b, "--prompts", "builtin-code", "--concurrency",
           str(args.concurrency), "--requests", str(args.requests), "--warmup", "4",
           "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
           "--seed", "0", "--end-id", "-1",
           "--out", str(out), "--format", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 1):
        sys.exit(f"bench {a} vs {b} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    s = json.loads(proc.stdout)
    va, vb = s["variants"]["spec"], s["variants"]["baseline"]
    sp = (s.get("speedup") or {}).get("per_user_tok_s") or {}

    def tau(v: dict[str, Any]) -> float | None:
        acc = v.get("acceptance") or {}
        return acc.get("tau_server") or acc.get("tau_stream")

    return {"a": a, "b": b, "per_user_a": va["per_user_tok_s"]["mean"],
            "per_user_b": vb["per_user_tok_s"]["mean"], "speedup": sp.get("speedup"),
            "ci": [sp.get("ci_low"), sp.get("ci_high")], "tau_a": tau(va), "tau_b": tau(vb)}


def main() -> None:
    from specserve.triton.server import TritonServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "methods")
    ap.add_argument("--demo", type=Path, default=DEMO,
                    help="the demo checkpoint (target/, draft/, medusa/, eagle3/)")
    ap.add_argument("--eagle3", type=Path, default=None, help="[default: DEMO/eagle3]")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="T > 0: every method's lossless sampled path (Medusa: its chain)")
    ap.add_argument("--eagle3-k", type=int, default=4, help="EAGLE-3 chain length")
    ap.add_argument("--chain-k", type=int, default=4, help="the draft model's and n-gram's K")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    repo = make_repo(args.work, args.eagle3 or args.demo / "eagle3", args.eagle3_k, args.demo,
                     args.chain_k)
    srv = TritonServer(repo, log_path=args.work / "triton.log").start(timeout_s=300)
    rows = []
    try:
        for b in ("ensemble_baseline", *(f"ensemble_{k}" for k in OTHERS)):
            r = compare(args, srv.grpc_url, "ensemble", b, args.work / f"eagle3-vs-{b}")
            rows.append(r)
            print(f"eagle3 vs {b}: per-user {r['per_user_a']:.1f} / {r['per_user_b']:.1f} "
                  f"tok/s, speedup {r['speedup']} {r['ci']}, tau {r['tau_a']} / {r['tau_b']}",
                  flush=True)
    finally:
        srv.stop()
    (args.work / "methods.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
