"""How much TTFT does ``specserve bench`` itself add, at 1, 16 and 64 concurrent streams?

Serves the trivial ensemble-shaped model (``tests.helpers.trivial_repo``: no model behind
it, ``--step-delay-ms`` per step) on a real tritonserver on loopback, runs ``specserve bench``
against it, and splits every request's client-measured TTFT using the server's own wall-clock
stamps (same host, same clock):

    client TTFT = (arrival - send)          request path: client, gRPC/HTTP, Triton frontend
                + (first token - arrival)   inside the model
                + (receipt - first token)   response path: Triton, gRPC/HTTP, client callback

"added" = client TTFT - (first token - arrival): everything outside the model, an upper bound on
what the client adds (it includes Triton's frontend and the loopback transport). The claim to
check: at 64 concurrent streams on 2 cores the median added TTFT is under 1 ms.

The opening burst of the measured phase (all streams sent at once) is reported apart. The
yardstick (one bare tritonclient stream) bounds it from the other side. Documented run:

    .venv/bin/python benchmarks/client_overhead.py --concurrency 1 16 64 --requests 40 160 320 \
        --step-delay-ms 200 --step-jitter-ms 200 --max-tokens 2 --protocol grpc
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import signal
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers: tiny models


def split_ttft(rec: dict[str, Any]) -> dict[str, float] | None:
    """Milliseconds: request path, in model, response path and added (outside the model)."""
    s = rec["server"]
    if rec["status"] != "completed" or not {"arrival_time_ns", "first_token_time_ns"} <= set(s):
        return None
    send_ns = rec["send_time_unix_s"] * 1e9
    ttft_ms = rec["ttft_s"] * 1e3
    model_ms = (s["first_token_time_ns"] - s["arrival_time_ns"]) / 1e6
    request_ms = (s["arrival_time_ns"] - send_ns) / 1e6
    return {"ttft": ttft_ms, "model": model_ms, "request_path": request_ms,
            "response_path": ttft_ms - model_ms - request_ms, "added": ttft_ms - model_ms}


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else xs * 99
    return {"p50": statistics.median(xs), "p90": q[89], "p99": q[98], "mean": statistics.fmean(xs)}


def triton_counters(metrics_url: str) -> dict[str, float]:
    """Triton's cumulative success count and queue time of model ``trivial``."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    out = {}
    for name in ("nv_inference_request_success", "nv_inference_queue_duration_us"):
        m = re.search(rf'^{name}{{model="trivial",version="1"}} ([0-9.e+]+)$', text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def client_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)   # this process only: not the server
    return ru.ru_utime + ru.ru_stime


def run(concurrency: int, requests: int, url: str, protocol: str, max_tokens: int,
        out: Path, metrics_url: str) -> dict[str, Any]:
    from specserve.client.config import BenchmarkConfig
    from specserve.client.run import run_benchmark

    cfg = BenchmarkConfig(url=url, protocol=protocol, out=str(out), model="trivial",
                          concurrency=concurrency, requests=requests, warmup=concurrency,
                          max_tokens=max_tokens, bootstrap=100)
    before, cpu0 = triton_counters(metrics_url), client_cpu_s()
    res = run_benchmark(cfg, progress=False, plots=False)
    cpu, after = client_cpu_s() - cpu0, triton_counters(metrics_url)
    n_server = after["nv_inference_request_success"] - before["nv_inference_request_success"]
    queue_ms = (after["nv_inference_queue_duration_us"]
                - before["nv_inference_queue_duration_us"]) / 1e3 / max(n_server, 1)
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    meas = sorted((r for r in recs if r["phase"] == "measure"), key=lambda r: r["send_time_unix_s"])
    # the measured phase opens with all `concurrency` requests sent at once (after the warmup
    # drained): leave that burst out, as the yardstick leaves out its first `concurrency`
    parts = [p for r in meas[concurrency:] if (p := split_ttft(r))]
    burst = [p["added"] for r in meas[:concurrency] if (p := split_ttft(r))]
    spec = res.summary["variants"]["spec"]
    return {
        "concurrency": concurrency, "protocol": protocol, "completed": spec["completed"],
        "errors": spec["errors"], "request_throughput_rps": spec["request_throughput_rps"],
        "output_token_throughput_tok_s": spec["output_token_throughput_tok_s"],
        "client_cpu_ms_per_request": cpu * 1e3 / (requests + concurrency),
        "triton_queue_ms_mean": queue_ms, "added_opening_burst": quantiles(burst),
        **{k: quantiles([p[k] for p in parts]) for k in
           ("ttft", "model", "request_path", "response_path", "added")},
    }


def reference_grpc(url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """The leanest Python client as a yardstick: one tritonclient stream, ``concurrency``
    requests multiplexed on it, the callback only stamps the first response."""
    import threading
    import time

    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    sem = threading.Semaphore(concurrency)
    lock = threading.Lock()
    sent: dict[str, float] = {}
    first: dict[str, tuple[float, dict[str, int]]] = {}
    done = threading.Event()
    remaining = [requests]

    def callback(result: Any, error: Any) -> None:
        t = time.time()
        if error is not None:
            raise SystemExit(f"reference client: {error}")
        resp = result.get_response()
        rid = resp.id
        if rid not in first and resp.outputs:
            first[rid] = (t, {k: int(result.as_numpy(k).reshape(-1)[0])
                              for k in ("arrival_time_ns", "first_token_time_ns")})
        if resp.parameters["triton_final_response"].bool_param:
            sem.release()
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

    def inp(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
        i = grpcclient.InferInput(name, [1, 1], dtype)
        i.set_data_from_numpy(np.array([[value]], dtype=np_dtype))
        return i

    inputs = [inp("text_input", b"def f(x):", "BYTES", np.object_),
              inp("max_tokens", max_tokens, "INT32", np.int32),
              inp("stream", True, "BOOL", np.bool_),
              inp("return_perf_metrics", True, "BOOL", np.bool_)]
    client.start_stream(callback=callback)
    for i in range(requests):
        sem.acquire()
        sent[str(i)] = time.time()
        client.async_stream_infer("trivial", inputs, request_id=str(i),
                                  enable_empty_final_response=True)
    done.wait(600)
    client.stop_stream()
    client.close()
    parts = []
    for rid, (t, s) in first.items():
        model_ms = (s["first_token_time_ns"] - s["arrival_time_ns"]) / 1e6
        ttft_ms = (t - sent[rid]) * 1e3
        parts.append({"added": ttft_ms - model_ms, "model": model_ms,
                      "request_path": (s["arrival_time_ns"] / 1e9 - sent[rid]) * 1e3})
    return {k: quantiles([p[k] for p in parts[concurrency:]])
            for k in ("added", "model", "request_path")}


def print_table(results: list[dict[str, Any]]) -> None:
    """Side by side: added TTFT (ours and the yardstick's), its parts, and Triton's queue."""
    print("\n| protocol | streams | req/s | added p50 | added p90 | yardstick p50 | yardstick p90"
          " | ours - yardstick p50 | request path p50 | response path p50 | Triton queue mean"
          " | client CPU/request | opening burst p50 |")
    print("|---" * 13 + "|")
    for r in results:
        a, ref = r["added"], r.get("reference", {}).get("added")
        refs = (f"{ref['p50']:.2f} | {ref['p90']:.2f} | {a['p50'] - ref['p50']:+.2f}" if ref
                else "– | – | –")
        print(f"| {r['protocol']} | {r['concurrency']} | {r['request_throughput_rps']:.1f} | "
              f"{a['p50']:.2f} | {a['p90']:.2f} | {refs} | {r['request_path']['p50']:.2f} | "
              f"{r['response_path']['p50']:.2f} | {r['triton_queue_ms_mean']:.2f} | "
              f"{r['client_cpu_ms_per_request']:.2f} | "
              f"{r['added_opening_burst']['p50']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--requests", type=int, nargs="+", default=[256],
                    help="measured requests: one value for all, or one per --concurrency")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--step-delay-ms", type=float, default=10.0)
    ap.add_argument("--step-jitter-ms", type=float, default=0.0,
                    help="uniform random extra per step, so that streams fall out of lockstep")
    ap.add_argument("--protocol", nargs="+", default=["grpc", "http"])
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the minimal tritonclient yardstick (gRPC)")
    args = ap.parse_args()
    if len(args.requests) not in (1, len(args.concurrency)):
        ap.error("--requests: give one value, or one per --concurrency")
    n_req = dict(zip(args.concurrency, args.requests * len(args.concurrency)
                     if len(args.requests) == 1 else args.requests, strict=True))
    # `timeout` sends SIGTERM: exit through the context managers so the server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from specserve.triton.server import TritonServer
    from tests.helpers.trivial_repo import write_trivial_repo

    results = []
    with tempfile.TemporaryDirectory(prefix="client-overhead-") as tmp:
        repo = write_trivial_repo(Path(tmp) / "repo", "1,3,2,4", 3, args.step_delay_ms,
                                  step_jitter_ms=args.step_jitter_ms)
        with TritonServer(repo) as srv:
            for protocol in args.protocol:
                url = srv.grpc_url if protocol == "grpc" else srv.http_url
                for c in args.concurrency:
                    r = run(c, n_req[c], url, protocol, args.max_tokens,
                            Path(tmp) / f"out-{protocol}-{c}", srv.metrics_url)
                    results.append(r)
                    a, m = r["added"], r["model"]
                    print(f"{protocol:4s} c={c:3d}: {r['completed']} ok {r['errors']} err, "
                          f"{r['request_throughput_rps']:.1f} req/s; added TTFT p50 "
                          f"{a['p50']:.3f} ms p90 {a['p90']:.3f} ms (request path "
                          f"{r['request_path']['p50']:.3f}, response path "
                          f"{r['response_path']['p50']:.3f}); in model p50 {m['p50']:.3f} ms;"
                          f" Triton queue mean {r['triton_queue_ms_mean']:.3f} ms; client CPU "
                          f"{r['client_cpu_ms_per_request']:.2f} ms/request",
                          flush=True)
                    if protocol == "grpc" and not args.no_reference:
                        r["reference"] = reference_grpc(url, c, n_req[c] + c,
                                                        args.max_tokens)
                        ref = r["reference"]["added"]
                        print(f"     reference client c={c:3d}: added TTFT p50 "
                              f"{ref['p50']:.3f} ms p90 {ref['p90']:.3f} ms", flush=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
