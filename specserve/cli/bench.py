"""``specserve bench``: stream requests to a Triton or OpenAI-compatible server and report
latency and acceptance."""

from __future__ import annotations

import sys
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  # spec vs no-speculation baseline served side by side, 4 concurrent streams
  specserve bench --url 127.0.0.1:8001 --baseline-model ensemble_baseline \\
      --concurrency 4 --requests 64 --out reports/bench
\b
  # open loop at 2 requests/s over HTTP generate_stream, with SLOs for goodput
  specserve bench --url 127.0.0.1:8000 --protocol http --request-rate 2 \\
      --dataset prompts.jsonl --slo ttft=200,tpot=50 --out reports/rate2
\b
  # two replicas of one service, least-outstanding; per-replica and pooled figures
  specserve bench --url 10.0.0.5:8001 --url 10.0.0.6:8001 --balance least-outstanding \\
      --concurrency 16 --requests 256 --out reports/pool
\b
  # load x context: 3 concurrencies x 3 input lengths of the served tokenizer
  specserve bench --url 127.0.0.1:8001 --baseline-model ensemble_baseline \\
      --sweep 1,4,8 --input-lengths 128,256,448 --engine engines/demo --out reports/ctx
\b
  # Predicted Outputs: code edits with the unedited code as each record's "prediction",
  # against the same model without it (the baseline variant never carries the prediction)
  specserve prompts --code-edits --per-category 12 --chat-template checkpoints/smollm2 \\
      --out edits.jsonl
  specserve bench --url 127.0.0.1:8001 --model ensemble --baseline-model ensemble \\
      --dataset edits.jsonl --temperature 0 --requests 12 --out reports/pred
\b
  # machine-readable summary
  specserve bench --url 127.0.0.1:8001 --requests 8 --format json --out reports/q

Requests and warmup count per variant. Every request goes to OUT/requests.jsonl as it
completes; OUT also gets summary.json, summary.csv, PNG plots and README.md. Exit code 0 when
every measured request completed, 1 for a partial report, 2 for bad input, 3 when the server
cannot be reached.
"""


def _text(s: dict[str, Any]) -> str:
    from specserve.client.report import (
        flag_lines,
        prediction_lines,
        replica_table,
        speedup_table,
        text_table,
    )

    lines = [text_table(s), *flag_lines(s)]
    if s.get("prediction"):
        lines += ["", *prediction_lines(s)]
    if s.get("replicas"):
        lines += ["", "per replica:", replica_table(s)]
    if s["speedup"]:
        lines += ["", speedup_table(s["speedup"])]
    if s.get("aborted"):
        lines += ["", f"aborted: {s['aborted']}"]
    r = s["records"]
    lines += ["", f"{r['completed']} completed, {r['error']} errors, {r['cancelled']} cancelled;"
              f" report in {s['config']['out']} ({s['status']})"]
    return "\n".join(lines)


def _sweep(cfg: Any, levels_text: str, fmt: str, lengths_text: str | None = None,
           engine: str | None = None) -> None:
    from specserve.client.run import run_benchmark
    from specserve.client.sweep import (
        build_contexts,
        crossover_line,
        parse_levels,
        run_sweep,
        sweep_table,
    )
    from specserve.errors import SpecserveError

    levels = parse_levels(levels_text)
    if cfg.concurrency is not None or cfg.request_rate is not None:
        raise SpecserveError("--sweep sets the concurrency of each phase: drop --concurrency "
                             "and --request-rate")
    contexts: list[Any] = []
    note = None
    if lengths_text is not None:
        from specserve.client.context import parse_lengths

        if not cfg.has_baseline:
            raise SpecserveError("--sweep compares speculation with a baseline: give "
                                 "--baseline-model or --baseline-url")
        cfg, contexts, note = build_contexts(cfg, parse_lengths(lengths_text), engine)
    summary = run_sweep(cfg, levels, lambda c: run_benchmark(c).summary, contexts=contexts,
                        context_limits=note)
    emit(summary, fmt, lambda s: "\n".join(
        [sweep_table(s), "", crossover_line(s), f"report in {s['config']['out']} ({s['status']})"]))
    if summary["exit_code"]:
        sys.exit(summary["exit_code"])


def _serve_targets(kw: dict[str, Any], path: str | None) -> None:
    """--serve-json: the frontend, the model and the workers' metrics URLs from that file."""
    kw["metrics_urls"] = tuple(kw["metrics_urls"])
    if path is None:
        return
    from specserve.client.serve_json import read_serve_json
    from specserve.errors import SpecserveError

    src = click.get_current_context().get_parameter_source("protocol")
    if kw["protocol"] != "openai" and src != click.core.ParameterSource.DEFAULT:
        raise SpecserveError("--serve-json names a Dynamo frontend: --protocol openai")
    t = read_serve_json(path)
    kw["urls"] = kw["urls"] or (t.frontend,)
    kw["protocol"] = "openai"
    if kw["model"] == "ensemble":  # the default: the first served name
        kw["model"] = t.models[0]
    kw["metrics_urls"] = kw["metrics_urls"] or t.urls_of(kw["model"])
    if kw["baseline_model"]:
        kw["baseline_metrics_urls"] = t.urls_of(kw["baseline_model"])


@click.command("bench", epilog=EXAMPLES,
               short_help="Benchmark a served model: latency, acceptance, speedup.")
@click.option("--url", "urls", multiple=True,
              help="Server HOST:PORT (Triton gRPC or HTTP port; OpenAI: http://HOST:PORT too)."
                   " Repeat for replicas of one service: requests are spread over them.")
@click.option("--balance", type=click.Choice(["round-robin", "least-outstanding"]),
              default="round-robin", show_default=True,
              help="How requests are spread over several --url (a failing replica is backed "
                   "off and probed again).")
@click.option("--protocol", type=click.Choice(["grpc", "http", "openai"]), default="grpc",
              show_default=True,
              help="Triton gRPC streaming, Triton HTTP generate, or OpenAI-compatible HTTP "
                   "(trtllm-serve, vLLM, SGLang, Dynamo).")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions",
              show_default=True, help="OpenAI: /v1/completions or /v1/chat/completions.")
@click.option("--model", default="ensemble", show_default=True, help="Model to benchmark.")
@click.option("--baseline-model", default=None, help="No-speculation model for the speedup.")
@click.option("--baseline-url", default=None, help="Server of the baseline (default --url).")
@click.option("--concurrency", type=int, default=None, help="Closed loop: streams in flight.")
@click.option("--sweep", default=None, metavar="C1,C2,...",
              help="Spec and baseline at each concurrency, each in its own phase; reports the "
                   "speedup per level and where speculation stops paying (needs a baseline).")
@click.option("--input-lengths", default=None, metavar="L1,L2,...",
              help="With --sweep: also sweep the context, prompts of exactly L tokens of the "
                   "served tokenizer built from the prompt set; per (length, concurrency) cell "
                   "spec and baseline in their own phases, step cost and tau against length.")
@click.option("--engine", "engine_dir", type=click.Path(file_okay=False), default=None,
              help="The served engine's folder: its build_config.json bounds --input-lengths "
                   "(max_input_len, max_seq_len) and its tokenizer/ counts the tokens.")
@click.option("--request-rate", type=float, default=None, help="Open loop: Poisson req/s.")
@click.option("--requests", "n_requests", type=int, default=32, show_default=True,
              help="Measured requests per variant.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Per variant.")
@click.option("--dataset", type=click.Path(dir_okay=False), default=None,
              help="JSONL ({\"prompt\"|\"messages\"|\"turns\": ..., \"category\", "
                   "\"max_tokens\", \"prediction\": optional}) or ShareGPT JSON.")
@click.option("--prompts", default=None,
              help="Builtin prompt set: builtin-code (default), builtin-prose, builtin-json, "
                   "builtin-chat (multi-turn), builtin-mix (docs/workloads.md).")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds prompts, arrivals, bootstrap and the server's sampler.")
@click.option("--end-id", type=int, default=None, help="End-of-sequence token id to send.")
@click.option("--num-draft-tokens", type=int, default=None,
              help="Send num_draft_tokens (tensorrt_llm_bls: the draft-target / n-gram loop's "
                   "K) to every model that declares it; the ensembles do not.")
@click.option("--stream/--no-stream", default=True, show_default=True)
@click.option("--ignore-eos", is_flag=True, default=False,
              help="OpenAI: send ignore_eos, so every answer has exactly --max-tokens tokens.")
@click.option("--server-metrics/--no-server-metrics", "scrape_metrics", default=True,
              show_default=True,
              help="OpenAI: read the server's Prometheus counters before and after the run "
                   "(acceptance from vllm:spec_decode_*, trtllm_spec_decode_*, sglang:*).")
@click.option("--metrics-url", "metrics_urls", multiple=True,
              help="OpenAI: a Prometheus endpoint of the spec model's workers (repeat for each"
                   " worker behind a Dynamo frontend): their counter deltas are summed.")
@click.option("--serve-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The JSON of `specserve serve --frontend dynamo --format json`: the "
                   "frontend (--url) and every worker's metrics URL of --model and "
                   "--baseline-model (--model defaults to the first served name).")
@click.option("--perf-outputs/--no-perf-outputs", default=True, show_default=True,
              help="Ask the server for perf metrics and per-response token counts (off: send "
                   "only what a plain client sends; acceptance is then not recorded).")
@click.option("--prediction/--no-prediction", "send_prediction", default=True,
              show_default=True,
              help="Send each record's \"prediction\" (Predicted Outputs) with its spec request "
                   "(never the baseline's): Triton's prediction input (ensemble, BLS, "
                   "tensorrt_llm); OpenAI as --prediction-field says. The report gives the "
                   "server's accepted/rejected prediction tokens and, where token ids come back "
                   "(--model tensorrt_llm, with --tokenizer), the client's recount.")
@click.option("--prediction-field", type=click.Choice(["nvext", "openai"]), default="nvext",
              show_default=True,
              help="OpenAI protocol: nvext (nvext.annotations [\"prediction:<text>\"], what "
                   "Dynamo takes; its frontend refuses OpenAI's field) or openai (top-level "
                   "prediction {type: content}, for servers that take OpenAI's field).")
@click.option("--slo", default=None, help="Goodput SLOs in ms, e.g. ttft=200,tpot=50.")
@click.option("--tokenizer", type=click.Path(exists=True), default=None,
              help="The model's tokenizer: counts tokens when the server sends none; needed by "
                   "a model that takes token ids (--model tensorrt_llm) and for the recount of "
                   "accepted prediction tokens.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
              help="Per-request timeout (s).")
@click.option("--out", default="reports/bench", show_default=True, help="Report directory.")
@FORMAT_OPTION
def command(fmt: str, n_requests: int, sweep: str | None, input_lengths: str | None,
            engine_dir: str | None, **kw: Any) -> None:
    """Stream requests to Triton or an OpenAI server, record every request, summarize, plot.

    Records TTFT, ITL per token (a chunk's gap divided over its tokens), TPOT, E2E, tokens per
    step and the server's acceptance figures; with a baseline, spec and baseline requests are
    interleaved and the report gives each metric's speedup with a 95% bootstrap interval.
    """
    from specserve.client.config import BenchmarkConfig, host_port
    from specserve.client.run import run_benchmark

    _serve_targets(kw, kw.pop("serve_json"))
    if not kw["urls"]:
        from specserve.errors import SpecserveError

        raise SpecserveError("--url is required (or --serve-json)")
    urls = [host_port(u) for u in kw.pop("urls")]
    kw["url"], kw["replicas"] = urls[0], tuple(urls[1:])
    if kw["baseline_url"]:
        kw["baseline_url"] = host_port(kw["baseline_url"])
    cfg = BenchmarkConfig(requests=n_requests, **kw)
    cfg.validate()
    if input_lengths is not None and sweep is None:
        from specserve.errors import SpecserveError

        raise SpecserveError("--input-lengths is an axis of --sweep: give --sweep C1,C2,...")
    if sweep is not None:
        _sweep(cfg, sweep, fmt, input_lengths, engine_dir)
        return
    outcome = run_benchmark(cfg)
    emit(outcome.summary, fmt, _text)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)
