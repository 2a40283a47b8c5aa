"""A timed mixed soak of the paged prefix KV cache through Triton or NVIDIA Dynamo (the
goal: KV memory bounded by its budget, and a 10-minute mixed soak of long and short prompts,
shared prefixes and cancellations loses nothing and keeps its RSS flat; figures in
``docs/reliability.md``).

Serves an engine (default ``engines/demo-draft``: the demo target and draft, K = 4) from a
repository written here, with a deliberately small prefix cache (``--prefix-cache-mb``, default
8: the pool fills within a minute, so blocks are evicted and reused all run long). ``--clients``
threads send streamed greedy requests until ``--duration-s`` is over. Each request is one of:

- **short**: a builtin code prompt;
- **long**: 256 or 500 tokens cut from a held-out standard-library file (as ``benchmarks/peers.py
  --input-length`` builds them);
- **shared**: one of 4 long preambles plus one of 8 short questions (prefix reuse across
  requests, and across preambles that share nothing).

``max_tokens`` is 16, 48 or 96; every 10th request is cancelled after its first chunk. The
server's RSS is sampled every ``--rss-every-s``: the tritonserver process group (its stubs
included), or with ``--front dynamo`` the process groups of Dynamo's frontend and our worker
(streamed OpenAI completions; a cancel closes the connection).

Criteria (exit 0 only when all hold):
- every request is recorded, none is an error, the server stays up;
- **greedy determinism under reuse**: every completed request's text equals the text of the
  first completed request with the same prompt and ``max_tokens`` (a stale or overwritten
  prefix block changes a later request's text);
- **RSS flat**: from the sample at 25% of the run to the last one, growth <= ``--rss-slack-mb``.

    .venv/bin/python benchmarks/kv_soak.py --duration-s 600 --out reports/kv-soak
    .venv/bin/python benchmarks/kv_soak.py --front dynamo --out reports/kv-soak-dynamo
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/helpers: the stream client and RSS of a process group
DEMO = ROOT / "checkpoints" / "demo"
QUESTIONS = ["\n\n# Q: what does the first function return?\n", "\n\ndef test_it():\n",
             "\n\n# TODO: add a docstring to", "\n\nclass Wrapper:\n    def __init__(self",
             "\n\nif __name__ == '__main__':\n", "\n\n# the same module, refactored\nimport",
             "\n\n    @property\n    def name(self", "\n\n__all__ = ["]


def prompt_pool(seed: int) -> dict[str, list[str]]:
    """{"short", "long", "shared"}: the texts each kind of request draws from."""
    from specserve.client.builtin_prompts import builtin_code_prompts
    from specserve.client.context import cut_to_tokens, tokenizer_ends
    from specserve.client.edit_dataset import read_heldout

    ends = tokenizer_ends(DEMO / "tokenizer")
    texts = list(read_heldout(DEMO / "corpus.json").values())
    long = [c for n in (256, 500) for t in texts[:12] if (c := cut_to_tokens(t, n, ends))]
    pre = [c for t in texts[12:24] if (c := cut_to_tokens(t, 300, ends))][:4]
    return {"short": [p.text for p in builtin_code_prompts(8, seed=seed)], "long": long,
            "shared": [p + q for p in pre for q in QUESTIONS]}


class Served:
    """The server under soak, whichever front door: its URL, a one-request client, the
    process groups whose RSS counts, whether it is up, and how to stop it."""

    def __init__(self, url: str, send: Callable[..., Any], groups: Callable[[], list[int]],
                 alive: Callable[[], bool], stop: Callable[[], None]) -> None:
        self.url, self.send, self.groups, self.alive, self.stop = url, send, groups, alive, stop


def serve(front: str, engine: Path, work: Path, cache_mb: int) -> Served:
    from tests.helpers.soak import one_openai_stream, one_stream

    if front == "dynamo":
        from specserve.frontends.dynamo_serve import (
            DynamoDeployment,
            DynamoServeConfig,
            ServedModel,
        )

        dep = DynamoDeployment(DynamoServeConfig(
            engine=engine, models=(ServedModel("spec"),), prefix_cache_mb=cache_mb,
            log_dir=work / "dynamo-logs")).start(300)
        return Served(dep.url, lambda *a: one_openai_stream(dep.url, "spec", *a),
                      lambda: [c.proc.pid for c in dep.children if c.proc],
                      lambda: all(c.exited() is None for c in dep.children), dep.stop)
    srv = triton(engine, work, cache_mb)
    return Served(srv.grpc_url, lambda *a: one_stream(srv.grpc_url, *a), lambda: [srv.pid],
                  srv.is_running, srv.stop)


def triton(engine: Path, work: Path, cache_mb: int) -> Any:
    from specserve.triton.server import TritonServer

    repo = work / "repo"
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine", str(engine),
                    "--out", str(repo), "--force"], check=True, capture_output=True)
    with open(repo / "tensorrt_llm" / "config.pbtxt", "a", encoding="utf-8") as f:
        f.write('parameters: { key: "specserve_prefix_cache_mb" '
                f'value: {{ string_value: "{cache_mb}" }} }}\n')
    return TritonServer(repo, log_path=work / "triton.log").start(timeout_s=300)


def client(send: Callable[..., Any], pool: dict[str, list[str]], seed: int, deadline: float,
           out: list[dict[str, Any]], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    i = 0
    while time.monotonic() < deadline:
        kind = rng.choice(("short", "long", "shared", "shared"))
        text = rng.choice(pool[kind])
        max_tokens = rng.choice((16, 48, 96))
        cancel = i % 10 == 9
        rec = asdict(send(seed * 100_000 + i, text, max_tokens, cancel))
        rec.update(kind=kind, max_tokens=max_tokens, key=f"{hash(text)}:{max_tokens}")
        with lock:
            out.append(rec)
        i += 1


def check_texts(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Completed requests with the same prompt and max_tokens must have the same text."""
    first: dict[str, str] = {}
    mismatched = []
    for r in records:
        if r["status"] != "completed":
            continue
        want = first.setdefault(r["key"], r["text"])
        if r["text"] != want:
            mismatched.append({"index": r["index"], "kind": r["kind"], "got": r["text"][:80],
                               "want": want[:80]})
    repeats = sum(1 for r in records if r["status"] == "completed") - len(first)
    return {"distinct": len(first), "repeats_checked": repeats, "mismatched": len(mismatched),
            "examples": mismatched[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--front", choices=("triton", "dynamo"), default="triton",
                    help="the front door: Triton's ensemble over gRPC, or Dynamo's OpenAI "
                         "frontend")
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "demo-draft")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "kv-soak")
    ap.add_argument("--duration-s", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prefix-cache-mb", type=int, default=8)
    ap.add_argument("--rss-every-s", type=float, default=15)
    ap.add_argument("--rss-slack-mb", type=float, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from tests.helpers.soak import group_rss_bytes

    a.out.mkdir(parents=True, exist_ok=True)
    pool = prompt_pool(a.seed)
    srv = serve(a.front, a.engine, a.out, a.prefix_cache_mb)
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    rss: list[tuple[float, float]] = []
    try:
        t0 = time.monotonic()
        deadline = t0 + a.duration_s
        threads = [threading.Thread(target=client, args=(srv.send, pool, a.seed + c,
                                                          deadline, records, lock))
                   for c in range(a.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            mb = sum(group_rss_bytes(g) for g in srv.groups()) / 2**20
            rss.append((round(time.monotonic() - t0, 1), mb))
            print(f"  {rss[-1][0]:6.0f} s  {len(records):6d} requests  RSS {rss[-1][1]:.1f} MB",
                  flush=True)
            time.sleep(a.rss_every_s)
        for t in threads:
            t.join()
        alive = srv.alive()
    finally:
        srv.stop()
    counts = {s: sum(r["status"] == s for r in records) for s in ("completed", "cancelled",
                                                                   "error")}
    base = rss[len(rss) // 4][1]
    result = {
        "front": a.front, "duration_s": a.duration_s, "clients": a.clients,
        "prefix_cache_mb": a.prefix_cache_mb,
        "requests": len(records), "counts": counts,
        "by_kind": {k: sum(r["kind"] == k for r in records) for k in pool},
        "errors": sorted({r["error"] or "" for r in records if r["error"]})[:5],
        "texts": check_texts(records), "rss_mb": rss,
        "rss_growth_after_quarter_mb": round(rss[-1][1] - base, 1),
    }
    result["criteria"] = {
        "server alive": alive, "no errors": counts["error"] == 0,
        "every request recorded": sum(counts.values()) == len(records) > 0,
        "cancellations happened": counts["cancelled"] > 0,
        "same prompt, same text": result["texts"]["mismatched"] == 0
        and result["texts"]["repeats_checked"] > 0,
        "RSS flat": result["rss_growth_after_quarter_mb"] <= a.rss_slack_mb,
    }
    (a.out / "kv_soak.json").write_text(json.dumps(result, indent=1) + "\n")
    with open(a.out / "requests.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rss_mb"}, indent=1))
    ok = all(result["criteria"].values())
    print(f"kv soak: {'PASS' if ok else 'FAIL'} ({a.out / 'kv_soak.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
