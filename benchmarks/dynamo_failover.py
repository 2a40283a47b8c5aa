"""Kill one of two specserve workers behind NVIDIA Dynamo's frontend in the middle of a
200-request ``specserve bench`` run with 48 in flight, with and without ``--migration-limit``
(harness and upstream citations: :mod:`tests.helpers.dynamo_failover`;
figures: docs/reliability.md section 8).

For each migration limit: start the frontend and two workers (round-robin router), run the bench
once without a kill (the reference texts: greedy, exactly ``--max-tokens`` tokens), then again
killing worker 0 (SIGKILL) half a request's time after ``--kill-after`` requests have finished.
Writes ``OUT/failover.json`` (counts per run, migrations the frontend counted, errors seen) and
the bench reports under ``OUT/<limit>/``; exits 0 only when no request hung or went missing and,
with migration on, at least 95% completed with their reference text.

    .venv/bin/python benchmarks/dynamo_failover.py --engine engines/demo --out reports/failover
    .venv/bin/python benchmarks/dynamo_failover.py --tiny    # the tests' tiny engine, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers


def tiny_engine(root: Path) -> Path:
    import torch

    from tests.helpers.server import make_tiny_engine
    from tests.helpers.tiny import make_tiny_checkpoint

    torch.set_num_threads(1)
    ckpt = make_tiny_checkpoint(root / "tiny")
    return make_tiny_engine(ckpt, root / "engine-draft", "draft", draft_is_target=True)


def one_limit(engine: Path, limit: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from specserve.frontends.dynamo_serve import (
        DynamoDeployment,
        DynamoServeConfig,
        ServedModel,
    )
    from tests.helpers import dynamo_failover as fo

    cfg = DynamoServeConfig(engine=engine, models=(ServedModel("m"),), workers=2,
                            migration_limit=limit, max_batch=args.max_batch,
                            log_dir=out / "logs")
    dep = DynamoDeployment(cfg).start(300)
    try:
        def bench(name: str, kill: int | None) -> Any:
            return fo.run(dep, fo.bench_config(dep.url, "m", out / name, args.requests,
                                               args.concurrency, args.max_tokens,
                                               args.timeout), kill)
        ref = bench("reference", None)
        killed = bench("kill", args.kill_after)
    finally:
        dep.stop()
    return {"migration_limit": limit,
            "reference": ref.outcome({}, args.max_tokens),
            "kill": killed.outcome(ref.texts(), args.max_tokens)}


def criteria(r: dict[str, Any], requests: int) -> dict[str, bool]:
    out = {}
    for run in r["runs"]:
        k, lim = run["kill"], run["migration_limit"]
        out[f"limit {lim}: every request in the report"] = \
            k["requests"] == k["recorded_in_summary"] == requests
        out[f"limit {lim}: none hung"] = k["hung"] == 0
        out[f"limit {lim}: 40+ in flight at the kill"] = k["in_flight_at_kill"] >= 40
        out[f"limit {lim}: completed texts equal the reference"] = \
            k["completed_equal_reference"] == k["completed"]
        if lim:  # of the requests the reference run completed (a refused prompt stays so)
            out[f"limit {lim}: >= 95% completed"] = \
                k["completed"] >= 0.95 * k["reference_completed"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines/demo", help="torch engine directory")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny engine instead")
    ap.add_argument("--out", default="reports/failover")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=24, help="per worker")
    ap.add_argument("--kill-after", type=int, default=40, help="finished requests")
    ap.add_argument("--timeout", type=float, default=300.0, help="per request (hung)")
    ap.add_argument("--limits", default="3,0", help="migration limits to run")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
        engine = tiny_engine(Path(tmp)) if args.tiny else Path(args.engine)
        runs = [one_limit(engine, int(lim), args, out / f"limit-{lim}")
                for lim in args.limits.split(",")]
    result: dict[str, Any] = {"config": vars(args), "runs": runs}
    result["criteria"] = criteria(result, args.requests)
    (out / "failover.json").write_text(json.dumps(result, indent=2) + "\n")
    for run in runs:
        k = run["kill"]
        print(f"migration limit {run['migration_limit']}: {k['completed']}/{k['requests']} "
              f"completed ({k['completed_equal_reference']} = reference text), "
              f"{k['failed']} failed, {k['hung']} hung; {k['in_flight_at_kill']} in flight at "
              f"the kill; migrations {k['migrations']}; errors {k['errors']}")
    bad = [c for c, ok in result["criteria"].items() if not ok]
    print("all criteria hold" if not bad else "FAILED: " + "; ".join(bad))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
