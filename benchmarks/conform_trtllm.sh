#!/usr/bin/env bash
# make conform-trtllm: `specserve conform` against TensorRT-LLM's `trtllm-serve` (PyTorch
# backend) on a GPU machine, inside the pinned container (specserve/build/pins.py:
# TRTLLM_IMAGE = nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3, TensorRT-LLM 1.2.1),
# with specserve installed there (`pip install -e .`, which never replaces its torch).
#
# One plain trtllm-serve is the baseline; one speculative trtllm-serve per method, its
# speculative_config written by `specserve build --flow pytorch` (extra_llm_api_options.yaml,
# keys checked in tests/build/data/llmapi_fields_1.2.1.json). trtllm-serve's flags are
# upstream's click options: MODEL, --host, --port, --backend pytorch, --max_batch_size,
# --max_seq_len, --kv_cache_free_gpu_memory_fraction, --extra_llm_api_options (a YAML that
# overrides the CLI values) -- NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py
# @4c05a74891e4df8066f08ed4ce14b0972abe4e25. Readiness: GET /health answers 200.
#
#   make conform-trtllm [MODEL=checkpoints/demo/target] [METHODS="draft ngram eagle3"]
set -euo pipefail
MODEL=${MODEL:-checkpoints/demo/target}
DEMO=${DEMO:-checkpoints/demo}
METHODS=${METHODS:-"draft ngram eagle3"}
WORK=${WORK:-reports/conform}
SPECSERVE=${SPECSERVE:-specserve}
BASE_PORT=8300
SPEC_PORT=8301
command -v trtllm-serve >/dev/null || {
  echo "error: trtllm-serve not found: run this inside the TensorRT-LLM container on a GPU" \
       "machine (specserve/build/pins.py TRTLLM_IMAGE)" >&2; exit 2; }
mkdir -p "$WORK"

wait_ready() {  # port, pid, log
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "error: trtllm-serve on $1 exited; see $3" >&2; return 1; }
    sleep 1
  done
  echo "error: trtllm-serve on $1 not ready after 600 s; see $3" >&2; return 1
}

# the baseline: no speculative_config; a third of the free GPU memory for its KV cache
trtllm-serve "$MODEL" --host 127.0.0.1 --port $BASE_PORT --backend pytorch \
  --max_batch_size 16 --max_seq_len 1024 --kv_cache_free_gpu_memory_fraction 0.3 \
  > "$WORK/trtllm-baseline.log" 2>&1 &
BASE_PID=$!
trap 'kill $BASE_PID ${SPEC_PID:-} 2>/dev/null || true' EXIT
wait_ready $BASE_PORT $BASE_PID "$WORK/trtllm-baseline.log"

for method in $METHODS; do
  case $method in
    draft) extra=(--draft "$DEMO/draft" --max-draft-len 4) ;;
    ngram) extra=(--ngram --max-draft-len 4) ;;
    eagle3) extra=(--eagle3 "$DEMO/eagle3" --max-draft-len 4) ;;
    *) echo "error: METHODS: unknown method $method (draft, ngram, eagle3)" >&2; exit 2 ;;
  esac
  $SPECSERVE build --model "$MODEL" "${extra[@]}" --backend trtllm --flow pytorch \
    --max-batch-size 16 --out "$WORK/trtllm-$method" --force
  trtllm-serve "$MODEL" --host 127.0.0.1 --port $SPEC_PORT --backend pytorch \
    --max_batch_size 16 --max_seq_len 1024 \
    --extra_llm_api_options "$WORK/trtllm-$method/extra_llm_api_options.yaml" \
    > "$WORK/trtllm-$method.log" 2>&1 &
  SPEC_PID=$!
  wait_ready $SPEC_PORT $SPEC_PID "$WORK/trtllm-$method.log"
  $SPECSERVE conform --url 127.0.0.1:$SPEC_PORT --baseline-url 127.0.0.1:$BASE_PORT \
    --protocol openai --model "$MODEL" --method "$method" --engine trtllm-serve \
    --tokenizer "$DEMO/tokenizer" --context-limit 1024 --out "$WORK/trtllm-$method" || true
  kill $SPEC_PID; wait $SPEC_PID 2>/dev/null || true
done
