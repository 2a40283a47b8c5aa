"""KV-cache budget of a pairing on one GPU (pure arithmetic): the KV token capacity with and
without the draft, plus an estimate of the verify workspace, against the batch x context the
deployment must hold (field reports: sgl-project/sglang #38341 passes start-up and OOMs mid-traffic
with "no upfront capacity check"; NVIDIA/TensorRT-LLM #9279: the draft's KV config copies the
target's).

- KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes of the KV dtype
  (:meth:`specserve.spec.predictor.ModelShape.kv_elements_per_token`).
- Weights: the bytes stored in the safetensors files of each side.
- Verify workspace (an estimate, not a profile): every verified token of the batch holds a
  float32 logits row (TensorRT-LLM's generation-logits buffer is ``[batch, max_draft_len + 1,
  vocab]``) and one layer's activations (4 x hidden + 2 x intermediate elements); a draft model
  keeps its own float32 logits for the ``K`` drafted tokens (rejection sampling needs q).
- Usable memory = GPU memory x ``memory_fraction`` (vLLM's ``gpu_memory_utilization``, default
  0.9). Tensor parallelism divides weights, KV and workspace by ``tp``.

GPU memory sizes are the ``memory.total`` that ``nvidia-smi`` reports for each board (H100 SXM
80GB: 81559 MiB; H200: 143771 MiB; A100 80GB SXM: 81920 MiB), keyed like
:data:`specserve.spec.predictor.GPUS`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specserve.doctor.findings import Finding, error, info

MIB = 1 << 20
GIB = 1 << 30
GPU_MEMORY_BYTES: dict[str, int] = {"h100-sxm": 81559 * MIB, "h200": 143771 * MIB,
                                    "a100-80g": 81920 * MIB}
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "half": 2, "fp8": 1, "float8_e4m3fn": 1, "int8": 1}
LOGIT_BYTES = 4


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (config ``torch_dtype`` or a KV-cache dtype)."""
    return DTYPE_BYTES.get(name.lower(), 2)


@dataclass(frozen=True)
class Footprint:
    """What one model costs: weights and KV per token (bytes), and its activation widths."""

    weight_bytes: int
    kv_bytes_per_token: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int


def footprint(config: dict[str, Any], weight_bytes: int, kv_bytes: int) -> Footprint:
    """A model's :class:`Footprint` from its ``config.json`` (Medusa heads: no KV)."""
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    layers = int(config.get("num_hidden_layers") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (hidden // heads if hidden else 0))
    return Footprint(weight_bytes, 2 * layers * kv_heads * head_dim * kv_bytes, hidden,
                     int(config.get("intermediate_size") or 0),
                     int(config.get("vocab_size") or 0))


@dataclass(frozen=True)
class MemoryPlan:
    """The budget of one GPU for ``batch`` sequences of ``context`` tokens."""

    gpu: str
    memory_bytes: int
    memory_fraction: float
    batch: int
    context: int
    tp: int
    verify_tokens: int  # tokens one sequence verifies per step (K + 1, or tree nodes + 1)
    draft_len: int  # K: tokens a draft model proposes (its logits kept), 0 for heads
    act_bytes: int  # bytes per activation element (the target's dtype)
    target: Footprint
    draft: Footprint

    def _per_token(self, fp: Footprint, act_bytes: int) -> int:
        return fp.vocab_size * LOGIT_BYTES + (4 * fp.hidden_size + 2 * fp.intermediate_size) \
            * act_bytes

    def workspace_bytes(self, spec: bool) -> int:
        n = self.verify_tokens if spec else 1
        ws = self.batch * n * self._per_token(self.target, self.act_bytes)
        if spec and self.draft_len:
            ws += self.batch * self.draft_len * self.draft.vocab_size * LOGIT_BYTES
        return ws // self.tp

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.memory_fraction)

    def free_for_kv(self, spec: bool) -> int:
        weights = self.target.weight_bytes + (self.draft.weight_bytes if spec else 0)
        return self.usable_bytes - weights // self.tp - self.workspace_bytes(spec)

    def kv_per_token(self, spec: bool) -> int:
        kv = self.target.kv_bytes_per_token + (self.draft.kv_bytes_per_token if spec else 0)
        return max(1, kv // self.tp)

    def capacity_tokens(self, spec: bool) -> int:
        return max(0, self.free_for_kv(spec) // self.kv_per_token(spec))

    @property
    def needed_tokens(self) -> int:
        return self.batch * self.context

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for spec, name in ((False, "without_draft"), (True, "with_draft")):
            out[name] = {"workspace_bytes": self.workspace_bytes(spec),
                         "free_for_kv_bytes": self.free_for_kv(spec),
                         "kv_bytes_per_token": self.kv_per_token(spec),
                         "kv_capacity_tokens": self.capacity_tokens(spec)}
        out["needed_tokens"] = self.needed_tokens
        out["usable_bytes"] = self.usable_bytes
        return out


def _gib(n: int) -> str:
    return f"{n / GIB:.4g} GiB"


def check_memory(plan: MemoryPlan) -> list[Finding]:
    """One info line with both capacities; an error when batch x context does not fit with the
    draft (saying whether it would without)."""
    with_d, without = plan.capacity_tokens(True), plan.capacity_tokens(False)
    share = 1 - with_d / without if without else 0.0
    need = plan.needed_tokens
    out = [info("kv-budget", f"{plan.gpu} ({_gib(plan.memory_bytes)} x {plan.memory_fraction:g}"
                f", tp {plan.tp}): KV for {with_d} tokens with the draft, {without} without "
                f"(speculation takes {share:.1%}; verify workspace "
                f"{_gib(plan.workspace_bytes(True))}); batch {plan.batch} x context "
                f"{plan.context} needs {need}")]
    if with_d < need:
        alone = ("fits without the draft" if without >= need
                 else "does not fit without the draft either")
        out.append(error("kv-budget-exceeded", f"{plan.gpu}: batch {plan.batch} x context "
                         f"{plan.context} = {need} KV tokens, the budget holds {with_d} with the "
                         f"draft ({alone}, {without}): lower --batch or the context, or use a "
                         "bigger GPU"))
    return out
