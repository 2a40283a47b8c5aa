"""``specserve repo``: write the Triton model repository for an engine directory."""

from __future__ import annotations

from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION, emit

EXAMPLES = """
\b
Examples:
  specserve repo --engine engines/demo --out triton_repo
  specserve repo --engine engines/demo --out triton_repo --baseline --force
  specserve repo --engine engines/llama-medusa-fp8 --out /models/repo --max-batch-size 64 \\
      --tokenizer /models/tokenizer --max-queue-delay-us 100

Layout and tensor names are TensorRT-LLM 1.2.1's inflight_batcher_llm (ensemble, preprocessing,
tensorrt_llm, postprocessing, tensorrt_llm_bls; tensorrt_llm_draft for draft-target engines).
Defaults come from the engine's build_config.json. Serve it with `specserve serve --repo OUT`.
Draft-target TensorRT-LLM repositories follow upstream's recipe: tensorrt_llm and
tensorrt_llm_draft non-decoupled (the BLS calls them step by step; the BLS may stream), KV reuse
on, kv_cache_free_gpu_mem_fraction 0.5 each on a shared GPU; `specserve serve` starts them in
TensorRT-LLM's orchestrator mode (TRTLLM_ORCHESTRATOR=1), as launch_triton_server.py
--multi-model does:

\b
  specserve repo --engine engines/dt --out repo --gpu-device-ids 0 --draft-gpu-device-ids 1

Engines built with `specserve build --flow pytorch` get Triton's llmapi Python model instead
(tensorrt_llm/config.pbtxt + 1/model.yaml = the build's extra_llm_api_options.yaml keys + model
+ triton_config; upstream's model.py from a TensorRT-LLM v1.2.1 clone):

\b
  specserve repo --engine engines/l3-eagle3 --out repo \\
      --llmapi-model-dir TensorRT-LLM/triton_backend/all_models/llmapi/tensorrt_llm/1
"""


def _text(d: dict[str, Any]) -> str:
    flow = " (llmapi, flow pytorch)" if d.get("flow") == "pytorch" else ""
    text = (f"wrote {d['repo']} ({d['backend']} engine{flow}, spec_mode {d['spec_mode']}): "
            + ", ".join(d["models"]))
    if d.get("flow") == "pytorch" and not d.get("upstream_model_py"):
        text += ("\nnote: copy upstream's llmapi model.py into tensorrt_llm/1/ (or pass "
                 "--llmapi-model-dir) before serving")
    return text


@click.command("repo", epilog=EXAMPLES, short_help="Write a Triton model repository.")
@click.option("--engine", "engine_dir", required=True, type=click.Path(file_okay=False),
              help="Engine directory from `specserve build`.")
@click.option("--out", required=True, type=click.Path(), help="Repository folder to write.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=None,
              help="Triton max_batch_size (default: the engine's).")
@click.option("--preprocessing-instances", type=click.IntRange(min=1), default=1,
              show_default=True)
@click.option("--postprocessing-instances", type=click.IntRange(min=1), default=1,
              show_default=True)
@click.option("--bls-instances", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--decoupled/--no-decoupled", default=True, show_default=True,
              help="Decoupled (streaming) tensorrt_llm and BLS models.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False), default=None,
              help="Tokenizer folder for pre/postprocessing (default: ENGINE/tokenizer).")
@click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=0, show_default=True,
              help="Dynamic batching queue delay in microseconds.")
@click.option("--accumulate-tokens", is_flag=True, help="BLS decodes all tokens so far.")
@click.option("--baseline", is_flag=True,
              help="Reference engines: also ensemble_baseline -> tensorrt_llm_baseline "
                   "(same engine, speculation off).")
@click.option("--kv-cache-fraction", type=float, default=None,
              help="TensorRT-LLM: kv_cache_free_gpu_mem_fraction of tensorrt_llm, in (0, 1] "
                   "[default: 0.9; 0.5 when the draft shares its GPU].")
@click.option("--draft-kv-cache-fraction", type=float, default=None,
              help="TensorRT-LLM draft-target: the same for tensorrt_llm_draft [default: 0.5 "
                   "on the target's GPU, else 0.9]; the two sum to at most 1 on one GPU.")
@click.option("--gpu-device-ids", default=None,
              help="TensorRT-LLM: GPUs of tensorrt_llm, one id per rank, e.g. 0 or 0,1 "
                   "[default: ranks 0..world_size-1].")
@click.option("--draft-gpu-device-ids", default=None,
              help="TensorRT-LLM draft-target: the GPU of tensorrt_llm_draft [default: 0].")
@click.option("--max-tokens-in-paged-kv-cache", type=int, default=None,
              help="TensorRT-LLM: cap on KV-cache tokens per model [default: from the memory "
                   "fraction].")
@click.option("--max-attention-window-size", type=int, default=None,
              help="TensorRT-LLM: attention window per model [default: max_seq_len].")
@click.option("--llmapi-model-dir", type=click.Path(file_okay=False), default=None,
              help="--flow pytorch engines: upstream's triton_backend/all_models/llmapi/"
                   "tensorrt_llm/1 (a TensorRT-LLM v1.2.1 clone); its model.py and helpers.py "
                   "are copied into the repository.")
@click.option("--fast-logits", is_flag=True,
              help="TensorRT-LLM draft-target: speculative_decoding_fast_logits and "
                   "participant_ids (orchestrator rank 0, draft 1, target 2..); `specserve "
                   "serve` then starts every rank itself (orchestrator without spawning).")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@FORMAT_OPTION
def command(engine_dir: str, out: str, max_batch_size: int | None, preprocessing_instances: int,
            postprocessing_instances: int, bls_instances: int, decoupled: bool,
            tokenizer_dir: str | None, max_queue_delay_us: int, accumulate_tokens: bool,
            baseline: bool, kv_cache_fraction: float | None,
            draft_kv_cache_fraction: float | None, gpu_device_ids: str | None,
            draft_gpu_device_ids: str | None, max_tokens_in_paged_kv_cache: int | None,
            max_attention_window_size: int | None, llmapi_model_dir: str | None,
            fast_logits: bool, force: bool, fmt: str) -> None:
    """Write a Triton model repository for ENGINE into OUT (atomically)."""
    from specserve.triton.repository import RepoOptions, read_repo_meta, write_repository

    opts = RepoOptions(
        max_batch_size=max_batch_size, preprocessing_instance_count=preprocessing_instances,
        postprocessing_instance_count=postprocessing_instances, bls_instance_count=bls_instances,
        decoupled=decoupled, tokenizer_dir=tokenizer_dir, max_queue_delay_us=max_queue_delay_us,
        baseline=baseline, accumulate_tokens=accumulate_tokens,
        kv_cache_fraction=kv_cache_fraction, draft_kv_cache_fraction=draft_kv_cache_fraction,
        gpu_device_ids=gpu_device_ids, draft_gpu_device_ids=draft_gpu_device_ids,
        max_tokens_in_paged_kv_cache=max_tokens_in_paged_kv_cache,
        max_attention_window_size=max_attention_window_size, llmapi_model_dir=llmapi_model_dir,
        fast_logits=fast_logits)
    repo = write_repository(engine_dir, out, opts, force=force)
    meta = read_repo_meta(repo)
    emit({"repo": str(repo), **meta}, fmt, _text)
