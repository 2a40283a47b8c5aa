"""The end-to-end demo run behind ``make demo``: serve a model repository on a real Triton
Inference Server (127.0.0.1), benchmark speculation against the no-speculation baseline served
beside it (``ensemble`` vs ``ensemble_baseline``, interleaved in one run), write the report, and
check the measured tokens per step (tau) against the checkpoint's offline ``eval.json``.

The prompts (written to ``OUT/prompts.jsonl``, so ``specserve bench --dataset`` replays them):
the ``builtin-code`` prompts ``eval.json``'s served tau was measured on, first and in the same
order, then a few ``builtin-prose`` and ``builtin-json`` (structured) prompts with a shorter
answer, so the report splits tau and speedup by category for a few seconds more;
the tau check reads the ``code`` category, the prompts the offline figure is for.

The server is stopped on success, on failure and on Ctrl-C/SIGTERM (a context manager around
:class:`specserve.triton.server.TritonServer`).

``frontend="dynamo"`` (``specserve demo --frontend dynamo``, ``make demo-dynamo``) runs the
same benchmark and report through NVIDIA Dynamo's OpenAI frontend instead: the engine served twice
by specserve workers (:mod:`specserve.frontends.dynamo_serve`), with speculation as
:data:`DYNAMO_SPEC` and without as :data:`DYNAMO_BASELINE`, the bench over ``/v1/completions``
reading tau from the workers' Prometheus counters (``--metrics-url``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import JsonConfig, read_json, write_json_atomic, write_text_atomic
from specserve.engine_record import RECORD_FILE, EngineRecord, read_engine_record
from specserve.errors import SpecserveError
from specserve.interrupts import sigterm_as_interrupt

FRONTENDS = ("triton", "dynamo")
#: The served model names of ``--frontend dynamo``: the engine with and without speculation.
DYNAMO_SPEC, DYNAMO_BASELINE = "demo", "demo-baseline"


@dataclass(frozen=True)
class DemoRunConfig(JsonConfig):
    """One demo run. Ports 0 = pick free ones."""

    repo: str
    out: str
    engine: str | None = None
    eval_json: str | None = None
    requests: int = 24
    warmup: int = 2
    max_tokens: int = 96
    concurrency: int = 1
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    startup_timeout_s: float = 180.0
    tau_tolerance: float = 0.10
    extra_per_category: int = 4     # prose and structured prompts after the code ones
    extra_max_tokens: int = 48      # their answers' length
    frontend: str = "triton"        # triton (the repository) | dynamo (the engine, OpenAI)
    dataset: str | None = None      # a prompts JSONL (e.g. `specserve prompts --chat-template`)

    def validate(self) -> None:
        if self.frontend not in FRONTENDS:
            raise SpecserveError(f"frontend must be one of {', '.join(FRONTENDS)}, got "
                                 f"{self.frontend!r}")
        if self.frontend == "dynamo":
            if not self.engine or not Path(self.engine).is_dir():
                raise SpecserveError(f"--frontend dynamo serves the engine directory: "
                                     f"{self.engine} not found")
        elif not (Path(self.repo) / "ensemble_baseline").is_dir():
            raise SpecserveError(
                f"{self.repo}: no ensemble_baseline model "
                "(write it with `specserve repo --baseline`)"
            )
        if self.requests < 1 or self.max_tokens < 1 or self.concurrency < 1:
            raise SpecserveError("requests, max_tokens and concurrency must be >= 1")
        if self.extra_per_category < 0 or self.extra_max_tokens < 1:
            raise SpecserveError("extra_per_category must be >= 0 and extra_max_tokens >= 1")
        if self.dataset is not None and not Path(self.dataset).is_file():
            raise SpecserveError(f"--dataset {self.dataset}: no such file (make real-prompts "
                                 "writes the held-out chat set)")


@dataclass(frozen=True)
class DemoOutcome:
    summary: dict[str, Any]
    check: dict[str, Any]
    exit_code: int


EXTRA_SETS = ("builtin-prose", "builtin-json")


def demo_prompts(cfg: DemoRunConfig) -> list[Any]:
    """The demo's prompts: ``cfg.dataset``'s when given; else the code prompts of eval.json's
    ``served_prompts`` (warmup first), then ``extra_per_category`` prompts of each set in
    :data:`EXTRA_SETS` answering ``extra_max_tokens`` tokens."""
    from dataclasses import replace

    from specserve.client.datasets import load_prompts

    if cfg.dataset is not None:  # warmup first, then requests, cycling the file's prompts
        return load_prompts(cfg.dataset, None, cfg.warmup + cfg.requests, 0)
    code = load_prompts(None, "builtin-code", cfg.warmup + cfg.requests, 0)
    extra = [replace(p, max_tokens=cfg.extra_max_tokens) for name in EXTRA_SETS
             for p in load_prompts(None, name, cfg.extra_per_category, 0)]
    return code + extra


def served_tau(summary: dict[str, Any]) -> tuple[float | None, str]:
    """The served tau to check and what it covers: the workers' Prometheus counters over the
    run when the bench read them (``--frontend dynamo``); else the ``code`` category's when the
    run had several categories (the prompts eval.json measured offline), else the whole
    run's."""
    counters = summary["variants"]["spec"].get("engine_counters") or {}
    if counters.get("tau") is not None:  # through Dynamo: the workers' counters (the whole
        return float(counters["tau"]), "all (worker counters)"  # run; the frontend may merge
    cats = summary.get("categories") or {}  # stream chunks, so chunk sizes are no tau there)
    acc: dict[str, Any] = summary["variants"]["spec"].get("acceptance") or {}
    if len(cats) > 1 and "spec" in (cats.get("code") or {}).get("variants", {}):
        c = cats["code"]["variants"]["spec"]
        return c.get("tau_server") or c.get("tau_stream"), "code"
    return acc.get("tau_server") or acc.get("tau_stream"), "all"


def engine_record(engine_dir: str | None) -> EngineRecord | None:
    """The engine's checked record when ``engine_dir`` holds a ``build_config.json`` (a bad one
    is a SpecserveError), else None (the tau check then assumes Medusa)."""
    if not engine_dir or not (Path(engine_dir) / RECORD_FILE).exists():
        return None
    return read_engine_record(engine_dir)


def expected_tau(engine_dir: str | None, eval_json: str | None,
                 served: dict[str, Any] | None = None) -> tuple[float | None, str]:
    """tau measured offline (``eval.json``) for the engine's proposer and, for Medusa, its tree:
    ``medusa_tuned`` when the engine was built with that tree, else ``medusa`` (default tree).
    When ``served`` (requests, warmup, max_tokens of this run) is what eval.json's
    ``served_prompts`` records, the method's ``tau_served_prompts`` (the same prompts, offline)
    is the one to compare with; else its tau on the held-out prompts."""
    if not eval_json or not Path(eval_json).is_file():
        return None, "no eval.json"
    ev = read_json(eval_json)
    if not isinstance(ev, dict):
        raise SpecserveError(f"{eval_json}: expected a JSON object (specserve demo-model's "
                             "eval.json)")
    build = engine_record(engine_dir)
    mode = build.spec_mode if build is not None else "medusa"
    tuned = ev.get("medusa_tuned") or {}
    if mode == "medusa" and tuned.get("choices") and build is not None and _same_tree(
        tuned["choices"], build.medusa_choices_list
    ):
        mode = "medusa_tuned"
    block = ev.get(mode) or {}
    key = "tau"
    same = ev.get("served_prompts")
    if served is not None and isinstance(same, dict) and isinstance(block, dict) and all(
            same.get(k) == v for k, v in served.items()) and "tau_served_prompts" in block:
        key = "tau_served_prompts"
    tau = block.get(key) if isinstance(block, dict) else None
    if tau is not None and (isinstance(tau, bool) or not isinstance(tau, int | float)):
        raise SpecserveError(f"{eval_json}: {mode}.{key} {tau!r:.40}: expected a number")
    return (float(tau) if tau is not None else None), mode + (
        " (served prompts)" if key == "tau_served_prompts" else "")


OFFLINE_METHODS = ("medusa", "medusa_tuned", "draft", "eagle3", "ngram")


def offline_methods(eval_json: str | None) -> dict[str, Any]:
    """tau and tokens/s per method as ``specserve demo-model`` measured them with the reference
    decoder (eval.json), side by side, and the fastest; empty without eval.json."""
    if not eval_json or not Path(eval_json).is_file():
        return {}
    ev = read_json(eval_json)
    rows = {m: {k: ev[m][k] for k in ("tau", "tokens_per_s") if k in ev[m]}
            for m in OFFLINE_METHODS if isinstance(ev.get(m), dict) and "tau" in ev[m]
            and "tokens_per_s" in ev[m]}
    if not rows:
        return {}
    return {"baseline_tokens_per_s": ev.get("baseline_tokens_per_s"), "methods": rows,
            "fastest_method": ev.get("fastest_method")}


def offline_lines(offline: dict[str, Any]) -> list[str]:
    """The offline table (one line a method) for the summary and the report."""
    if not offline:
        return []
    out = [f"offline (eval.json, reference decoder, T=0; plain "
           f"{offline.get('baseline_tokens_per_s') or float('nan'):.0f} tok/s):"]
    for m, row in offline["methods"].items():
        mark = "  <- fastest" if m == offline.get("fastest_method") else ""
        out.append(f"  {m:13s} tau {row['tau']:.2f}  {row['tokens_per_s']:7.1f} tok/s{mark}")
    return out


def _same_tree(a: Any, b: Any) -> bool:
    if not isinstance(a, list) or not isinstance(b, list):
        return False
    return sorted(map(tuple, a)) == sorted(map(tuple, b))


def picks_draft_len(engine_dir: str | None) -> bool:
    """The engine chooses its draft length per step (a torch engine's default draft-length
    policy over a chain proposer: runtime/draft_policy.py)."""
    build = engine_record(engine_dir)
    if build is None or build.backend != "torch" or build.get("draft_len_policy") == "fixed":
        return False
    return build.spec_mode in ("draft", "ngram") or (
        build.spec_mode == "eagle3" and not build.get("eagle_choices"))


def tau_check(summary: dict[str, Any], engine: str | None, eval_json: str | None,
              tolerance: float, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compare the served tau with the offline one (relative difference within tolerance)."""
    measured, category = served_tau(summary)
    expected, mode = expected_tau(engine, eval_json, served)
    out: dict[str, Any] = {"mode": mode, "tau_served": measured, "tau_eval": expected,
                           "tolerance": tolerance, "tau_served_category": category}
    if measured is None or expected is None:
        out["ok"] = None
        return out
    if picks_draft_len(engine):  # eval.json's tau is at a fixed K
        out["ok"], out["why"] = None, "the engine picks k per step"
        return out
    out["relative_difference"] = abs(measured - expected) / expected
    out["ok"] = out["relative_difference"] <= tolerance
    return out


def _append_offline(readme: Path, offline: dict[str, Any]) -> None:
    if offline and readme.is_file():
        lines = offline_lines(offline)
        text = readme.read_text(encoding="utf-8").rstrip("\n")
        readme.write_text(text + "\n\n## Methods measured offline\n\n```\n"
                          + "\n".join(lines) + "\n```\n", encoding="utf-8")


def summary_lines(summary: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """The short summary printed at the end of ``make demo``."""
    spec, base = summary["variants"]["spec"], summary["variants"]["baseline"]
    acc = _acceptance(spec)
    sp = summary.get("speedup", {})

    def ms(v: dict[str, Any], key: str) -> str:
        return f"{v[key]['mean']:.2f} / {v[key]['p50']:.2f}"

    def speed(metric: str) -> str:
        s = sp.get(metric)
        if not s:
            return "n/a"
        return f"{s['speedup']:.2f}x (95% CI {s['ci_low']:.2f}-{s['ci_high']:.2f})"

    tau_line = f"tau (tokens/step)      {acc.get('tau_server') or float('nan'):.2f}"
    if check.get("tau_eval") is not None:
        where = " on these prompts" if "served prompts" in str(check.get("mode")) else ""
        if check.get("tau_served_category") == "code":
            tau_line += f"; code {check['tau_served']:.2f}"
        why = check.get("why", "other prompts")
        verdict = (f"not compared: {why}" if check["ok"] is None else
                   f"{'within' if check['ok'] else 'OUTSIDE'} {check['tolerance']:.0%}")
        tau_line += f"   offline eval.json{where} {check['tau_eval']:.2f} ({verdict})"
    return [
        "",
        "                       speculative     baseline",
        f"TTFT ms (mean / p50)   {ms(spec, 'ttft_ms'):15s} {ms(base, 'ttft_ms')}",
        f"TPOT ms (mean / p50)   {ms(spec, 'tpot_ms'):15s} {ms(base, 'tpot_ms')}",
        f"tokens/s per user      {spec['per_user_tok_s']['mean']:<15.1f} "
        f"{base['per_user_tok_s']['mean']:.1f}",
        f"acceptance rate        {acc.get('acceptance_rate') or 0:.3f}",
        tau_line,
        f"speedup TPOT           {speed('tpot_s')}",
        f"speedup tokens/s/user  {speed('per_user_tok_s')}",
        *category_lines(summary),
        *offline_lines(check.get("offline") or {}),
        "",
    ]


def _acceptance(variant: dict[str, Any]) -> dict[str, Any]:
    """The variant's acceptance: the per-request figures (Triton), else the workers' counters
    over the run (OpenAI through Dynamo: ``engine_counters``)."""
    acc = dict(variant.get("acceptance") or {})
    counters = variant.get("engine_counters") or {}
    if acc.get("tau_server") is None and counters.get("tau") is not None:
        acc["tau_server"] = counters["tau"]
        acc["acceptance_rate"] = counters.get("acceptance_rate")
    return acc


def category_lines(summary: dict[str, Any]) -> list[str]:
    """One line per category: its spec tau and per-user tok/s speedup."""
    out = []
    for cat, c in (summary.get("categories") or {}).items():
        tau = (c["variants"].get("spec") or {}).get("tau")
        sp = c["speedup"].get("per_user_tok_s")
        out.append(f"  {cat:13s} tau {tau if tau is not None else float('nan'):.2f}   "
                   f"speedup tokens/s/user "
                   + (f"{sp['speedup']:.2f}x ({sp['ci_low']:.2f}-{sp['ci_high']:.2f})"
                      if sp else "n/a"))
    return ["by category:", *out] if out else []


@contextmanager
def _triton(cfg: DemoRunConfig) -> Iterator[dict[str, Any]]:
    """tritonserver on the repository; the bench's targets (gRPC, the two ensembles)."""
    from specserve.triton.server import TritonServer

    server = TritonServer(Path(cfg.repo).resolve(), http_port=cfg.http_port,
                          grpc_port=cfg.grpc_port, metrics_port=cfg.metrics_port)
    try:
        server.start(timeout_s=cfg.startup_timeout_s)
        yield {"url": server.grpc_url, "model": "ensemble", "baseline_model": "ensemble_baseline"}
    finally:
        server.stop()


@contextmanager
def _dynamo(cfg: DemoRunConfig) -> Iterator[dict[str, Any]]:
    """Dynamo's frontend and one worker per served name; the bench's targets (OpenAI
    completions, each name's worker counters)."""
    from specserve.frontends.dynamo_serve import DynamoDeployment, DynamoServeConfig, ServedModel

    dep = DynamoDeployment(DynamoServeConfig(
        engine=Path(str(cfg.engine)), http_port=cfg.http_port,
        models=(ServedModel(DYNAMO_SPEC), ServedModel(DYNAMO_BASELINE, speculation=False))))
    try:
        dep.start(cfg.startup_timeout_s)
        urls = {m: tuple(w.metrics_url for w in dep.workers if w.model == m)
                for m in (DYNAMO_SPEC, DYNAMO_BASELINE)}
        yield {"url": dep.url.removeprefix("http://"), "protocol": "openai",
               "model": DYNAMO_SPEC, "baseline_model": DYNAMO_BASELINE,
               "metrics_urls": urls[DYNAMO_SPEC], "baseline_metrics_urls": urls[DYNAMO_BASELINE]}
    finally:
        dep.stop()


def run_demo(cfg: DemoRunConfig, progress: bool | None = None) -> DemoOutcome:
    """Start the server, benchmark, stop the server (always), check tau, return the outcome."""
    from specserve.client.config import BenchmarkConfig
    from specserve.client.datasets import dump_jsonl
    from specserve.client.run import run_benchmark

    cfg.validate()
    engine_record(cfg.engine)  # a bad build_config.json or eval.json fails before the server
    expected_tau(cfg.engine, cfg.eval_json)  # starts, in one line
    started = time.monotonic()
    serve = _dynamo if cfg.frontend == "dynamo" else _triton
    with sigterm_as_interrupt(), serve(cfg) as targets:
        startup_s = time.monotonic() - started
        prompts = demo_prompts(cfg)
        dataset = Path(cfg.out) / "prompts.jsonl"
        dataset.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(dataset, dump_jsonl(prompts))
        bench = BenchmarkConfig(
            out=cfg.out, dataset=str(dataset), requests=len(prompts) - cfg.warmup,
            warmup=cfg.warmup, max_tokens=cfg.max_tokens, concurrency=cfg.concurrency,
            temperature=0.0, seed=0, **targets)
        outcome = run_benchmark(bench, progress=progress)
    check = tau_check(outcome.summary, cfg.engine, cfg.eval_json, cfg.tau_tolerance,
                      {"prompts": "builtin-code", "seed": 0, "warmup": cfg.warmup,
                       "requests": cfg.requests, "max_tokens": cfg.max_tokens})
    if cfg.dataset is not None and check.get("ok") is not None:  # eval.json measured other
        check["ok"] = None                                      # prompts: shown, not checked
    check["frontend"] = cfg.frontend
    check["offline"] = offline_methods(cfg.eval_json)
    _append_offline(Path(cfg.out) / "README.md", check["offline"])
    check["server_startup_s"] = round(startup_s, 2)
    check["total_s"] = round(time.monotonic() - started, 2)
    write_json_atomic(Path(cfg.out) / "demo_check.json", check)
    code = outcome.exit_code or (1 if check.get("ok") is False else 0)
    return DemoOutcome(summary=outcome.summary, check=check, exit_code=code)
