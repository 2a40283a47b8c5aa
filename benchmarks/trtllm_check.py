"""``make trtllm-check``: the PyTorch route's container check.

Where ``tensorrt_llm`` imports (NVIDIA's ``nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3``,
or a Dynamo ``tensorrtllm-runtime`` image for ``--trtllm-version 1.3``):

1. the release gate: checks that the installed version is the line the YAMLs target, then
   renders every YAML specserve emits for that line (each method, with every optional key and
   each ``--spec-option`` key set) and checks each key against the installed
   ``tensorrt_llm.llmapi.llm_args`` classes' ``model_fields`` and validation aliases, and the
   ``decoding_type`` spellings (a pydantic field, or a ``ClassVar`` in the older ``from_dict``
   layout); it prints one ``mismatch:`` line per key and exits 1 on any (no ``--model``
   needed);
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
CLASSES = {"Eagle3": "Eagle3DecodingConfig", "Eagle": "EagleDecodingConfig",
           "Draft_Target": "DraftTargetDecodingConfig", "DraftTarget": "DraftTargetDecodingConfig",
           "NGram": "NGramDecodingConfig", "MTP": "MTPDecodingConfig"}
NESTED = (("kv_cache_config", "KvCacheConfig"), ("cuda_graph_config", "CudaGraphConfig"))


def _names(cls: Any) -> set[str]:
    """Field names and their validation aliases (``speculative_model_dir`` in 1.2+)."""
    fields = getattr(cls, "model_fields", {}) or {}
    names = set(fields)
    for info in fields.values():
        alias = getattr(info, "validation_alias", None)
        names.update(a for a in getattr(alias, "choices", ()) if isinstance(a, str))
        if isinstance(alias, str):
            names.add(alias)
    return names


def declared_decoding_type(cls: Any) -> Any:
    """The spelling a decoding config declares: a pydantic field's default (Dec-2025 layout) or a
    class attribute (the older ``from_dict`` layout keeps it a ``ClassVar``, no field: #42)."""
    info = (getattr(cls, "model_fields", {}) or {}).get("decoding_type")
    if info is not None:
        return getattr(info, "default", None)
    return getattr(cls, "decoding_type", None)


def live_field_findings(options: dict[str, Any], args: Any = None) -> list[str]:
    """Every key of one YAML that the installed release's classes do not take, each named.
    ``args``: the ``tensorrt_llm.llmapi.llm_args`` module (imported when None)."""
    if args is None:
        args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    top = _names(getattr(args, "TorchLlmArgs", None))
    found = [f"unknown top-level key {k}" for k in options if k not in top]
    for key, cls_name in NESTED:
        cls = getattr(args, cls_name, None)
        if cls is None:
            found.append(f"no {cls_name} in this release ({key})")
            continue
        fields = _names(cls)
        found += [f"unknown {key}.{k}" for k in options.get(key, {}) if k not in fields]
    spec = options.get("speculative_config")
    if not isinstance(spec, dict):
        return found
    wrote = spec.get("decoding_type")
    cls = getattr(args, CLASSES.get(str(wrote), ""), None)
    if cls is None:
        return [*found, f"decoding_type {wrote!r}: no {CLASSES.get(str(wrote), 'class')} in "
                        "this release"]
    declared = declared_decoding_type(cls)
    if declared != wrote:
        found.append(f"decoding_type: this release spells it {declared!r}, specserve wrote "
                     f"{wrote!r}")
    fields = _names(cls)
    return found + [f"unknown speculative_config.{k}" for k in spec
                    if k not in fields and k != "decoding_type"]  # the discriminator: above


def emitted_options(release: str) -> dict[str, dict[str, Any]]:
    """Every YAML specserve writes for ``release``, one per method, with every optional key
    it can emit (schedule, FP8 KV cache, CUDA graphs, each ``--spec-option`` key) set."""
    from dataclasses import replace

    from specserve.build import llmapi, llmapi_keys
    from specserve.build.config import BuildConfig
    from specserve.build.pins import RELEASES

    base = BuildConfig(model="/m", out="/o", spec_mode="ngram", backend="trtllm", flow="pytorch",
                       max_batch_size=8, max_input_len=512, max_seq_len=1024, max_draft_len=4,
                       kv_cache_dtype="fp8", cuda_graph_batch_sizes=(1, 8), trtllm_version=release)
    out = {}
    for mode in ("eagle3", "draft", "ngram", "mtp"):
        cfg = replace(base, spec_mode=mode, eagle3="/h" if mode == "eagle3" else None,
                      draft="/d" if mode == "draft" else None,
                      draft_len_schedule=None if mode == "mtp" else "1:4,4:2")
        opts = llmapi.llm_api_options(cfg)
        rel = RELEASES[release]
        for key in llmapi_keys.spec_options_for(mode, rel):  # keys --spec-option passes through
            opts["speculative_config"].setdefault(key, None)
        out[mode] = opts
    return out


def release_findings(installed: str, release: str) -> list[str]:
    from specserve.build.pins import RELEASES

    if RELEASES[release].ships(installed):
        return []
    return [f"tensorrt_llm {installed} is not the {release} line the YAML targets "
            "(--trtllm-version)"]


def field_report(args: Any, installed: str, release: str) -> list[str]:
    """The release gate's field part: each mismatch, prefixed by the method."""
    found = release_findings(installed, release)
    for mode, opts in emitted_options(release).items():
        found += [f"{mode}: {f}" for f in live_field_findings(opts, args)]
    return found


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
    p.add_argument("--trtllm-version", default=None,
                   help="the release line the YAMLs target (default: the installed one's)")
    args = p.parse_args(argv)
    if importlib.util.find_spec("tensorrt_llm") is None:
        print("trtllm-check: TensorRT-LLM is not installed here (tensorrt_llm does not import); "
              "nothing was checked and nothing is claimed. Run it inside "
              "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 on a GPU.")
        return 0
    import tensorrt_llm

    from specserve.build.pins import RELEASES

    installed = str(tensorrt_llm.__version__)
    release = args.trtllm_version or next(
        (r.name for r in RELEASES.values() if r.ships(installed)), "1.2.1")
    print(f"trtllm-check: tensorrt_llm {installed}; YAMLs for --trtllm-version {release}")
    gate = field_report(importlib.import_module("tensorrt_llm.llmapi.llm_args"), installed,
                        release)
    for line in gate:
        print(f"mismatch: {line}")
    print(f"fields: {len(gate)} mismatch(es) over every key specserve emits")
    if not args.model:
        return 1 if gate else 0
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
    return 0 if ok and not gate else 1


if __name__ == "__main__":
    sys.exit(main())
