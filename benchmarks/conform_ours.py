"""``make conform``: ``specserve conform`` against our engine on Triton, every method, both
front doors. For each method (draft, ngram, medusa, eagle3; the demo pair, torch engines built
as ``benchmarks/peers.py`` builds them) one repository with ``--baseline`` and one
tritonserver; the speculative ``ensemble`` is compared with ``ensemble_baseline`` (the same
engine, speculation off) over gRPC and over HTTP. The "none" row is ``ensemble_baseline``
against itself. For draft and n-gram also ``tensorrt_llm_bls`` with ``num_draft_tokens`` 4
(its own speculation loop, "draft-bls" / "ngram-bls"). Matrices go to
``WORK/ours-METHOD-PROTOCOL/``, the pivot to ``WORK/ours.md``.

    .venv/bin/python benchmarks/conform_ours.py --work reports/conform
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
DEMO = ROOT / "checkpoints" / "demo"
BLS_KINDS = ("draft", "ngram")   # tensorrt_llm_bls drafts itself (draft model or prompt lookup)


def conform(args: argparse.Namespace, method: str, protocol: str, url: str, model: str,
            limit: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    out = args.work / f"ours-{method}-{protocol}"
    cmd = [sys.executable, "-m", "specserve.cli.main", "conform", "--url", url,
           "--protocol", protocol, "--model", model, "--baseline-model", "ensemble_baseline",
           "--method", method, "--engine", "specserve-torch",
           "--tokenizer", str(DEMO / "tokenizer"), "--context-limit", str(limit),
           "--samples", str(args.samples), "--budget-s", str(args.budget_s),
           "--out", str(out), "--format", "json", *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_s + 900)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"conform {method} {protocol} failed ({proc.returncode}): "
                         f"{proc.stderr[-1500:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    print(report["summary"], f"\n({time.time() - t0:.0f} s)", flush=True)
    return report


def main() -> None:
    from peers import build_engine  # benchmarks/peers.py: the same torch engines

    from specserve.conform.matrix import pivot, row_from_dict
    from specserve.engine_record import read_engine_record
    from specserve.triton.server import TritonServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "conform")
    ap.add_argument("--only", default=None, help="comma-separated methods")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=600.0, help="per method and protocol")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    rows: list[dict[str, Any]] = []
    for kind in ("draft", "ngram", "medusa", "eagle3"):
        if only and kind not in only and not (kind == "draft" and "none" in only):
            continue
        engine, repo = args.work / "engines" / kind, args.work / f"repo-{kind}"
        build_engine(kind, engine, DEMO / "eagle3")
        subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine",
                        str(engine), "--out", str(repo), "--baseline", "--force"], check=True,
                       capture_output=True)
        limit = read_engine_record(engine).max_input_len
        srv = TritonServer(repo, log_path=args.work / f"triton-{kind}.log").start(timeout_s=600)
        try:
            for protocol in args.protocols.split(","):
                url = srv.grpc_url if protocol == "grpc" else srv.http_url
                if kind == "draft" and (not only or "none" in only):
                    print(f"== none ({protocol})", flush=True)
                    rows += conform(args, "none", protocol, url, "ensemble_baseline",
                                    limit)["rows"]
                if only and kind not in only:
                    continue
                print(f"== {kind} ({protocol})", flush=True)
                rows += conform(args, kind, protocol, url, "ensemble", limit)["rows"]
                if kind in BLS_KINDS:   # the BLS's own speculation loop, K = 4
                    print(f"== {kind}-bls ({protocol})", flush=True)
                    rows += conform(args, f"{kind}-bls", protocol, url, "tensorrt_llm_bls",
                                    limit, ("--num-draft-tokens", "4"))["rows"]
                (args.work / "ours-rows.json").write_text(json.dumps(rows, indent=1))
        finally:
            srv.stop()
    (args.work / "ours-rows.json").write_text(json.dumps(rows, indent=1))
    table = pivot([row_from_dict(r) for r in rows])
    (args.work / "ours.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
