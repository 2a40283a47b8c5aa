"""``make trtllm-check``: the PyTorch route's container check (``llmapi-route.md`` §7).

Where ``tensorrt_llm`` imports (NVIDIA's ``nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3``):

1. reads the installed ``tensorrt_llm.llmapi.llm_args`` classes and checks every key specserve
   writes against their ``model_fields`` (the live field set), and the ``decoding_type``
   spellings (``Draft_Target`` vs ``DraftTarget``, ``Eagle3``);
2. per method (NGram always; Draft_Target with ``--draft``; EAGLE-3 with ``--eagle3``; MTP when
   the model has MTP layers) writes the YAML with ``specserve build --flow pytorch``, starts
   ``trtllm-serve`` on 127.0.0.1, sends greedy completions, and reads the acceptance length
   (``choices[].avg_decoded_tokens_per_iter``) and ``/metrics`` ``specDecodingStats``;
3. prints the findings and exits 1 unless every method started and had tau > 1.

Elsewhere it prints that TensorRT-LLM is not installed and exits 0, claiming nothing.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

PROMPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
          "fibonacci(n - 2)\n\ndef fibonacci(n):\n    if n < 2:\n")
CLASSES = {"Eagle3": "Eagle3DecodingConfig", "Draft_Target": "DraftTargetDecodingConfig",
           "NGram": "NGramDecodingConfig", "MTP": "MTPDecodingConfig"}


def live_field_findings(options: dict[str, Any]) -> list[str]:
    """Keys of one YAML missing from the installed TensorRT-LLM's classes."""
    args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    found = []
    top = set(args.TorchLlmArgs.model_fields)
    found += [f"unknown top-level key {k}" for k in options if k not in top]
    for key, cls in (("kv_cache_config", "KvCacheConfig"),
                     ("cuda_graph_config", "CudaGraphConfig")):
        fields = set(getattr(args, cls).model_fields)
        found += [f"unknown {key}.{k}" for k in options.get(key, {}) if k not in fields]
    spec = options["speculative_config"]
    cls = getattr(args, CLASSES[spec["decoding_type"]], None)
    if cls is None:
        return [*found, f"no {CLASSES[spec['decoding_type']]} in this release"]
    declared = cls.model_fields["decoding_type"].default
    if declared != spec["decoding_type"]:
        found.append(f"decoding_type: this release spells it {declared!r}, specserve wrote "
                     f"{spec['decoding_type']!r}")
    fields = set(cls.model_fields) | {"speculative_model_dir"}
    return found + [f"unknown speculative_config.{k}" for k in spec if k not in fields]


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read() or b"null")


def _complete(base: str, model: str, max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 - 127.0.0.1 only
        data: dict[str, Any] = json.loads(r.read())
    return data


def check_method(args: argparse.Namespace, mode_args: list[str], name: str,
                 work: Path) -> dict[str, Any]:
    """Build the YAML, serve it, measure tau; a dict of findings."""
    out = work / name
    build = [sys.executable, "-m", "specserve.cli.main", "build", "--model", args.model,
             *mode_args, "--flow", "pytorch", "--out", str(out), "--force",
             "--max-batch-size", "4"]
    subprocess.run(build, check=True)  # noqa: S603 - argv list, no shell
    rec = json.loads((out / "build_config.json").read_text())
    options = rec["llm_api"]["options"]
    finding: dict[str, Any] = {"method": name, "fields": live_field_findings(options)}
    serve = list(rec["llm_api"]["serve"])
    serve[serve.index("--port") + 1] = str(args.port)
    log = (out / "serve.log").open("w")
    proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)  # noqa: S310
                break
            except OSError:
                time.sleep(2)
        if proc.poll() is not None or time.monotonic() >= deadline:
            finding["started"] = False
            return finding
        finding["started"] = True
        taus = []
        for _ in range(args.requests):
            data = _complete(base, rec["llm_api"]["model"], args.max_tokens)
            tau = data["choices"][0].get("avg_decoded_tokens_per_iter")
            if tau is not None:
                taus.append(float(tau))
        finding["tau"] = sum(taus) / len(taus) if taus else None
        stats = _get(f"{base}/metrics") or []
        finding["specDecodingStats"] = any("specDecodingStats" in s for s in stats
                                           if isinstance(s, dict))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return finding


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="small HF target (e.g. TinyLlama-1.1B)")
    p.add_argument("--draft", help="draft model with the target's tokenizer")
    p.add_argument("--eagle3", help="EAGLE-3 head of the target")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--work", default=None)
    args = p.parse_args(argv)
    if importlib.util.find_spec("tensorrt_llm") is None:
        print("trtllm-check: TensorRT-LLM is not installed here (tensorrt_llm does not import); "
              "nothing was checked and nothing is claimed. Run it inside "
              "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 on a GPU.")
        return 0
    if not args.model:
        p.error("--model is required where TensorRT-LLM is installed")
    import tensorrt_llm

    print(f"trtllm-check: tensorrt_llm {tensorrt_llm.__version__}")
    methods = [(["--ngram"], "ngram")]
    if args.draft:
        methods.append((["--draft", args.draft], "draft_target"))
    if args.eagle3:
        methods.append((["--eagle3", args.eagle3], "eagle3"))
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    if (cfg.get("num_nextn_predict_layers") or 0) > 0:
        methods.append((["--mtp"], "mtp"))
    work = Path(args.work or tempfile.mkdtemp(prefix="trtllm-check-"))
    findings = [check_method(args, a, n, work) for a, n in methods]
    ok = True
    for f in findings:
        good = f.get("started") and (f.get("tau") or 0) > 1 and not f["fields"]
        ok = ok and bool(good)
        print(json.dumps(f, sort_keys=True))
    print("§7: decoding_type spellings and keys = the 'fields' lists (empty: all accepted); "
          "'started' = the YAML and --extra_llm_api_options accepted; 'tau' = "
          "avg_decoded_tokens_per_iter (> 1 wanted); specDecodingStats on /metrics. Not "
          "measured here: schedule key semantics, max_concurrency with eagle3_one_model, "
          "FP8 target + BF16 EAGLE-3, Triton acceptance_rate.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
