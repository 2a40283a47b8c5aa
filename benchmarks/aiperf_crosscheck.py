"""Cross-check ``specserve bench --protocol openai`` against AIPerf 0.13 on one vLLM-CPU server
or on NVIDIA Dynamo's OpenAI frontend in front of a specserve worker (``--server dynamo``).

Starts vLLM (``make peer-vllm``) on the demo target with the demo draft (``draft_model``, K = 4,
per-request acceptance on), writes one prompt file both tools read (``{"text", "output_length"}``
lines: AIPerf's ``single_turn`` records, which ``--dataset`` also reads; the builtin code prompts
``make demo`` uses), and runs the clients in rounds, the order rotated each round (AIPerf, ours,
and a bare aiohttp loop: the yardstick of what a client costs at the least) at concurrency 1,
T = 0, ``ignore_eos``. Compared, per round and as the median over rounds:

- AIPerf runs with ``--use-server-token-count`` (its default re-tokenizes the text:
  ``--no-server-token-count``), so both count ``usage``; its ``--per-chunk-usage`` (what ours
  sends: ``continuous_usage_stats``) is refused on the completions endpoint in 0.13.0;
- acceptance length from vLLM's per-request payload, pooled (1 + accepted / steps over all
  requests: ours ``tau_server``, AIPerf's totals) and as the mean of the per-request values
  (AIPerf's ``spec_decode_acceptance_length``) - the same server answers, so these should agree;
- CPU seconds of each client (its process tree) and of the vLLM server over each run;
- TTFT p50; TPOT p50 (AIPerf calls the per-request ``(latency - TTFT) / (OSL - 1)``
  "inter_token_latency"); E2E p50; output tokens per request.

On 2 cores the clients compete with the server (vLLM's CPU worker spins on its cores):
``--server-cores 0 --client-cores 1`` gives each side a core of its own, ``--aiperf-lean`` runs
AIPerf with one worker and record processor and no ``/metrics`` polling.

    .venv/bin/python benchmarks/aiperf_crosscheck.py --work reports/aiperf-xcheck --rounds 6 \
        --aiperf-lean --server-cores 0 --client-cores 1

``--server dynamo --engine engines/demo``: the same clients against ``specserve serve --frontend
dynamo`` (Dynamo 1.6.1's frontend, one specserve worker serving the engine as ``demo``), AIPerf
unmodified. Dynamo sends no per-request acceptance (AIPerf's spec-decode table stays empty:
its 0.13 adapter is vLLM's payload); ours reads tau from the worker's counters
(``--metrics-url``). Compared as well: the requests each client completed and the output tokens
it counted (AIPerf ``request_count`` / ``error_request_count`` / ``total_osl``, ours
``completed`` / ``failed`` / ``output_tokens``), which must be equal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("aiperf", "specserve", "bare aiohttp")
KEYS = ("tau", "tau_req", "ttft", "tpot", "e2e", "osl", "requests", "errors", "out_tokens",
        "client_cpu_s", "server_cpu_s")
NAN = float("nan")


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in process group ``pgid``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _pin(cores: str | None) -> Any:
    """A preexec_fn pinning the client (and its children) to ``cores`` ("1" or "0,1")."""
    if cores is None:
        return None
    cpus = {int(c) for c in cores.split(",")}
    return lambda: os.sched_setaffinity(0, cpus)


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def write_prompts(path: Path, n: int, max_tokens: int, seed: int) -> None:
    from specserve.client.builtin_prompts import builtin_code_prompts

    path.write_text("".join(json.dumps({"text": p.text, "output_length": max_tokens}) + "\n"
                            for p in builtin_code_prompts(n, seed)))


def _metric(d: dict[str, Any], *names: str) -> dict[str, Any]:
    for n in names:
        if isinstance(d.get(n), dict):
            return dict(d[n])
    raise KeyError(f"none of {names} in AIPerf's export (keys: {sorted(d)[:40]})")


def _opt(d: dict[str, Any], name: str, key: str = "avg") -> float:
    """A metric AIPerf may not export (the spec-decode ones without vLLM's payload): NaN."""
    v = d.get(name)
    return float(v[key]) if isinstance(v, dict) and v.get(key) is not None else NAN


def run_aiperf(args: argparse.Namespace, url: str, prompts: Path, art: Path) -> dict[str, float]:
    shutil.rmtree(art, ignore_errors=True)
    cmd = [str(args.aiperf_venv / "bin" / "aiperf"), "profile", "-m", "demo",
           "--endpoint-type", "completions", "--streaming", "-u", f"http://{url}",
           "--tokenizer", str(args.model), "--input-file", str(prompts),
           "--custom-dataset-type", "single_turn", "--request-count", str(args.requests),
           "--warmup-request-count", "1", "--concurrency", "1",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
           "--artifact-dir", str(art)]
    if args.server_token_count:  # count `usage`, as ours does (--per-chunk-usage: chat only)
        cmd += ["--use-server-token-count"]
    if args.aiperf_lean:  # one worker, one record processor, no /metrics polling, no UI
        cmd += ["--workers-max", "1", "--record-processors", "1", "--no-server-metrics",
                "--ui-type", "none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          preexec_fn=_pin(args.client_cores))
    if proc.returncode:
        sys.exit(f"aiperf failed ({proc.returncode}): stderr {proc.stderr[-2000:]!r} stdout "
                 f"{proc.stdout[-2000:]!r}")
    exp = json.loads(next(art.rglob("profile_export_aiperf.json")).read_text())
    # pooled: 1 + accepted / steps over all requests; per request: the mean of each one's
    steps = _opt(exp, "total_spec_decode_steps")
    return {"tau": 1 + _opt(exp, "total_accepted_draft_tokens") / steps if steps else NAN,
            "tau_req": _opt(exp, "spec_decode_acceptance_length"),
            "requests": _opt(exp, "request_count"),
            "errors": 0.0 if math.isnan(e := _opt(exp, "error_request_count")) else e,
            "out_tokens": _opt(exp, "total_osl"),
            "ttft": _metric(exp, "time_to_first_token")["p50"],
            "tpot": _metric(exp, "inter_token_latency")["p50"],
            "e2e": _metric(exp, "request_latency")["p50"],
            "osl": _metric(exp, "output_sequence_length")["avg"]}


def run_ours(args: argparse.Namespace, url: str, prompts: Path, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", "openai",
           "--url", url, "--model", "demo", "--dataset", str(prompts), "--concurrency", "1",
           "--requests", str(args.requests), "--warmup", "1", "--temperature", "0",
           "--ignore-eos", "--out", str(out), "--format", "json"]
    for m in getattr(args, "metrics_urls", ()):  # Dynamo: tau from the workers' counters
        cmd += ["--metrics-url", m]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          preexec_fn=_pin(args.client_cores))
    if proc.returncode:
        sys.exit(f"specserve bench failed ({proc.returncode}): {proc.stderr[-2000:]}")
    s = json.loads(proc.stdout)["variants"]["spec"]
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    taus = [1 + r["server"]["total_accepted_draft_tokens"] / r["spec_stats"]["steps"]
            for r in recs if r["phase"] == "measure" and r.get("spec_stats")
            and (r.get("server") or {}).get("total_accepted_draft_tokens") is not None]
    counters = s.get("engine_counters") or {}  # Dynamo: the workers' counters' delta
    return {"tau": s["acceptance"]["tau_server"] or counters.get("tau") or NAN,
            "tau_req": statistics.fmean(taus) if taus else NAN,
            "requests": float(s["requests"]), "errors": float(s["requests"] - s["completed"]),
            "out_tokens": float(s["output_tokens"]),
            "ttft": s["ttft_ms"]["p50"],
            "tpot": s["tpot_ms"]["p50"], "e2e": s["e2e_ms"]["p50"],
            "osl": s["output_tokens"] / s["completed"]}


def yardstick(url: str, prompts: Path, n: int) -> None:
    """The lightest client: one aiohttp stream at a time, the loop only stamps the first text
    chunk and the end; tokens from the final ``usage``. Prints TTFT/TPOT/E2E p50 as JSON."""
    import asyncio

    import aiohttp

    texts = [json.loads(x) for x in prompts.read_text().splitlines()][:n + 1]

    async def run() -> list[tuple[float, float, int]]:
        out = []
        async with aiohttp.ClientSession() as s:
            for i, p in enumerate(texts):
                body = {"model": "demo", "prompt": p["text"], "max_tokens": p["output_length"],
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first, n_tok = None, 0
                async with s.post(f"http://{url}/v1/completions", json=body) as r:
                    async for line in r.content:
                        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                            continue
                        ev = json.loads(line[5:])
                        if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                            first = time.perf_counter() - t0
                        n_tok = (ev.get("usage") or {}).get("completion_tokens", n_tok)
                if i:  # the first request warms up, as the other tools' warmup does
                    out.append((first or 0.0, time.perf_counter() - t0, n_tok))
        return out

    res = asyncio.run(run())
    print(json.dumps({
        "tau": float("nan"), "tau_req": float("nan"), "osl": statistics.fmean(x[2] for x in res),
        "requests": float(len(res)), "errors": 0.0, "out_tokens": float(sum(x[2] for x in res)),
        "ttft": 1e3 * statistics.median(x[0] for x in res),
        "tpot": 1e3 * statistics.median((x[1] - x[0]) / (x[2] - 1) for x in res),
        "e2e": 1e3 * statistics.median(x[1] for x in res)}))


def run_bare(args: argparse.Namespace, url: str, prompts: Path) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--yardstick", url, "--prompts", str(prompts),
           "--requests", str(args.requests)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          preexec_fn=_pin(args.client_cores))
    if proc.returncode:
        sys.exit(f"yardstick failed ({proc.returncode}): {proc.stderr[-2000:]}")
    res: dict[str, float] = json.loads(proc.stdout)
    return res


@contextmanager
def served(args: argparse.Namespace) -> Iterator[tuple[str, Callable[[], float]]]:
    """The server under test, ready: (host:port, its CPU seconds so far)."""
    if args.server == "vllm":
        from specserve.peers.vllm import VllmConfig, VllmServer, draft_model_spec

        cfg = VllmConfig(venv=args.vllm_venv, model=args.model, served_model_name="demo",
                         port=args.port, speculative_config=draft_model_spec(args.draft, args.k),
                         per_request_spec_metrics="summary", omp_threads_bind=args.server_cores)
        with VllmServer(cfg, args.work / "vllm.log") as srv:
            print(f"vLLM ready in {srv.wait_ready(timeout_s=600):.0f} s", flush=True)
            yield srv.base_url, lambda: group_cpu_s(srv.pid or 0)
        return
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    dep = DynamoDeployment(DynamoServeConfig(engine=args.engine, models=(ServedModel("demo"),),
                                             log_dir=args.work / "dynamo-logs"))
    with dep.start(600):
        print(f"Dynamo ready in {dep.startup_s:.0f} s ({dep.url})", flush=True)
        args.metrics_urls = [w.metrics_url for w in dep.workers]
        args.model = args.engine / "target"  # AIPerf's tokenizer: the served model's
        yield dep.url.removeprefix("http://"), lambda: sum(
            group_cpu_s(c.proc.pid) for c in dep.children if c.proc is not None)


def counts_equal(rows: dict[str, list[dict[str, float]]]) -> None:
    """Per round: AIPerf's request, error and output-token counts against ours."""
    for r, (a, o) in enumerate(zip(rows["aiperf"], rows["specserve"], strict=True)):
        same = all(a[k] == o[k] for k in ("requests", "errors", "out_tokens"))
        print(f"round {r + 1}: requests {a['requests']:.0f} / {o['requests']:.0f}, errors "
              f"{a['errors']:.0f} / {o['errors']:.0f}, output tokens {a['out_tokens']:.0f} / "
              f"{o['out_tokens']:.0f} (AIPerf / ours): {'equal' if same else 'DIFFERENT'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "aiperf-xcheck")
    ap.add_argument("--model", type=Path, default=ROOT / "checkpoints" / "demo" / "target")
    ap.add_argument("--draft", type=Path, default=ROOT / "checkpoints" / "demo" / "draft")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--server", choices=("vllm", "dynamo"), default="vllm",
                    help="vLLM-CPU with the demo draft, or Dynamo's frontend in front of a "
                         "specserve worker serving --engine")
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "demo",
                    help="--server dynamo: the torch engine the worker serves")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--server-token-count", action=argparse.BooleanOptionalAction, default=True,
                    help="AIPerf --use-server-token-count (off: it re-tokenizes the output "
                         "text, its default)")
    ap.add_argument("--aiperf-lean", action="store_true",
                    help="AIPerf with one worker and record processor, no server-metrics "
                         "polling: less of its CPU use competing with the server")
    ap.add_argument("--server-cores", default="0-1",
                    help="VLLM_CPU_OMP_THREADS_BIND (e.g. 0: the server on core 0 only)")
    ap.add_argument("--client-cores", default=None, help="pin the clients, e.g. 1")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".peers" / "vllm")
    ap.add_argument("--aiperf-venv", type=Path, default=ROOT / ".peers" / "aiperf")
    ap.add_argument("--yardstick", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.yardstick:
        yardstick(args.yardstick, args.prompts, args.requests)
        return
    if not (args.aiperf_venv / "bin" / "aiperf").exists():
        sys.exit(f"{args.aiperf_venv}: no AIPerf; run `make peer-aiperf`")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on `timeout`
    args.work.mkdir(parents=True, exist_ok=True)
    prompts = args.work / "prompts.jsonl"
    write_prompts(prompts, args.requests + 1, args.max_tokens, seed=0)
    rows: dict[str, list[dict[str, float]]] = {t: [] for t in TOOLS}
    with served(args) as (url, server_cpu_s):
        for r in range(args.rounds):
            for tool in TOOLS[r % len(TOOLS):] + TOOLS[:r % len(TOOLS)]:
                cpu0, srv0 = children_cpu_s(), server_cpu_s()
                if tool == "aiperf":
                    res = run_aiperf(args, url, prompts, args.work / "aiperf")
                elif tool == "specserve":
                    res = run_ours(args, url, prompts, args.work / "specserve")
                else:
                    res = run_bare(args, url, prompts)
                res["client_cpu_s"] = children_cpu_s() - cpu0
                res["server_cpu_s"] = server_cpu_s() - srv0
                rows[tool].append(res)
                print(f"round {r + 1} {tool:9s} " + "  ".join(f"{k} {res[k]:.3f}" for k in KEYS)
                      + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\nmedian over {args.rounds} rounds (ms; tau; tokens), ours / AIPerf's, and the "
          "per-round ratios' median [min, max]:")
    med = {t: {k: statistics.median(x[k] for x in rows[t]) for k in KEYS} for t in TOOLS}
    for k in KEYS:
        print(f"  {k:12s} " + "  ".join(f"{t} {med[t][k]:9.3f}" for t in TOOLS))
        for other in ("aiperf", "bare aiohttp"):
            ratios = [o[k] / a[k] if a[k] else float("nan")
                      for o, a in zip(rows["specserve"], rows[other], strict=True)]
            if all(math.isfinite(x) for x in ratios):
                print(f"  {'':12s} specserve / {other}: per round median "
                      f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    if args.server == "dynamo":
        counts_equal(rows)
    name = "crosscheck" + ("_dynamo" if args.server == "dynamo" else "") + (
        "_lean" if args.aiperf_lean else "") + (
        f"_client{args.client_cores}" if args.client_cores else "") + ".json"
    (args.work / name).write_text(json.dumps({"rows": rows, "median": med}, indent=2))


if __name__ == "__main__":
    main()
