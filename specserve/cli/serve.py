"""``specserve serve``: run tritonserver on a model repository, or NVIDIA Dynamo's OpenAI frontend
in front of specserve workers for an engine (``--frontend dynamo``), until Ctrl-C or SIGTERM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.serving.engine_params import DEFAULT_PREFIX_CACHE_MB

EXAMPLES = """
\b
Examples:
  specserve serve --repo triton_repo
  specserve serve --repo triton_repo --grpc-port 9001 --http-port 9000 --metrics-port 9002
  specserve serve --frontend dynamo --engine engines/demo --workers 2 --migration-limit 3
  specserve serve --frontend dynamo --engine engines/demo --baseline-name demo-nospec \\
      --format json > serve.json      # specserve bench --serve-json serve.json

Uses `tritonserver` from PATH (NVIDIA's containers) or the one bundled with nvidia-pytriton,
waits until /v2/health/ready answers, prints the endpoints, and stops cleanly on Ctrl-C/SIGTERM.
Engines with world size > 1 start through mpirun, one rank per GPU. Repositories of --flow
pytorch engines (Triton's llmapi model) run only inside NVIDIA's TensorRT-LLM container.
--frontend dynamo starts Dynamo's frontend (file discovery, TCP request plane, --router) and
--workers specserve workers per served name, all on 127.0.0.1 and free ports (--http-port 0),
waits until /v1/models lists every name, prints the frontend URL and each worker's metrics URL,
then supervises: a worker that exits, or stops answering Dynamo's health probe (a stopped
process; a wedged engine, found by Dynamo's canary request), is restarted with backoff (one
line each; --format json: one JSON object per line); requests on it migrate (--migration-limit)
or end with an error; five failures of one worker within 60 s end the service. A model
without a chat template is served for /v1/completions only.
Exit codes: 0 after a clean stop, 2 bad input, 3 the server failed to start or died.
"""


DYNAMO_DEFAULTS: dict[str, Any] = {"workers": 1, "router": "round-robin", "migration_limit": 0,
                                   "served_name": None, "baseline_name": None, "max_batch": 8,
                                   "log_dir": None, "prefix_cache_mb": DEFAULT_PREFIX_CACHE_MB,
                                   "kv_events": False}


@click.command("serve", epilog=EXAMPLES, short_help="Serve a model repository on Triton.")
@click.option("--repo", default=None, type=click.Path(file_okay=False),
              help="Model repository from `specserve repo` (--frontend triton).")
@click.option("--frontend", type=click.Choice(["triton", "dynamo"]), default="triton",
              show_default=True, help="tritonserver on --repo, or NVIDIA Dynamo on --engine.")
@click.option("--engine", default=None, type=click.Path(file_okay=False),
              help="Torch engine directory (--frontend dynamo).")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Dynamo: workers per served name.")
@click.option("--router", type=click.Choice(["round-robin", "random", "kv"]),
              default="round-robin", show_default=True, help="Dynamo: the frontend's router.")
@click.option("--migration-limit", type=click.IntRange(0, None), default=0, show_default=True,
              help="Dynamo: times a request whose worker died is re-sent to another.")
@click.option("--name", "served_name", default=None,
              help="Dynamo: served model name (default: the engine directory's name).")
@click.option("--baseline-name", default=None,
              help="Dynamo: also serve the engine without speculation under this name.")
@click.option("--max-batch", type=click.IntRange(1, None), default=8, show_default=True,
              help="Dynamo: sequences each worker batches in flight.")
@click.option("--log-dir", default=None, type=click.Path(file_okay=False),
              help="Dynamo: directory for the frontend's and workers' logs.")
@click.option("--prefix-cache-mb", type=click.IntRange(0, None),
              default=DEFAULT_PREFIX_CACHE_MB, show_default=True,
              help="Dynamo: each worker's prefix cache in MiB (0: off); with --router kv the "
                   "workers publish its blocks as KV events (--kv-events).")
@click.option("--kv-events/--no-kv-events", default=False, show_default=True,
              help="Dynamo: workers publish their prefix caches to the KV router. Dynamo "
                   "1.6.1 binds that ZMQ publisher on every interface (0.0.0.0), so it is off "
                   "for local serving unless asked.")
@FORMAT_OPTION
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None,
              help="HTTP port [default: 8000 for Triton, a free port for Dynamo].")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8002, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
              help="Seconds to wait for readiness.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="Server log file (default: a temp file, printed on failure).")
def command(repo: str | None, frontend: str, engine: str | None, host: str,
            http_port: int | None,
            grpc_port: int, metrics_port: int, timeout_s: float, log_path: str | None,
            fmt: str, **dynamo: Any) -> None:
    """Start tritonserver for REPO (or Dynamo for ENGINE) and keep it running."""
    from specserve.errors import SpecserveError

    if frontend == "dynamo":
        if engine is None or repo is not None:
            raise SpecserveError("--frontend dynamo serves --engine DIR (not --repo)")
        _serve_dynamo(Path(engine), host, http_port, timeout_s, fmt, **dynamo)
        return
    if repo is None or engine is not None:
        raise SpecserveError("--frontend triton serves --repo DIR (--engine is for --frontend "
                             "dynamo)")
    changed = sorted(k for k, v in dynamo.items() if v != DYNAMO_DEFAULTS[k])
    if changed:
        flag = {"served_name": "name"}.get(changed[0], changed[0]).replace("_", "-")
        raise SpecserveError(f"--{flag} is a --frontend dynamo option")
    from specserve.errors import ServerError
    from specserve.interrupts import sigterm_as_interrupt
    from specserve.triton.repository import read_repo_meta
    from specserve.triton.server import TritonServer

    meta = read_repo_meta(repo)
    if meta.get("flow") == "pytorch":
        _check_llmapi_serving(Path(repo))
    server = TritonServer(Path(repo), host=host,
                          http_port=8000 if http_port is None else http_port, grpc_port=grpc_port,
                          metrics_port=metrics_port, world_size=int(meta.get("world_size", 1)),
                          log_path=Path(log_path) if log_path else None)
    with sigterm_as_interrupt():
        server.start(timeout_s)
        try:  # a SIGTERM right after the ready line still stops the server cleanly (exit 0)
            click.echo(f"ready in {server.startup_s:.1f} s: gRPC {server.grpc_url}  "
                       f"HTTP http://{server.http_url}  metrics {server.metrics_url}  "
                       f"(log {server.log_path}; Ctrl-C to stop)")
            rc = server.wait()
        except KeyboardInterrupt:
            click.echo("stopping tritonserver ...", err=True)
            server.stop()
            return
    server.stop(keep_log=True)
    raise ServerError(f"{repo}: tritonserver exited with code {rc}; log {server.log_path}")


def _check_llmapi_serving(repo: Path) -> None:
    """The llmapi model (TensorRT-LLM's PyTorch route) runs only where tensorrt_llm imports:
    NVIDIA's nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 container."""
    import importlib.util

    from specserve.errors import SpecserveError

    if importlib.util.find_spec("tensorrt_llm") is None:
        raise SpecserveError(f"{repo}: the llmapi model (flow pytorch) runs inside NVIDIA's "
                             "TensorRT-LLM container; tensorrt_llm is not importable here")
    if not (repo / "tensorrt_llm" / "1" / "model.py").is_file():
        raise SpecserveError(f"{repo}/tensorrt_llm/1/model.py: missing (rerun specserve repo "
                             "with --llmapi-model-dir, upstream's llmapi tensorrt_llm/1)")


def _dynamo_text(d: dict[str, Any]) -> str:
    workers = "  ".join(f"{w['model']} {w['metrics_url']}" for w in d["workers"])
    return (f"ready in {d['startup_s']:.1f} s: frontend {d['frontend']} (models "
            f"{', '.join(d['models'])}; router {d['router']})  worker metrics: {workers}  "
            f"(logs {d['log_dir']}; Ctrl-C to stop)")


def _serve_dynamo(engine: Path, host: str, http_port: int | None, timeout_s: float, fmt: str,
                  workers: int, router: str, migration_limit: int, served_name: str | None,
                  baseline_name: str | None, max_batch: int, log_dir: str | None,
                  prefix_cache_mb: int, kv_events: bool) -> None:
    from specserve.errors import SpecserveError
    from specserve.frontends.dynamo_serve import DynamoServeConfig, ServedModel
    from specserve.frontends.dynamo_supervisor import serve_until_stopped

    if host != "127.0.0.1":
        raise SpecserveError("--frontend dynamo binds 127.0.0.1 only (--host)")
    models = [ServedModel(served_name or engine.resolve().name)]
    if baseline_name:
        models.append(ServedModel(baseline_name, speculation=False))
    cfg = DynamoServeConfig(engine=engine, models=tuple(models), workers=workers,
                            router=router, migration_limit=migration_limit,
                            http_port=http_port or 0,
                            max_batch=max_batch, log_dir=Path(log_dir) if log_dir else None,
                            prefix_cache_mb=prefix_cache_mb, kv_events=kv_events,
                            canary=True)
    if kv_events:
        click.echo("warning: --kv-events: each worker's KV-event publisher listens on every "
                   "interface (0.0.0.0; Dynamo 1.6.1 has no setting for its address)", err=True)
    serve_until_stopped(cfg, timeout_s, lambda dep: emit(dep.describe(), fmt, _dynamo_text),
                        lambda e: _event(e, fmt))


def _event(e: dict[str, Any], fmt: str) -> None:
    """One supervision event: a JSON line on stdout, or a line of text on stderr."""
    import json

    if fmt == "json":
        click.echo(json.dumps(e, sort_keys=True, default=str))
        return
    what = {"worker-exited": f"exited with code {e.get('code')} ({e.get('error')}); restarting "
                             f"in {e.get('restart_in_s')} s",
            "worker-hung": f"did not answer its health probe ({e.get('verdict')}); killed",
            "worker-restarted": "restarted",
            "worker-ready": f"ready again ({e.get('down_s')} s after it went down)"}
    click.echo(f"specserve: {e['worker']} (pid {e.get('pid')}) "
               f"{what.get(e['event'], e['event'])}", err=True)
