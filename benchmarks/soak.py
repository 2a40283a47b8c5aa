"""``make soak``: load and fault injection on loopback (checks in
:mod:`tests.helpers.soak`, figures in ``docs/reliability.md``).

Builds a tiny reference engine (draft model = target) and its repository in a temp dir, serves
it on 127.0.0.1, then: 64 concurrent streams x 500 requests with 10% cancelled mid-stream; the
server SIGKILLed during ``specserve bench`` and restarted; ``specserve build`` interrupted with
SIGINT. Writes ``OUT/soak.json`` (+ ``OUT/streams/requests.jsonl`` and the bench reports) and
exits 0 only when every criterion holds.

    .venv/bin/python benchmarks/soak.py --out reports/soak [--requests 500 --concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers: tiny models


def criteria(r: dict[str, Any], requests: int) -> dict[str, bool]:
    s, k, b = r["streams"], r["kill"], r["sigint_build"]
    return {
        "no server crash under load": s["server_alive"],
        "every request recorded": s["recorded"] == requests
        and sum(s["counts"].values()) == requests,
        "no errors under load": s["counts"]["error"] == 0,
        "cancellations happened": s["counts"]["cancelled"] > 0,
        "next request after the load is correct": s["next_request_correct"],
        "server alive until the planned kill": k.get("server_alive_before_kill", True),
        "killed server: bench exits non-zero": k["bench_exit_code"] != 0,
        "killed server: records kept, partial report": k["records"] >= k["recorded_at_kill"] > 0
        and k["summary_written"],
        "after restart: same bench passes": k.get("after_restart_exit_code") == 0,
        "SIGINT build: no engine dir": not b["engine_dir_left"] and not b["staging_dir_left"],
        "SIGINT build: exit non-zero": b["exit_code"] != 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/soak")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--cancel-every", type=int, default=10, help="cancel every Nth request")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from tests.helpers import soak
    from tests.helpers.server import serve_tiny

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"started_unix_s": time.time()}
    with tempfile.TemporaryDirectory(prefix="specserve-soak-") as tmp:
        t0 = time.monotonic()
        dep = serve_tiny(Path(tmp) / "served", spec_mode="draft", draft_is_target=True,
                         baseline=False, timeout_s=180)
        result["startup_s"] = round(time.monotonic() - t0, 1)
        try:
            result["streams"] = soak.soak_streams(dep.server, args.requests, args.concurrency,
                                                  args.cancel_every, out=out / "streams")
            print(json.dumps({"streams": result["streams"]}, indent=1), flush=True)
            result["kill"] = soak.kill_during_bench(dep.server, out)
            print(json.dumps({"kill": result["kill"]}, indent=1), flush=True)
        finally:
            dep.server.stop()
        result["sigint_build"] = soak.sigint_build(dep.ckpt.target, Path(tmp) / "eng" / "x")
    result["wall_s"] = round(time.time() - result["started_unix_s"], 1)
    result["criteria"] = criteria(result, args.requests)
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"sigint_build": result["sigint_build"], "criteria": result["criteria"],
                      "wall_s": result["wall_s"]}, indent=1))
    ok = all(result["criteria"].values())
    print(f"soak: {'PASS' if ok else 'FAIL'} ({out / 'soak.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
