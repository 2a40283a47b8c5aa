"""``specserve conform``: the same requests to a speculative server and a no-speculation
baseline; a dated compatibility matrix. Parses the options into a
:class:`specserve.conform.run.ConformConfig`, calls :func:`specserve.conform.run.run_conform`
and prints the one-screen summary (exit 1 when a check failed or is broken)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.errors import SpecserveError

EXAMPLES = """
\b
Examples:
  # our engine on Triton: the speculative ensemble vs the in-server baseline
  specserve conform --url 127.0.0.1:8001 --protocol grpc --model ensemble \\
      --baseline-model ensemble_baseline --method draft --tokenizer checkpoints/demo/tokenizer \\
      --context-limit 512 --out reports/conform/ours-draft
  # vLLM with speculation vs a plain vLLM
  specserve conform --url 127.0.0.1:8100 --baseline-url 127.0.0.1:8101 --protocol openai \\
      --model demo --method eagle3 --extra-body '{"return_token_ids": true}' \\
      --out reports/conform/vllm-eagle3
"""


def _extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SpecserveError(f"--extra-body: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise SpecserveError("--extra-body: expected a JSON object")
    return data


@click.command("conform", epilog=EXAMPLES,
               short_help="Does speculation change what the API returns? A matrix.")
@click.option("--url", required=True, help="The speculative server, host:port.")
@click.option("--protocol", type=click.Choice(["openai", "grpc", "http"]), required=True)
@click.option("--model", default="ensemble", show_default=True,
              help="Model name on the speculative server.")
@click.option("--baseline-url", default=None, help="A no-speculation server, host:port.")
@click.option("--baseline-model", default=None,
              help="The baseline's model name (same server unless --baseline-url).")
@click.option("--checks", default=None,
              help="Comma-separated check names, run in this order (default: all, in their "
              "numbered order).")
@click.option("--budget-s", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Time budget of the whole run; checks left are 'not run'.")
@click.option("--method", default="unknown", show_default=True,
              help="The speculation method, for the matrix (none, draft, ngram, ...).")
@click.option("--engine", default=None, help="Engine name for the matrix (default: asked).")
@click.option("--engine-version", default=None, help="Engine version (default: asked).")
@click.option("--extra-body", default=None,
              help="OpenAI: JSON merged into every request, e.g. '{\"return_token_ids\": true}'.")
@click.option("--num-draft-tokens", type=click.IntRange(min=1), default=None,
              help="Triton: num_draft_tokens K for the speculative model (tensorrt_llm_bls).")
@click.option("--tokenizer", type=click.Path(exists=True), default=None,
              help="tokenizer.json or its directory: token ids where answers carry none.")
@click.option("--context-limit", type=click.IntRange(min=8), default=None,
              help="Prompt + output tokens the server takes (default: as it states).")
@click.option("--max-tokens", type=click.IntRange(min=4), default=32, show_default=True)
@click.option("--samples", type=click.IntRange(min=20), default=300, show_default=True,
              help="Distribution check: samples per side per prefix.")
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=1e-3, show_default=True, help="Distribution check: level.")
@click.option("--logprob-tol", type=click.FloatRange(min=0), default=0.02, show_default=True,
              help="Logprobs check: tolerance in nats.")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Per request; past it the check is broken.")
@click.option("--out", type=click.Path(file_okay=False), default="reports/conform",
              show_default=True)
@FORMAT_OPTION
def command(url: str, protocol: str, model: str, baseline_url: str | None,
            baseline_model: str | None, checks: str | None, budget_s: float, method: str,
            engine: str | None, engine_version: str | None, extra_body: str | None,
            num_draft_tokens: int | None, tokenizer: str | None, context_limit: int | None,
            max_tokens: int, samples: int, seed: int, alpha: float, logprob_tol: float,
            timeout_s: float, out: str, fmt: str) -> None:
    """Run the conformance checks against a speculative server and its baseline."""
    from specserve.conform.checks import ORDER, Settings
    from specserve.conform.run import ConformConfig, run_conform

    names = tuple(c.strip() for c in checks.split(",") if c.strip()) if checks else ORDER
    settings = Settings(max_tokens=max_tokens, timeout_s=timeout_s, seed=seed,
                        samples=samples, alpha=alpha, logprob_tol=logprob_tol,
                        context_limit=context_limit, tokenizer=tokenizer)
    cfg = ConformConfig(url=url, protocol=protocol, model=model, out=Path(out),
                        baseline_url=baseline_url, baseline_model=baseline_model,
                        checks=names, budget_s=budget_s, method=method, engine=engine,
                        engine_version=engine_version, extra_body=_extra_body(extra_body),
                        num_draft_tokens=num_draft_tokens,
                        settings=settings)
    report = run_conform(cfg, progress=fmt == "text" and sys.stderr.isatty())
    emit(report, fmt, lambda r: r["summary"] + f"\nwrote {out}/matrix.md, {out}/matrix.json")
    if report["counts"]["fail"] or report["counts"]["broken"]:
        sys.exit(1)
