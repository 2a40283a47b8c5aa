"""The TensorRT-LLM releases specserve writes for, and the container images that ship them (a
leaf module: it imports nothing of the package, so ``build.config``, ``build.llmapi``,
``build.trtllm`` and ``deploy`` can all read it without an import cycle).

- **1.2.1** (PyPI 2026-04-20), in ``nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3``: the
  engine flow's pin and the PyTorch route's default.
  LLM-API field set: ``tests/build/data/llmapi_fields_1.2.1.json``. ``draft_len_schedule`` keys
  are batch-size lower bounds (key 1 = ``max_draft_len``); acceptance pair
  ``acceptance_window``/``acceptance_length_threshold``; ``Eagle3DecodingConfig`` has
  ``eagle3_one_model``; the dynamic-tree fields exist but ``validate_eagle_config`` overwrites
  ``max_total_draft_tokens`` and the PyTorch dynamic-tree runtime lands after the 1.2 branch
  (NVIDIA/TensorRT-LLM #12062, #13081), so they are refused. EAGLE-3 is written
  ``decoding_type: Eagle``: the Dec-2025 layout of ``llm_args.py`` converts it to Eagle3 (with a
  warning) and the older ``from_dict`` layout accepts only ``Eagle``, so it parses either way.
- **1.3** (the 1.3.0 release-candidate line that NVIDIA Dynamo's ``tensorrtllm-runtime`` images
  ship: ai-dynamo/dynamo ``container/context.yaml`` @001eacbe pins ``1.3.0rc16``; Dynamo
  0.9.0 moved to 1.3.0rc1, ai-dynamo/dynamo #5811). Field set: the TensorRT-LLM API page
  ``1.3.0rc27/llm-api/reference/Eagle3DecodingConfig.html`` (``tests/build/data/
  llmapi_fields_1.3.json``): schedule keys are upper bounds (#10860, #12262), the acceptance
  pair is ``acceptance_rate_window_size``/``acceptance_rate_threshold`` (#12905), and
  ``eagle3_one_model``, ``greedy_sampling`` and ``posterior_threshold`` are gone.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The engine flow's pin (trtllm-build, the C++ Triton backend).
TRTLLM_VERSION = "1.2.1"
TRTLLM_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
DYNAMO_RUNTIME = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime"


@dataclass(frozen=True)
class Release:
    """One TensorRT-LLM release line the PyTorch-route YAML can target."""

    name: str                      # --trtllm-version value
    versions: str                  # the __version__ of this line (a prefix where != name)
    image: str                     # where trtllm-serve runs it
    schedule_keys: str             # "lower" (1.2) | "upper" (1.3: #10860/#12262)
    acceptance_keys: tuple[str, str]
    eagle3_one_model: bool         # Eagle3DecodingConfig has the field
    dynamic_tree: bool             # use_dynamic_tree is implemented (not overwritten)
    model_key: str                 # how the YAML names the draft / head directory
    eagle3_type: str               # decoding_type written for EAGLE-3

    def ships(self, version: str) -> bool:
        """True when an installed TensorRT-LLM ``version`` is this line."""
        v = version.removeprefix("v")
        return v == self.versions or (self.versions != self.name and v.startswith(self.versions))


RELEASES = {
    "1.2.1": Release("1.2.1", "1.2.1", TRTLLM_IMAGE, "lower",
                     ("acceptance_window", "acceptance_length_threshold"), True, False,
                     "speculative_model_dir", "Eagle"),
    "1.3": Release("1.3", "1.3.0rc", f"{DYNAMO_RUNTIME}:1.3.1", "upper",
                   ("acceptance_rate_window_size", "acceptance_rate_threshold"), False, True,
                   "speculative_model", "Eagle3"),
}
DEFAULT_RELEASE = "1.2.1"

#: Image -> the TensorRT-LLM version it ships. Dynamo tags: ai-dynamo/dynamo
#: ``docs/pages/reference/release-artifacts.md`` @196b75f2 (0.6.0-0.8.1.post1) and the 1.3
#: images (they ship 1.3.0 release candidates).
IMAGE_RELEASES = {
    TRTLLM_IMAGE: "1.2.1",
    f"{DYNAMO_RUNTIME}:1.3.1": "1.3.0rc16",
    f"{DYNAMO_RUNTIME}:0.8.1.post1": "1.2.0rc6.post2",
    f"{DYNAMO_RUNTIME}:0.8.1": "1.2.0rc6.post1",
    f"{DYNAMO_RUNTIME}:0.8.0": "1.2.0rc6.post1",
    f"{DYNAMO_RUNTIME}:0.7.1": "1.2.0rc3",
    f"{DYNAMO_RUNTIME}:0.7.0": "1.2.0rc2",
    f"{DYNAMO_RUNTIME}:0.6.1": "1.1.0rc5",
}


def release(name: str) -> Release:
    """The named release line (KeyError-free: unknown names are the caller's one-line error)."""
    return RELEASES[name]
