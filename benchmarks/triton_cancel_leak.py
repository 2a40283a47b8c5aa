"""tritonserver's own RSS per request, by how the request ends (issue 29: what is left of the kv
soak's RSS growth once the primitive caches are capped; docs/reliability.md §3).

Serves a repository (default ``reports/kv-soak/repo``, written by ``benchmarks/kv_soak.py``) and
sends rounds of short streamed requests over gRPC from 4 threads, one client per thread:
``complete`` (read to the final response, then ``stop_stream()``) or ``cancel`` (stop after the
first response with ``stop_stream(cancel_requests=True)``, which is how a client cancels a
stream). After each round it prints the tritonserver process's own RSS change per request (the
Python stubs are other processes).

    .venv/bin/python benchmarks/triton_cancel_leak.py [--repo DIR] [--requests 1000]
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/helpers: the request arrays of the soak


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(client: Any, cancel: bool) -> None:
    from tests.helpers.server import infer_inputs, request

    q: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("ensemble", infer_inputs(request("def f(x):", 32 if cancel else 4,
                                                               stream=True)),
                              request_id="0", enable_empty_final_response=True)
    while True:
        result, error = q.get(timeout=60)
        if error is not None or cancel:
            break
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream(cancel_requests=cancel)


def run(url: str, pid: int, mode: str, n: int, threads: int = 4) -> float:
    import tritonclient.grpc as grpcclient

    def worker(k: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        for _ in range(k):
            one(client, mode == "cancel")
        client.close()

    pool = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    before, t0 = rss_mb(pid), time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    per = (rss_mb(pid) - before) * 1024 / n
    print(f"{mode}: {n} requests in {time.monotonic() - t0:.0f} s, tritonserver RSS "
          f"{before:.1f} -> {rss_mb(pid):.1f} MB ({per:.2f} KB/request)", flush=True)
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT / "reports" / "kv-soak" / "repo")
    ap.add_argument("--requests", type=int, default=1000)
    a = ap.parse_args()
    from specserve.triton.server import TritonServer

    srv = TritonServer(a.repo, log_path=Path("/tmp/triton-cancel-leak.log")).start(timeout_s=300)
    try:
        run(srv.grpc_url, srv.pid, "complete", 900)  # warm-up: the server's first allocations
        for _ in range(2):
            for mode in ("cancel", "complete"):
                run(srv.grpc_url, srv.pid, mode, a.requests)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
