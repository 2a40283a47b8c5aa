"""``BuildConfig``: every input of ``specserve build``, resolved and stored in
``engines/NAME/build_config.json`` so a build can be repeated (nanoGPT keeps ``model_args`` with
the checkpoint in the same spirit).

Defaults follow TensorRT-LLM 1.2.1 where the engine flow defines them (``trtllm-build``:
``max_seq_len`` = the model's ``max_position_embeddings``; Medusa ``max_draft_len`` = the number
of tree nodes; EAGLE converter defaults 63 draft tokens / 4 layers / 10 non-leaves per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from specserve.build.pins import DEFAULT_RELEASE, RELEASES
from specserve.config import JsonConfig
from specserve.errors import SpecserveError

SPEC_MODES = ("medusa", "draft", "ngram", "eagle", "eagle3", "mtp", "lookahead")
BACKENDS = ("trtllm", "torch")
#: TensorRT-LLM routes: ``engine`` = trtllm-build engines (the pinned C++ flow); ``pytorch`` = the
#: LLM API on the PyTorch backend (one YAML for trtllm-serve / trtllm-bench / Triton llmapi).
FLOWS = ("engine", "pytorch")
ENGINE_ONLY_MODES = ("medusa", "eagle")  # no PyTorch-backend path (Medusa; EAGLE-1/2 heads)
PYTORCH_ONLY_MODES = ("eagle3", "mtp")
#: Fields that only the PyTorch route reads; left out of ``to_dict`` on the engine flow so the
#: engine flow's build_config.json ``config`` stays as it was.
PYTORCH_FIELDS = ("eagle3", "eagle_choices", "dynamic_tree_top_k", "max_total_draft_tokens",
                  "ngram_size", "max_num_tokens", "kv_cache_fraction", "block_reuse",
                  "cuda_graph_batch_sizes", "max_concurrency", "spec_options", "trtllm_version")
#: PyTorch-route fields the torch backend's EAGLE-3 engine reads too (its head, a static tree).
TORCH_EAGLE3_FIELDS = ("eagle3", "eagle_choices")
DTYPES = ("float16", "bfloat16", "float32")
DEFAULT_CHAIN_DRAFT_LEN = 4  # draft model / n-gram tokens per step
EAGLE_MAX_DRAFT_LEN = 63  # examples/eagle/convert_checkpoint.py default (asserted <= 256)
EAGLE_NUM_LAYERS = 4
EAGLE_MAX_NON_LEAVES = 10
EAGLE3_DRAFT_LEN = 3  # PyTorch route: upstream's EAGLE-3 examples use max_draft_len 3


@dataclass(frozen=True)
class BuildConfig(JsonConfig):
    """Inputs of one build. ``None`` limits are resolved by :func:`resolve` from the target."""

    model: str
    out: str
    spec_mode: str  # medusa | draft | ngram | eagle | eagle3 | mtp | lookahead
    medusa: str | None = None
    draft: str | None = None
    eagle: str | None = None
    backend: str = "torch"  # trtllm | torch (auto is resolved before this is made)
    flow: str = "engine"  # engine | pytorch (trtllm only)
    dtype: str = "float16"
    quantize: str | None = None  # None | "fp8"
    kv_cache_dtype: str | None = None  # None | "fp8"
    tp_size: int = 1
    pp_size: int = 1
    max_batch_size: int = 8
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_draft_len: int | None = None
    medusa_choices: tuple[tuple[int, ...], ...] | None = None
    draft_len_schedule: str | None = None  # "1:4,8:2,16:0" (torch backend: load-aware budget)
    lookahead: str | None = None  # "W,N,G" (engine flow, trtllm: lookahead_decoding)
    draft_window: int | None = None  # torch backend, --draft: the draft attends its last N keys
    # torch backend: "adaptive" (None: the default) picks k per step; "fixed" keeps max_draft_len
    draft_len_policy: str | None = None
    # torch backend: grammar-forced tokens as drafts under structured output (None: on for a
    # speculative engine; the no-speculation baseline stays plain)
    forced_drafts: bool | None = None
    # --- the PyTorch route only (specserve.build.llmapi) ---
    eagle3: str | None = None  # EAGLE-3 head directory
    eagle_choices: tuple[tuple[int, ...], ...] | None = None  # static EAGLE-3 tree
    dynamic_tree_top_k: int | None = None  # EAGLE-3 dynamic tree (dynamic_tree_max_topK)
    max_total_draft_tokens: int | None = None  # dynamic tree size
    ngram_size: int | None = None  # NGram max_matching_ngram_size
    max_num_tokens: int | None = None
    kv_cache_fraction: float | None = None  # kv_cache_config.free_gpu_memory_fraction
    block_reuse: bool | None = None  # kv_cache_config.enable_block_reuse
    cuda_graph_batch_sizes: tuple[int, ...] | None = None
    max_concurrency: int | None = None
    spec_options: tuple[tuple[str, str], ...] = ()  # extra speculative_config KEY=VALUE
    trtllm_version: str = DEFAULT_RELEASE  # the release line the YAML is written for (pins.py)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def source_dir(self) -> str | None:
        """The speculation input directory (heads, draft or EAGLE), if any."""
        return {"medusa": self.medusa, "draft": self.draft, "eagle": self.eagle,
                "eagle3": self.eagle3}.get(self.spec_mode)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        if self.flow == "engine":
            for name in PYTORCH_FIELDS:
                if not (name in TORCH_EAGLE3_FIELDS and self.spec_mode == "eagle3"):
                    data.pop(name, None)  # (the torch EAGLE-3 engine keeps its head and tree)
            data.pop("flow", None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildConfig:
        data = dict(data)
        for key in ("medusa_choices", "eagle_choices"):
            if data.get(key) is not None:
                data[key] = tuple(tuple(p) for p in data[key])
        if data.get("cuda_graph_batch_sizes") is not None:
            data["cuda_graph_batch_sizes"] = tuple(data["cuda_graph_batch_sizes"])
        if data.get("spec_options"):
            data["spec_options"] = tuple(tuple(p) for p in data["spec_options"])
        return super().from_dict(data)

    def validate(self) -> None:
        _one_of("spec_mode", self.spec_mode, SPEC_MODES)
        _one_of("backend", self.backend, BACKENDS)
        _one_of("flow", self.flow, FLOWS)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("quantize", self.quantize, (None, "fp8"))
        _one_of("kv_cache_dtype", self.kv_cache_dtype, (None, "fp8"))
        if self.source_dir is None and self.spec_mode not in ("ngram", "mtp", "lookahead"):
            raise SpecserveError(f"--{self.spec_mode}: a directory is required")
        for name in ("tp_size", "pp_size", "max_batch_size"):
            if getattr(self, name) < 1:
                raise SpecserveError(f"--{name.removesuffix('_size').replace('_', '-')}: "
                                     f"must be >= 1, got {getattr(self, name)}")
        for name in ("max_input_len", "max_seq_len", "max_draft_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecserveError(f"--{name.replace('_', '-')}: must be >= 1, got {value}")
        if self.max_input_len and self.max_seq_len and self.max_input_len >= self.max_seq_len:
            raise SpecserveError(f"--max-input-len {self.max_input_len} must be smaller than "
                                 f"--max-seq-len {self.max_seq_len}")
        if self.medusa_choices is not None and self.spec_mode != "medusa":
            raise SpecserveError("--medusa-choices: only with --medusa")
        _one_of("trtllm_version", self.trtllm_version, tuple(RELEASES))
        self._validate_lookahead()
        self._validate_flow()
        if self.flow == "pytorch":
            return  # the route's own checks: specserve.build.builder.validate_for_route
        self._validate_schedule()
        self._validate_window()
        self._validate_backend()

    def _validate_window(self) -> None:
        if self.draft_window is None:
            return
        if self.spec_mode != "draft":
            raise SpecserveError("--draft-window: only with --draft (it windows the draft "
                                 "model's attention)")
        if self.backend != "torch":
            raise SpecserveError("--draft-window: the reference decoder's (--backend torch); "
                                 "TensorRT-LLM's draft engine attends its whole context")
        if self.draft_window < 1:
            raise SpecserveError(f"--draft-window: must be >= 1, got {self.draft_window}")

    def _validate_flow(self) -> None:
        if self.flow == "pytorch":
            if self.backend != "trtllm":
                raise SpecserveError("--flow pytorch: a TensorRT-LLM route; needs --backend "
                                     "trtllm (or auto)")
            if self.spec_mode == "medusa":
                raise SpecserveError("--medusa with --flow pytorch: TensorRT-LLM's PyTorch "
                                     "backend has no Medusa path (MedusaDecodingConfig."
                                     "supports_backend excludes pytorch); use --flow engine, or "
                                     "--eagle3 / --draft / --ngram / --mtp")
            if self.spec_mode == "eagle":
                raise SpecserveError("--eagle with --flow pytorch: EAGLE-1/2 heads are "
                                     "incompatible with the PyTorch backend (it serves EAGLE-3 "
                                     "only); use --eagle3 DIR, or --flow engine")
            return
        if self.spec_mode == "eagle3" and self.backend == "trtllm":
            raise SpecserveError("--eagle3 with --flow engine: TensorRT-LLM 1.2.1's engine flow "
                                 "has no EAGLE-3 path (trtllm-build converts EAGLE-1/2 only); "
                                 "use --flow pytorch, or --backend torch")
        if self.spec_mode in PYTORCH_ONLY_MODES and not (
                self.spec_mode == "eagle3" and self.backend != "trtllm"):
            raise SpecserveError(f"--{self.spec_mode}: only on TensorRT-LLM's PyTorch route; "
                                 "use --backend trtllm --flow pytorch")
        torch_e3 = TORCH_EAGLE3_FIELDS if self.spec_mode == "eagle3" else ("eagle3",)
        set_ = [n for n in PYTORCH_FIELDS if n not in torch_e3
                and getattr(self, n) not in (None, (), DEFAULT_RELEASE)]
        if set_:
            raise SpecserveError(f"--{set_[0].replace('_', '-')}: a --flow pytorch option "
                                 "(LLM API YAML); the engine flow does not read it")

    def _validate_lookahead(self) -> None:
        """``--lookahead W,N,G``: TensorRT-LLM's engine flow only; ``max_draft_len`` is
        upstream's formula of (W, N, G) (:mod:`specserve.spec.lookahead`)."""
        if self.spec_mode != "lookahead":
            if self.lookahead is not None:
                raise SpecserveError("--lookahead: a speculation mode of its own (give it "
                                     "without --medusa/--draft/--ngram/--eagle)")
            return
        if self.lookahead is None:
            raise SpecserveError("--lookahead: W,N,G is required (e.g. 7,7,7)")
        from specserve.spec.lookahead import Lookahead

        la = Lookahead.parse(self.lookahead)
        if self.max_draft_len is not None and self.max_draft_len != la.max_draft_len:
            raise SpecserveError(
                f"--max-draft-len {self.max_draft_len}: --lookahead {la.text()} needs "
                f"max_draft_len {la.max_draft_len} ((N-2) + (W-1+G)*(N-1), "
                "examples/lookahead/README.md: the server's W,N,G must give the engine's "
                "max_draft_len); leave it out")
        if self.flow == "pytorch":
            raise SpecserveError("--lookahead with --flow pytorch: not planned (specserve "
                                 "builds lookahead as trtllm-build's lookahead_decoding); use "
                                 "--flow engine")
        if self.backend != "trtllm":
            raise SpecserveError("--lookahead: needs --backend trtllm (the reference decoder "
                                 "has no lookahead proposer)")

    def _validate_schedule(self) -> None:
        if self.draft_len_policy not in (None, "adaptive", "fixed"):
            raise SpecserveError(f"--draft-len-policy {self.draft_len_policy!r}: adaptive or "
                                 "fixed")
        if self.forced_drafts is not None and self.backend != "torch":
            raise SpecserveError("--forced-drafts / --no-forced-drafts: the reference "
                                 "decoder's (--backend torch)")
        if self.draft_len_policy is not None and self.backend != "torch":
            raise SpecserveError("--draft-len-policy: the reference decoder's (--backend "
                                 "torch); TensorRT-LLM's own is --draft-len-schedule")
        if self.draft_len_schedule is None:
            return
        from specserve.spec.schedule import DraftSchedule

        sched = DraftSchedule.parse(self.draft_len_schedule)
        if self.backend != "torch":
            raise SpecserveError("--draft-len-schedule: the engine flow of the pinned "
                                 "TensorRT-LLM has none (it is a PyTorch-route option); use "
                                 "--backend torch")
        top = max(v for _, v in sched.points)
        if self.max_draft_len is not None and top > self.max_draft_len:
            unit = "tree nodes" if self.spec_mode == "medusa" else "draft tokens"
            raise SpecserveError(f"--draft-len-schedule {sched.text()}: {top} {unit} is more "
                                 f"than --max-draft-len {self.max_draft_len}")

    def _validate_backend(self) -> None:
        if self.kv_cache_dtype == "fp8" and self.quantize != "fp8":
            raise SpecserveError("--kv-cache-dtype fp8: needs --quantize fp8 (the pinned "
                                 "TensorRT-LLM quantizes the KV cache through quantize.py)")
        if self.backend == "torch":
            if self.spec_mode == "eagle":
                raise SpecserveError("--eagle: needs --backend trtllm (the reference decoder "
                                     "has no EAGLE proposer)")
            if self.kv_cache_dtype == "fp8":
                raise SpecserveError("--kv-cache-dtype fp8: not emulated by the torch backend")
            if self.world_size > 1:
                raise SpecserveError("--tp/--pp: the torch backend runs on one device (use 1)")
            return
        if self.spec_mode == "eagle":
            if self.pp_size != 1:
                raise SpecserveError("--pp: EAGLE conversion needs pp=1 (pinned TensorRT-LLM)")
            if self.quantize == "fp8":
                raise SpecserveError("--quantize fp8 with --eagle: not supported by this plan "
                                     "(examples/eagle/quantize.py was not verified at the pin)")
            if self.max_batch_size > 512:
                raise SpecserveError("--max-batch-size: EAGLE engines allow at most 512")
            if (self.max_draft_len or 0) > 256:
                raise SpecserveError("--max-draft-len: EAGLE allows at most 256")
        if self.dtype == "float32" and self.quantize == "fp8":
            raise SpecserveError("--dtype float32 with --quantize fp8: use float16 or bfloat16")


def _one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise SpecserveError(f"--{name.replace('_', '-')}: {value!r} is not one of "
                             f"{[a for a in allowed if a is not None]}")


def default_medusa_choices(num_heads: int) -> tuple[tuple[int, ...], ...]:
    """Medusa's ``mc_sim_7b_63`` tree cut to ``num_heads`` levels (prefix-closed by depth)."""
    from specserve.spec.tree import MC_SIM_7B_63, MedusaTree

    return MedusaTree.from_choices([p for p in MC_SIM_7B_63 if len(p) <= num_heads]).choices


def _schedule_top(cfg: BuildConfig) -> int | None:
    """The PyTorch route's ``draft_len_schedule[1]`` (1.2.1: it must equal max_draft_len)."""
    if cfg.flow != "pytorch" or cfg.draft_len_schedule is None:
        return None
    from specserve.spec.schedule import DraftSchedule

    return DraftSchedule.parse(cfg.draft_len_schedule).at(1) or None


def resolve(cfg: BuildConfig, target_cfg: dict[str, Any],
            num_medusa_heads: int | None = None) -> BuildConfig:
    """Fill the ``None`` limits from the target config and the speculation mode; check that
    an explicit ``max_draft_len`` fits the Medusa tree."""
    from specserve.spec.tree import MedusaTree

    max_seq = cfg.max_seq_len or int(target_cfg.get("max_position_embeddings", 2048))
    max_in = cfg.max_input_len or min(1024, max_seq // 2)
    choices, draft_len = cfg.medusa_choices, cfg.max_draft_len
    if cfg.spec_mode == "medusa":
        assert num_medusa_heads is not None
        tree = (MedusaTree.from_choices(choices, num_medusa_heads) if choices is not None
                else MedusaTree.from_choices(default_medusa_choices(num_medusa_heads)))
        choices = tree.choices
        if draft_len is not None and draft_len < tree.num_nodes:
            raise SpecserveError(f"--max-draft-len {draft_len}: the Medusa tree has "
                                 f"{tree.num_nodes} nodes (max_draft_len must be >= that)")
        draft_len = draft_len or tree.num_nodes
    elif cfg.spec_mode == "eagle":
        draft_len = draft_len or EAGLE_MAX_DRAFT_LEN
    elif cfg.spec_mode == "lookahead" and cfg.lookahead is not None:
        from specserve.spec.lookahead import Lookahead

        draft_len = draft_len or Lookahead.parse(cfg.lookahead).max_draft_len
    elif cfg.spec_mode == "eagle3" and cfg.eagle_choices is not None and cfg.flow == "engine":
        depth = MedusaTree.from_choices(cfg.eagle_choices).depth  # the torch EAGLE-3 tree
        if draft_len is not None and draft_len != depth:
            raise SpecserveError(f"--max-draft-len {draft_len}: the --eagle-choices tree is "
                                 f"{depth} deep (the chain length at T > 0; give {depth} or "
                                 "leave it out)")
        draft_len = depth
    else:
        draft_len = draft_len or _schedule_top(cfg) or (
            int(target_cfg.get("num_nextn_predict_layers") or 1) if cfg.spec_mode == "mtp"
            else EAGLE3_DRAFT_LEN if cfg.spec_mode == "eagle3" else DEFAULT_CHAIN_DRAFT_LEN)
    out = replace(cfg, max_seq_len=max_seq, max_input_len=max_in, max_draft_len=draft_len,
                  medusa_choices=choices)
    out.validate()
    return out
