"""``make conform``: ``specserve conform`` against our engine on Triton, every method, both
front doors. For each method (draft, ngram, medusa, eagle3; the demo pair, torch engines built
as ``benchmarks/peers.py`` builds them) one repository with ``--baseline`` and one
tritonserver; the speculative ``ensemble`` is compared with ``ensemble_baseline`` (the same
engine, speculation off) over gRPC and over HTTP. The "none" row is ``ensemble_baseline``
against itself. For draft and n-gram also ``tensorrt_llm_bls`` with ``num_draft_tokens`` 4
(its own speculation loop, "draft-bls" / "ngram-bls"). With ``--frontends ...,dynamo`` (needs
``make setup-dynamo``) also one Dynamo deployment (``specserve.frontends.dynamo_serve``: the
frontend and one specserve worker per served name) serving every method's engine under the
method's name and the draft engine without speculation as "none"; each method is compared with
"none" over OpenAI (protocol "openai", engine "specserve-dynamo"). Matrices go to
``WORK/ours-METHOD-PROTOCOL/``, the pivot to ``WORK/ours.md``. ``--model-set real``: the same
on SmolLM2-135M-Instruct and the drafts that exist for it (``benchmarks/conform_sets.py``;
"none" is then served by the n-gram engine when there is no draft model).

    .venv/bin/python benchmarks/conform_ours.py --work reports/conform --frontends triton,dynamo
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
BLS_KINDS = ("draft", "ngram")   # tensorrt_llm_bls drafts itself (draft model or prompt lookup)


def conform(args: argparse.Namespace, method: str, protocol: str, url: str, model: str,
            limit: int, extra: tuple[str, ...] = (), baseline: str = "ensemble_baseline",
            engine: str = "specserve-torch") -> dict[str, Any]:
    out = args.work / f"ours-{method}-{protocol}"
    cmd = [sys.executable, "-m", "specserve.cli.main", "conform", "--url", url,
           "--protocol", protocol, "--model", model, "--baseline-model", baseline,
           "--method", method, "--engine", engine, "--engine-version", version(),
           "--tokenizer", str(args.set.tokenizer), "--context-limit", str(limit),
           "--samples", str(args.samples), "--budget-s", str(args.budget_s),
           "--timeout-s", str(args.timeout_s), "--max-tokens", str(args.max_tokens),
           "--out", str(out), "--format", "json", *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_s + 900)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"conform {method} {protocol} failed ({proc.returncode}): "
                         f"{proc.stderr[-1500:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    print(report["summary"], f"\n({time.time() - t0:.0f} s)", flush=True)
    return report


def version() -> str:
    """specserve's version and commit (the Triton or Dynamo version is in the docs' header)."""
    from specserve import __version__

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=ROOT).stdout.strip()
    return f"{__version__}@{sha}" if sha else __version__


def save(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` merged into the rows already in ``path`` (a configuration measured again
    replaces its old rows: runs of ``--only`` add up); returns what was written."""
    old = json.loads(path.read_text()) if path.is_file() else []
    fresh = {(r["method"], r["protocol"]) for r in rows}
    merged = [r for r in old if (r["method"], r["protocol"]) not in fresh] + rows
    path.write_text(json.dumps(merged, indent=1))
    return merged


def dynamo(args: argparse.Namespace, kinds: list[str], only: set[str] | None
           ) -> list[dict[str, Any]]:
    """Every method behind one Dynamo frontend, each against "none" (OpenAI)."""
    from specserve.engine_record import read_engine_record
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    engines = {k: args.work / "engines" / k for k in kinds}
    plain = engines[args.set.none_kind]
    models = tuple(ServedModel(k, engine=engines[k]) for k in kinds
                   if not only or k in only) + (
        ServedModel("none", speculation=False, engine=plain),)
    cfg = DynamoServeConfig(engine=plain, models=models, max_batch=16,
                            log_dir=args.work / "dynamo-logs")
    limit = read_engine_record(plain).max_input_len
    rows: list[dict[str, Any]] = []
    with DynamoDeployment(cfg).start(600) as dep:
        url = dep.url.removeprefix("http://")
        for method in ["none", *kinds]:
            if only and method not in only:
                continue
            print(f"== {method} (dynamo)", flush=True)
            rows += conform(args, method, "openai", url, method, limit, baseline="none",
                            engine="specserve-dynamo")["rows"]
    return rows


def triton_runs(kind: str, none_kind: str, only: set[str] | None, no_bls: bool) -> list[str]:
    """The rows ``kind``'s repository serves, in order: "none" (on the set's none engine),
    ``kind`` (its ensemble) and ``kind-bls`` (the BLS, draft and n-gram). ``--only`` names
    methods: ``kind`` brings its BLS along (unless ``--no-bls``), ``kind-bls`` the BLS alone."""
    def wanted(method: str) -> bool:
        return not only or method in only

    runs = ["none"] if kind == none_kind and wanted("none") else []
    runs += [kind] if wanted(kind) else []
    if kind in BLS_KINDS and (f"{kind}-bls" in (only or ()) or (wanted(kind) and not no_bls)):
        runs.append(f"{kind}-bls")
    return runs


def triton(args: argparse.Namespace, kind: str, runs: list[str]) -> list[dict[str, Any]]:
    """One repository and tritonserver for ``kind``: the rows ``runs`` names (its ensemble and
    BLS against ``ensemble_baseline``; "none": ``ensemble_baseline`` itself), each protocol."""
    from specserve.engine_record import read_engine_record
    from specserve.triton.server import TritonServer

    engine, repo = args.work / "engines" / kind, args.work / f"repo-{kind}"
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine",
                    str(engine), "--out", str(repo), "--baseline", "--force"], check=True,
                   capture_output=True)
    limit = read_engine_record(engine).max_input_len
    srv = TritonServer(repo, log_path=args.work / f"triton-{kind}.log").start(timeout_s=600)
    rows: list[dict[str, Any]] = []
    try:
        for protocol in args.protocols.split(","):
            url = srv.grpc_url if protocol == "grpc" else srv.http_url
            for method in runs:
                print(f"== {method} ({protocol})", flush=True)
                if method == "none":
                    rows += conform(args, "none", protocol, url, "ensemble_baseline",
                                    limit)["rows"]
                elif method.endswith("-bls"):   # the BLS's own loop, K = 4
                    rows += conform(args, method, protocol, url, "tensorrt_llm_bls", limit,
                                    ("--num-draft-tokens", "4"))["rows"]
                else:
                    rows += conform(args, method, protocol, url, "ensemble", limit)["rows"]
                save(args.work / "ours-rows.json", rows)
    finally:
        srv.stop()
    return rows


def parse_args() -> argparse.Namespace:
    import conform_sets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "conform")
    ap.add_argument("--only", default=None,
                    help="comma-separated methods (ngram also runs ngram-bls; ngram-bls alone: "
                         "the BLS rows only)")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--frontends", default="triton", help="triton and/or dynamo")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=600.0, help="per method and protocol")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    ap.add_argument("--max-tokens", type=int, default=32, help="per answer")
    ap.add_argument("--no-bls", action="store_true", help="leave out the draft-bls/ngram-bls rows "
                    "(those --only names still run)")
    conform_sets.add_args(ap)
    args = ap.parse_args()
    args.set = conform_sets.from_args(args)
    return args


def main() -> None:
    from conform_sets import build_engine

    from specserve.conform.matrix import pivot, row_from_dict

    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    rows: list[dict[str, Any]] = []
    frontends = args.frontends.split(",")
    none = args.set.none_kind   # also "none"'s engine
    kinds = [k for k in args.set.kinds()
             if not only or k == none or only & {k, f"{k}-bls"}]
    for kind in kinds:
        build_engine(args.set, kind, args.work / "engines" / kind)
    for kind in kinds if "triton" in frontends else []:
        runs = triton_runs(kind, none, only, args.no_bls)
        if runs:
            rows += triton(args, kind, runs)
    if "dynamo" in frontends and (not only or only & {"none", *kinds}):   # no BLS on Dynamo
        rows += dynamo(args, kinds, only)
    table = pivot([row_from_dict(r) for r in save(args.work / "ours-rows.json", rows)])
    (args.work / "ours.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
