"""Where a request's first-token time goes behind NVIDIA Dynamo's frontend.

Starts Dynamo's frontend and one specserve worker (``DynamoDeployment``) with the worker's trace
on (``SPECSERVE_DYNAMO_TRACE``: wall times of a request's arrival at the handler, the serving
loop's first response and the handler's first yield), then sends ``--requests`` streamed
``/v1/completions`` requests at each concurrency from a bare aiohttp client that stamps the
send, the response headers, every SSE event and the first event with text. The two sides share
the machine's wall clock; requests are matched by the completion id the frontend sends
(``cmpl-<request id>``, the id of the worker's context), else by order at c = 1. Prints the
medians of each segment:

- ``send -> worker``: HTTP parse, tokenization, routing, the TCP request plane to the worker;
- ``worker -> first send``: admission, the loop's queue, prefill, the first step;
- ``first send -> first yield``: the loop thread's hand-off to the handler's asyncio queue;
- ``first yield -> first event``: the response stream back, detokenization, SSE;
- ``first event -> first text``: events before the first one with text (held-back text).

    .venv/bin/python benchmarks/dynamo_ttft_trace.py --engine engines/demo --requests 16 [--nagle]

``--nagle`` starts Dynamo's frontend as shipped (``python -m dynamo.frontend``: Nagle's algorithm
on its HTTP connections) instead of through :mod:`specserve.frontends.dynamo_frontend`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEGMENTS = (("send -> worker", "send", "received"),
            ("worker -> first send", "received", "first_send"),
            ("first send -> first yield", "first_send", "first_yield"),
            ("first yield -> first event", "first_yield", "first_event"),
            ("first event -> first text", "first_event", "first_text"),
            ("TTFT (send -> first text)", "send", "first_text"))


async def one(session: Any, url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    rec: dict[str, Any] = {"send": time.time(), "events": []}
    async with session.post(f"{url}/v1/completions", json=body) as r:
        rec["headers"] = time.time()
        async for line in r.content:
            t = time.time()
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[5:])
            rec.setdefault("first_event", t)
            rec.setdefault("id", ev.get("id", ""))
            text = (ev.get("choices") or [{}])[0].get("text") if ev.get("choices") else None
            if len(rec["events"]) < 3:
                rec["events"].append({"t_ms": round(1e3 * (t - rec["send"]), 2),
                                      "text": text, "usage": ev.get("usage")})
            if text and "first_text" not in rec:
                rec["first_text"] = t
    return rec


async def load(url: str, prompts: list[str], c: int, max_tokens: int) -> list[dict[str, Any]]:
    import aiohttp

    todo = list(enumerate(prompts))
    out: list[dict[str, Any]] = []

    async def client(s: Any) -> None:
        while todo:
            _, p = todo.pop(0)
            out.append(await one(s, url, p, max_tokens))

    async with aiohttp.ClientSession() as s:
        await one(s, url, prompts[0], max_tokens)  # warm-up
        await asyncio.gather(*(client(s) for _ in range(c)))
    return out


def join(client: list[dict[str, Any]], worker: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id = {w["id"]: w for w in worker if w.get("id")}
    rows = []
    for i, c in enumerate(client):
        rid = str(c.get("id", "")).removeprefix("cmpl-")
        w = by_id.get(rid)
        if w is None and len(worker) == len(client):
            w = worker[i]
        if w is not None:
            rows.append({**c, **{k: w[k] for k in ("received", "first_send", "first_yield")}})
    return rows


def segments(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for name, a, b in SEGMENTS:
        vals = [1e3 * (r[b] - r[a]) for r in rows if r.get(a) and r.get(b)]
        out[name] = statistics.median(vals) if vals else float("nan")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, default=Path("engines/demo"))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", type=Path, default=None, help="write the rows here (JSON)")
    ap.add_argument("--nagle", action="store_true",
                    help="Dynamo's frontend as shipped (no TCP_NODELAY on its HTTP listener)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from specserve.client.builtin_prompts import builtin_code_prompts
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    trace = Path(tempfile.mkdtemp(prefix="dyn-trace-")) / "worker.jsonl"
    os.environ["SPECSERVE_DYNAMO_TRACE"] = str(trace)
    prompts = [p.text for p in builtin_code_prompts(args.requests, 0)]
    dep = DynamoDeployment(DynamoServeConfig(engine=args.engine, models=(ServedModel("demo"),),
                                             nodelay=not args.nagle))
    result: dict[str, Any] = {}
    with dep.start(300):
        for c in args.concurrency:
            trace.write_text("")
            client = asyncio.run(load(dep.url, prompts, c, args.max_tokens))
            time.sleep(0.5)
            worker = [json.loads(x) for x in trace.read_text().splitlines()]
            rows = join(client, worker[-len(client):] if len(worker) > len(client) else worker)
            seg = segments(rows)
            result[f"c{c}"] = {"segments_ms_p50": seg, "matched": len(rows), "rows": rows}
            print(f"c = {c}: {len(rows)}/{len(client)} requests matched; medians (ms):")
            for k, v in seg.items():
                print(f"  {k:28s} {v:8.2f}")
            print(f"  first events of one request: {client[len(client) // 2]['events']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
