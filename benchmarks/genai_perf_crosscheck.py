"""Cross-check ``specserve bench`` against genai-perf on the same served tiny engine.

Serves the tiny reference engine (n-gram speculation) on a real tritonserver and, for
``--rounds`` rounds on that one server, runs in turn (order rotated each round so drift in the
machine's load hits all alike):

- genai-perf (in its own venv), synthetic
  32-token prompts, concurrency 1;
- ``specserve bench`` on the very prompts genai-perf sent (read from its ``inputs.json``), as
  shipped (asks for perf outputs and per-response token counts);
- ``specserve bench --no-perf-outputs``: the same four inputs genai-perf sends, so the server
  does the same work for both tools;
- a bare tritonclient loop (one gRPC stream, the callback only stamps the time, genai-perf's four
  inputs): the yardstick for what Python tritonclient itself costs.

It prints each round's medians and the median over rounds, with ours / genai-perf ratios.

    .venv/bin/python benchmarks/genai_perf_crosscheck.py --gp-venv /tmp/gpv --work /tmp/gp
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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers: tiny models

TOOLS = ("genai-perf", "specserve", "specserve --no-perf-outputs", "bare tritonclient")


def genai_perf(args: argparse.Namespace, dep: Any, art: Path) -> dict[str, float]:
    cuda = next((args.gp_venv / "lib").glob("python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, PATH=f"{args.gp_venv / 'bin'}:{os.environ['PATH']}",
               LD_LIBRARY_PATH=str(cuda), HF_HUB_OFFLINE="1")
    shutil.rmtree(art, ignore_errors=True)
    subprocess.run(
        ["genai-perf", "profile", "-m", "ensemble", "--endpoint-type", "kserve",
         "--backend", "tensorrtllm", "--streaming", "--tokenizer", str(dep.ckpt.tokenizer),
         "-u", dep.server.grpc_url, "--request-count", str(args.requests),
         "--warmup-request-count", "2", "--concurrency", "1",
         "--synthetic-input-tokens-mean", "32", "--synthetic-input-tokens-stddev", "0",
         "--output-tokens-mean", str(args.max_tokens), "--output-tokens-stddev", "0",
         "--random-seed", "0", "--artifact-dir", str(art)],
        env=env, check=True, capture_output=True, timeout=600)
    gp = json.loads(next(art.rglob("profile_export_genai_perf.json")).read_text())
    osl = gp["output_sequence_length"]["avg"]
    itl = gp["inter_token_latency"]["p50"]
    # genai-perf re-tokenizes streamed text (over-counts; docs/results.md, "Does the client
    # measure right?"): its ITL is
    # (latency - TTFT) / (OSL - 1); rescale to the tokens the server really produced.
    return {"ttft": gp["time_to_first_token"]["p50"], "e2e": gp["request_latency"]["p50"],
            "tpot": itl * (osl - 1) / (args.max_tokens - 1), "osl": osl}


def ours(args: argparse.Namespace, dep: Any, ds: Path, out: Path, perf: bool) -> dict[str, float]:
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--url", dep.server.grpc_url,
           "--concurrency", "1", "--requests", str(args.requests), "--warmup", "2",
           "--max-tokens", str(args.max_tokens), "--dataset", str(ds), "--out", str(out),
           "--tokenizer", str(dep.ckpt.tokenizer), "--format", "json"]
    if not perf:
        cmd.append("--no-perf-outputs")
    s = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                  timeout=600).stdout)["variants"]["spec"]
    osl = s["output_tokens"] / s["completed"]  # without perf outputs: re-tokenized, as genai-perf
    return {"ttft": s["ttft_ms"]["p50"], "e2e": s["e2e_ms"]["p50"],
            "tpot": s["tpot_ms"]["p50"] * (osl - 1) / (args.max_tokens - 1), "osl": osl}


def bare(args: argparse.Namespace, dep: Any, ds: Path) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--yardstick", dep.server.grpc_url, "--dataset", str(ds),
           "--requests", str(args.requests), "--max-tokens", str(args.max_tokens)]
    res: dict[str, float] = json.loads(subprocess.run(
        cmd, check=True, capture_output=True, text=True, timeout=600).stdout)
    return res


def yardstick(url: str, ds: Path, n: int, max_tokens: int) -> None:
    """Sequential requests on one tritonclient stream; prints median TTFT/E2E/TPOT as JSON."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    prompts = [json.loads(line)["prompt"] for line in ds.read_text().splitlines()]
    got: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(  # tritonclient calls back with keywords
        callback=lambda result, error: got.put((time.perf_counter(), result, error)))
    ttft, e2e = [], []
    for i in range(n + 2):  # 2 warmup requests, as the tools
        inputs = []
        for name, arr, dtype in (
                ("text_input", np.array([[prompts[i % len(prompts)].encode()]], object), "BYTES"),
                ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
                ("exclude_input_in_output", np.array([[True]]), "BOOL"),
                ("stream", np.array([[True]]), "BOOL")):
            inp = grpcclient.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        t0 = time.perf_counter()
        client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
        first = None
        while True:
            t, result, error = got.get(timeout=60)
            if error is not None:
                raise SystemExit(f"yardstick: {error}")
            final = result.get_response().parameters["triton_final_response"].bool_param
            first = first if first is not None or final else t
            if final:
                break
        if i >= 2 and first is not None:
            ttft.append((first - t0) * 1e3)
            e2e.append((t - t0) * 1e3)
    client.stop_stream()
    tpot = [(e - f) / (max_tokens - 1) for e, f in zip(e2e, ttft, strict=True)]
    print(json.dumps({"ttft": statistics.median(ttft), "e2e": statistics.median(e2e),
                      "tpot": statistics.median(tpot), "osl": float(max_tokens)}), flush=True)
    os._exit(0)  # tritonclient's __del__ -> grpc Channel.close() can hang at interpreter exit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gp-venv", type=Path, help="venv with genai-perf (required)")
    ap.add_argument("--work", type=Path, help="scratch folder (required)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--yardstick", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.yardstick:
        yardstick(args.yardstick, args.dataset, args.requests, args.max_tokens)
        return
    if args.gp_venv is None or args.work is None:
        ap.error("--gp-venv and --work are required")
    # `timeout` sends SIGTERM: exit through the context managers so the server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import torch

    torch.set_num_threads(1)
    from tests.helpers.server import serve_tiny

    dep = serve_tiny(args.work / "deploy", spec_mode="ngram")
    ds = args.work / "prompts.jsonl"
    ds.unlink(missing_ok=True)
    rows: dict[str, list[dict[str, float]]] = {t: [] for t in TOOLS}
    try:
        for r in range(args.rounds):
            order = TOOLS[r % len(TOOLS):] + TOOLS[:r % len(TOOLS)]
            if r == 0:  # genai-perf first: its inputs.json gives everyone the prompts
                order = TOOLS
            for tool in order:
                if tool == "genai-perf":
                    res = genai_perf(args, dep, args.work / "genai-perf")
                    if not ds.exists():
                        data = json.loads(next(
                            (args.work / "genai-perf").rglob("inputs.json")).read_text())
                        ds.write_text("".join(
                            json.dumps({"prompt": d["text_input"][0]
                                        if isinstance(d["text_input"], list)
                                        else d["text_input"]}) + "\n" for d in data["data"]))
                elif tool == "bare tritonclient":
                    res = bare(args, dep, ds)
                else:
                    res = ours(args, dep, ds, args.work / "specserve",
                               perf=tool == "specserve")
                rows[tool].append(res)
                load = os.getloadavg()[0]
                print(f"round {r + 1} {tool:28s} TTFT p50 {res['ttft']:.3f}  E2E p50 "
                      f"{res['e2e']:.3f}  TPOT p50 {res['tpot']:.3f} ms  (tokens {res['osl']:.1f},"
                      f" load {load:.2f})", flush=True)
    finally:
        dep.server.stop()
    keys = ("ttft", "e2e", "tpot")
    print(f"\nmedian over {args.rounds} rounds (ms), ratio to genai-perf's; then the median "
          "[min, max] of the per-round ratios (the tools side by side in one round):")
    base = {k: statistics.median(x[k] for x in rows["genai-perf"]) for k in keys}
    for tool in TOOLS:
        med = {k: statistics.median(x[k] for x in rows[tool]) for k in keys}
        print(f"  {tool:28s} " + "  ".join(
            f"{k.upper()} {med[k]:.3f} ({med[k] / base[k]:.3f})" for k in keys))
        if tool != "genai-perf":
            per_round = {k: [x[k] / g[k] for x, g in zip(rows[tool], rows["genai-perf"],
                                                         strict=True)] for k in keys}
            print(f"  {'':28s} " + "  ".join(
                f"{k.upper()} per round {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"
                for k, r in per_round.items()))

if __name__ == "__main__":
    main()
