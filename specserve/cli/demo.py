"""``specserve demo``: serve a repository on real Triton, benchmark vs baseline, report."""

from __future__ import annotations

import sys
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  specserve demo --repo triton_repo --engine engines/demo \\
      --eval checkpoints/demo/eval.json --out reports/demo
\b
  specserve demo --frontend dynamo --engine engines/demo \\
      --eval checkpoints/demo/eval.json --out reports/demo-dynamo
\b
`make demo` runs the whole pipeline (demo-model, build, repo) before this command;
`make demo-dynamo` the same through NVIDIA Dynamo's OpenAI frontend (no repository: the
engine is served as `demo` and, without speculation, `demo-baseline`).
Exit code 0 on success, 1 when requests failed or tau differs from eval.json by more than
the tolerance, 2 for bad input, 3 when the server cannot start.
"""


def _why(summary: dict[str, Any]) -> str:
    if summary.get("interrupted"):
        return "interrupted"
    if summary.get("aborted"):
        return str(summary["aborted"])
    r = summary.get("records", {})
    return f"{r.get('error', 0)} errors, {r.get('cancelled', 0)} cancelled"


def _refuse_triton_options() -> None:
    """--repo, --grpc-port and --metrics-port mean nothing behind Dynamo: refused if given."""
    from click.core import ParameterSource

    from specserve.errors import SpecserveError

    ctx = click.get_current_context()
    for name in ("repo", "grpc_port", "metrics_port"):
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            raise SpecserveError(f"--{name.replace('_', '-')} is a --frontend triton option "
                                 "(--frontend dynamo serves --engine)")


@click.command("demo", epilog=EXAMPLES,
               short_help="Serve a repository on Triton, benchmark spec vs baseline, report.")
@click.option("--repo", type=click.Path(file_okay=False), default="triton_repo",
              show_default=True, help="Repository written with `specserve repo --baseline`.")
@click.option("--engine", type=click.Path(file_okay=False), default="engines/demo",
              show_default=True, help="Engine the repository serves (for its spec mode).")
@click.option("--eval", "eval_json", type=click.Path(dir_okay=False),
              default="checkpoints/demo/eval.json", show_default=True,
              help="Offline evaluation to compare tau with.")
@click.option("--out", default="reports/demo", show_default=True, help="Report folder.")
@click.option("--requests", type=click.IntRange(1), default=24, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=96, show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True)
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=0, help="0 = a free port.")
@click.option("--http-port", type=click.IntRange(0, 65535), default=0, help="0 = a free port.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="0 = a free port.")
@click.option("--dataset", type=click.Path(dir_okay=False), default=None,
              help="Prompts JSONL to serve instead of the builtin sets (make demo: the "
                   "held-out chat set with the chat template applied).")
@click.option("--frontend", type=click.Choice(["triton", "dynamo"]), default="triton",
              show_default=True, help="Serve --repo on Triton, or --engine behind Dynamo.")
@FORMAT_OPTION
def command(repo: str, engine: str, eval_json: str, out: str, requests: int, warmup: int,
            max_tokens: int, concurrency: int, grpc_port: int, http_port: int,
            metrics_port: int, dataset: str | None, frontend: str, fmt: str) -> None:
    """Start tritonserver on 127.0.0.1 for REPO, run `specserve bench` with speculation
    (`ensemble`) against the no-speculation baseline (`ensemble_baseline`) in the same run,
    write the report with plots to OUT, stop the server, and print a short summary."""
    from specserve.demo import DemoRunConfig, run_demo, summary_lines

    if frontend == "dynamo":
        _refuse_triton_options()
    cfg = DemoRunConfig(repo=repo, out=out, engine=engine, eval_json=eval_json,
                        requests=requests, warmup=warmup, max_tokens=max_tokens,
                        concurrency=concurrency, grpc_port=grpc_port, http_port=http_port,
                        metrics_port=metrics_port, frontend=frontend, dataset=dataset)
    result = run_demo(cfg)
    emit({"summary": result.summary, "check": result.check}, fmt,
         lambda d: "\n".join(summary_lines(d["summary"], d["check"]))
         + f"\nreport: {out}/README.md"
         + ("" if d["summary"].get("status") == "ok" else
            f" (PARTIAL: {_why(d['summary'])})"))
    sys.exit(result.exit_code)
