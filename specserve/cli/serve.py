"""``specserve serve``: run tritonserver on a model repository until Ctrl-C or SIGTERM."""

from __future__ import annotations

from pathlib import Path

import click

EXAMPLES = """
\b
Examples:
  specserve serve --repo triton_repo
  specserve serve --repo triton_repo --grpc-port 9001 --http-port 9000 --metrics-port 9002

Uses `tritonserver` from PATH (NVIDIA's containers) or the one bundled with nvidia-pytriton,
waits until /v2/health/ready answers, prints the endpoints, and stops cleanly on Ctrl-C/SIGTERM.
Engines with world size > 1 start through mpirun, one rank per GPU. Repositories of --flow
pytorch engines (Triton's llmapi model) run only inside NVIDIA's TensorRT-LLM container.
Exit codes: 0 after a clean stop, 2 bad input, 3 the server failed to start or died.
"""


@click.command("serve", epilog=EXAMPLES, short_help="Serve a model repository on Triton.")
@click.option("--repo", required=True, type=click.Path(file_okay=False),
              help="Model repository from `specserve repo`.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--http-port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8002, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
              help="Seconds to wait for readiness.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="Server log file (default: a temp file, printed on failure).")
def command(repo: str, host: str, http_port: int, grpc_port: int, metrics_port: int,
            timeout_s: float, log_path: str | None) -> None:
    """Start tritonserver for REPO and keep it running."""
    from specserve.errors import ServerError
    from specserve.interrupts import sigterm_as_interrupt
    from specserve.triton.repository import read_repo_meta
    from specserve.triton.server import TritonServer

    meta = read_repo_meta(repo)
    if meta.get("flow") == "pytorch":
        _check_llmapi_serving(Path(repo))
    server = TritonServer(Path(repo), host=host, http_port=http_port, grpc_port=grpc_port,
                          metrics_port=metrics_port, world_size=int(meta.get("world_size", 1)),
                          log_path=Path(log_path) if log_path else None)
    with sigterm_as_interrupt():
        server.start(timeout_s)
        click.echo(f"ready in {server.startup_s:.1f} s: gRPC {server.grpc_url}  "
                   f"HTTP http://{server.http_url}  metrics {server.metrics_url}  "
                   f"(log {server.log_path}; Ctrl-C to stop)")
        try:
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
