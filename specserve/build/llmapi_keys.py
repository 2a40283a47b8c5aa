"""The LLM API's keys per TensorRT-LLM release line: which ``speculative_config`` fields a
release has, what they are called, their defaults, and what ``draft_len_schedule`` keys mean
(facts only: no I/O; the release lines themselves are :mod:`specserve.build.pins`).

Keys and semantics are those of the release line ``--trtllm-version`` names (default 1.2.1; 1.3 =
the 1.3.0 rc line Dynamo's images ship, field set ``tests/build/data/llmapi_fields_1.3.json``:
upper-bound ``draft_len_schedule`` keys, the renamed acceptance pair, no ``eagle3_one_model``,
``speculative_model``). For 1.2.1: its ``tensorrt_llm/llmapi/llm_args.py`` (``TorchLlmArgs``,
``KvCacheConfig``, ``CudaGraphConfig`` and the decoding configs); the field set the goldens are
checked against is ``tests/build/data/llmapi_fields_1.2.1.json`` (its ``source`` names the
copy read). Choices
made here:

- ``speculative_config.decoding_type``: ``Eagle`` for EAGLE-3 on 1.2.1 (``Eagle3`` on 1.3),
  ``Draft_Target`` (the pydantic ``Literal``;
  the docs' ``DraftTarget`` spelling is not what the discriminated union parses), ``NGram``,
  ``MTP``. The draft is named by ``speculative_model_dir`` (1.2's alias of ``speculative_model``).
- Load-aware speculation in 1.2's semantics: ``draft_len_schedule`` keys are batch-size *lower*
  bounds, key 1 is required and equals ``max_draft_len``; ``max_concurrency`` turns speculation
  off above a batch size; the two are mutually exclusive (later releases flip the key meaning,
  #10860/#12262: :func:`upper_bound_schedule`). In 1.2 both act on two-model (Drafter) paths
  only, so EAGLE-3 with either gets ``eagle3_one_model: false`` and MTP refuses them.
- Options that do not exist in 1.2.1 (``use_rejection_sampling``, the renamed acceptance pair
  ``acceptance_rate_*`` ...) are refused with the PR that added them (:data:`LATER_KEYS`), and
  1.2.1 keys the 1.3 line dropped with what to write instead (:data:`GONE_IN_13`).
"""

from __future__ import annotations

from specserve.build.pins import DEFAULT_RELEASE, RELEASES, Release
from specserve.errors import SpecserveError

DECODING_TYPES = {"eagle3": "Eagle3", "draft": "Draft_Target", "ngram": "NGram", "mtp": "MTP"}
DEFAULT_KV_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default
DEFAULT_MAX_NUM_TOKENS = 8192  # BaseLlmArgs.max_num_tokens default
DEFAULT_NGRAM_SIZE = 2  # NGramDecodingConfig.max_matching_ngram_size default

#: ``--spec-option KEY=VALUE`` keys per method and release: fields the plan does not set itself.
_BASE_OPTIONS = ("load_format", "allow_advanced_sampling")
_METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "eagle3": ("max_non_leaves_per_layer", "eagle3_layers_to_capture", "eagle3_model_arch"),
    "draft": (),
    "ngram": ("is_keep_all", "is_use_oldest", "is_public_pool"),
    "mtp": ("use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
            "use_mtp_vanilla", "mtp_eagle_one_model", "begin_thinking_phase_token",
            "end_thinking_phase_token"),
}
#: Eagle3 fields 1.2.1 has and the 1.3.0rc27 Eagle3DecodingConfig page does not.
EAGLE3_12_ONLY = ("greedy_sampling", "posterior_threshold", "eagle3_one_model")
#: Keys users meet in newer docs that TensorRT-LLM 1.2.1 does not have.
LATER_KEYS = {
    "use_rejection_sampling": "#14745/#15775, June 2026",
    "acceptance_rate_window_size": "#12905, April 2026 (1.2.1 has acceptance_window)",
    "acceptance_rate_threshold": "#12905, April 2026 (1.2.1 has acceptance_length_threshold)",
    "advanced_sampling_mode": "the 1.3/1.4 API pages",
    "enable_penalty": "the 1.3/1.4 API pages",
    "spec_dec_variant": "the 1.3/1.4 API pages",
    "min_runtime_draft_len": "#16888, unmerged",
}
#: 1.2.1 keys the 1.3 line renamed or dropped, and what to write instead.
GONE_IN_13 = {
    "acceptance_window": "renamed acceptance_rate_window_size (#12905)",
    "acceptance_length_threshold": "renamed acceptance_rate_threshold, range [0, 1] (#12905)",
    "greedy_sampling": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
    "posterior_threshold": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
    "eagle3_one_model": "not a field of 1.3.0rc27's Eagle3DecodingConfig",
}


def decoding_type(mode: str, rel: Release) -> str:
    """The ``decoding_type`` written: ``Eagle`` for EAGLE-3 on 1.2.1 (both config layouts parse
    it, see :mod:`specserve.build.pins`), the class Literal otherwise."""
    return rel.eagle3_type if mode == "eagle3" else DECODING_TYPES[mode]


def spec_options_for(mode: str, rel: Release) -> tuple[str, ...]:
    """The ``--spec-option`` keys of one method on one release line."""
    extra = EAGLE3_12_ONLY if mode == "eagle3" and rel.eagle3_one_model else ()
    later = ("use_rejection_sampling", "advanced_sampling_mode", "enable_penalty") \
        if rel.name != "1.2.1" else ()
    return _BASE_OPTIONS + rel.acceptance_keys + later + _METHOD_OPTIONS.get(mode, ()) + extra


#: 1.2.1's keys per method (kept for readers of the old name).
SPEC_OPTIONS: dict[str, tuple[str, ...]] = {
    m: spec_options_for(m, RELEASES[DEFAULT_RELEASE]) for m in _METHOD_OPTIONS}


def upper_bound_schedule(points: tuple[tuple[int, int], ...] | list[tuple[int, int]],
                         max_batch_size: int) -> dict[int, int]:
    """specserve's lower-bound schedule (``1:4,4:2,8:0``: K=4 for batch 1-3, 2 for 4-7, 0 from
    8) in the 1.3 form, whose keys are upper bounds with 0 above the largest (#10860/#12262):
    ``{3: 4, 7: 2}``. The same draft length at every batch size up to ``max_batch_size``."""
    pts = sorted(points)
    out: dict[int, int] = {}
    for i, (lo, k) in enumerate(pts):
        hi = pts[i + 1][0] - 1 if i + 1 < len(pts) else max_batch_size
        hi = min(hi, max_batch_size)
        if hi >= lo and k > 0:
            out[hi] = k
    if not out:
        raise SpecserveError("--draft-len-schedule: no batch size up to --max-batch-size "
                             f"{max_batch_size} drafts (use --max-concurrency or no speculation)")
    if any(k == 0 for lo, k in pts if lo <= max(out)):
        raise SpecserveError("--draft-len-schedule: 1.3's upper-bound keys cannot say 0 between "
                             "two drafting ranges (give the zero at the end)")
    return out
