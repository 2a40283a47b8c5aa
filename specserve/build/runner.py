"""Run a :class:`BuildPlan`: each step's argv as a subprocess (never a shell), its output
streamed line by line to a log file and the console under a rich progress display.

A failing step or Ctrl-C stops the build: the child is terminated and the caller's staging
directory is removed (see :mod:`specserve.build.staging`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from specserve.build.plan import BuildPlan, BuildStep
from specserve.errors import SpecserveError

TERMINATE_GRACE_S = 10.0


def preflight(plan: BuildPlan) -> None:
    """Every executable is on PATH and every script exists, before anything runs."""
    for step in plan.steps:
        exe = step.argv[0]
        if shutil.which(exe) is None:
            raise SpecserveError(f"{exe}: not found on PATH (step '{step.name}'; run inside "
                                 f"{plan.pin.get('image', 'the TensorRT-LLM container')})")
        if len(step.argv) > 1 and step.argv[1].endswith(".py") and not Path(step.argv[1]).is_file():
            raise SpecserveError(f"{step.argv[1]}: not found (set TRTLLM_EXAMPLES_DIR to the "
                                 "TensorRT-LLM examples directory)")


def run_plan(plan: BuildPlan, log_path: Path, console: Console | None = None) -> None:
    """Run the steps in order; raise SpecserveError on the first failure."""
    console = console or Console(stderr=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log, Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:
        task = progress.add_task("build", total=len(plan.steps))
        for i, step in enumerate(plan.steps, 1):
            progress.update(task, description=f"[{i}/{len(plan.steps)}] {step.name}")
            progress.console.print(f"$ {step.shell()}", markup=False, highlight=False)
            log.write(f"$ {step.shell()}\n")
            rc = _run_step(step, log, progress.console)
            if rc != 0:
                raise SpecserveError(f"step '{step.name}' failed: {step.argv[0]} exited with "
                                     f"{rc} (log: {log_path})")
            check_step_output(step)
            progress.advance(task)


def _run_step(step: BuildStep, log: IO[str], console: Console) -> int:
    proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
        list(step.argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", bufsize=1, env=os.environ.copy(),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            console.print(line.rstrip("\n"), markup=False, highlight=False)
        return proc.wait()
    except BaseException:
        _stop(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def _stop(proc: subprocess.Popen[str]) -> None:
    """Terminate a child (Ctrl-C or error in the parent), then kill it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_step_output(step: BuildStep) -> None:
    """A step that exited 0 must have written ``config.json`` and one file per rank."""
    out = Path(step.output_dir)
    if step.kind == "modelopt":  # a ModelOpt HF export: config.json + hf_quant_config.json
        missing_files = [n for n in ("config.json", "hf_quant_config.json")
                         if not (out / n).is_file()]
        if missing_files:
            raise SpecserveError(f"step '{step.name}': exited 0 but {out} lacks "
                                 f"{', '.join(missing_files)}")
        return
    suffix = "engine" if step.kind == "build" else "safetensors"
    if not (out / "config.json").is_file():
        raise SpecserveError(f"step '{step.name}': exited 0 but {out}/config.json is missing")
    missing = [f"rank{r}.{suffix}" for r in range(step.ranks)
               if not (out / f"rank{r}.{suffix}").is_file()]
    if missing:
        raise SpecserveError(f"step '{step.name}': exited 0 but {out} lacks {', '.join(missing)}")
