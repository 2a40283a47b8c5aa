"""``specserve engine``: build (or reuse) the engine for a ``specserve demo-model`` checkpoint
with the method its eval.json measured fastest (what ``make engine`` runs). The rules live in
:mod:`specserve.build.demo_engine`."""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit


def _text(data: dict[str, Any]) -> str:
    c = data["config"]
    head = f"engine: {data['method']} ({c['backend']}, {c['dtype']})"
    if data["reused"]:
        return f"{head}\n{data['out']} is up to date (same options, input hashes and versions)"
    return f"{head}\nbuilt {data['out']}\nrecord: {data['build_config']}"


@click.command("engine", short_help="Build the demo checkpoint's fastest engine (make engine).")
@click.option("--checkpoint", default="checkpoints/demo", show_default=True,
              help="A `specserve demo-model` output: target/, medusa/, draft/, eagle3/, "
                   "eval.json, medusa_tree_cpu.json.")
@click.option("--model", default="", help="Target model [default: CHECKPOINT/target].")
@click.option("--medusa", default="", help="Medusa heads (method medusa) [default: "
              "CHECKPOINT/medusa, with its tuned CPU tree].")
@click.option("--draft", default="", help="Draft model (method draft) [default: "
              "CHECKPOINT/draft].")
@click.option("--eagle3", default="", help="EAGLE-3 head (method eagle3) [default: "
              "CHECKPOINT/eagle3].")
@click.option("--method", default="", help="fastest | medusa | draft | eagle3 | ngram "
              "[default: the method of the directory given; a model other than "
              "CHECKPOINT/target: medusa; else fastest = eval.json's fastest_method].")
@click.option("--backend", default="torch", show_default=True, help="torch | trtllm | auto.")
@click.option("--dtype", default="", help="float32 | bfloat16 | float16 | auto [default: "
              "float32 on torch (as eval.json measured), float16 on trtllm].")
@click.option("--out", default="engines/demo", show_default=True, help="Engine directory.")
@FORMAT_OPTION
def command(checkpoint: str, model: str, medusa: str, draft: str, eagle3: str, method: str,
            backend: str, dtype: str, out: str, fmt: str) -> None:
    """Pick the speculation method from CHECKPOINT/eval.json (or the flags), then reuse OUT when
    its build_config.json records the same resolved options, input hashes and package
    versions, else build it with `specserve build` (K = 4; the tuned Medusa tree). Empty
    values mean "not given", so `make engine` passes its variables straight through.

    \b
    Examples:
      specserve engine                                   # what `make engine` does
      specserve engine --method draft --out engines/draft
      specserve engine --medusa my-heads --model my-target --out engines/mine
    """
    from specserve.build.demo_engine import EngineRequest, make_engine

    req = EngineRequest(checkpoint=checkpoint, model=model, medusa=medusa, draft=draft,
                        eagle3=eagle3, method=method, backend=backend, dtype=dtype, out=out)
    emit(make_engine(req), fmt, _text)
