"""Speedup model for speculative decoding: decode roofline and expected speedup (pure).

The model:

- Decode roofline (Williams et al. 2009, "Roofline"): one target forward that scores ``n`` tokens
  for each of ``B`` sequences takes ``T(n) = max(bytes / bandwidth, flops / peak)``, where
  ``bytes`` = weight bytes + KV-cache bytes read and ``flops`` ~ ``2 * params * B * n`` plus the
  attention products. Per GPU under tensor parallelism (weights, KV and FLOPs split ``tp`` ways;
  all-reduce time is not modelled). A 70e9-parameter fp16 model on an H100 SXM (3.35 TB/s) reads
  its 140 GB in 41.8 ms per step.
- Expected tokens per step for a chain of ``K`` drafts with i.i.d. acceptance ``alpha``
  (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1):
  ``E = (1 - alpha^(K+1)) / (1 - alpha)``; from per-position rates ``a_k`` (probability that draft
  position ``k`` is accepted, counted over all steps, i.e. vLLM's accepted_per_pos / num_drafts):
  ``E = 1 + sum_{k<K} a_k``.
- Speedup ``S = tau * T(1) / (T_propose(K) + T_verify(n))`` with ``n = K + 1`` for a chain and
  the node count + 1 (root) for a Medusa tree. ``T_propose`` is ``K * T_draft(1)`` for a draft
  model (K sequential draft steps), one pass of the heads for Medusa (Cai et al. 2024, "Medusa"),
  and 0 for n-gram lookup.

Everything here is arithmetic on frozen dataclasses and on already-parsed JSON (a bench
``summary.json``'s acceptance block, :func:`spec_acceptance`); :mod:`specserve.predict` reads the
files and, with ``measure``, replaces the roofline ``T(n)`` by times measured on this machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specserve.errors import SpecserveError


@dataclass(frozen=True)
class GpuSpec:
    """Peak figures of one GPU: HBM bandwidth (bytes/s) and dense tensor FLOP/s."""

    name: str
    bandwidth_bytes_per_s: float
    flops_16bit: float  # dense FP16/BF16 FLOP/s
    flops_fp8: float | None  # dense FP8 FLOP/s; None = no FP8 tensor cores
    source: str


GPUS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec(
        "h100-sxm", 3.35e12, 989e12, 1979e12,
        "NVIDIA H100 SXM spec sheet (nvidia.com/en-us/data-center/h100), dense figures",
    ),
    "h200": GpuSpec(
        "h200", 4.8e12, 989e12, 1979e12,
        "NVIDIA H200 spec sheet (nvidia.com/en-us/data-center/h200), dense figures",
    ),
    "a100-80g": GpuSpec(
        "a100-80g", 2.039e12, 312e12, None,
        "NVIDIA A100 80GB SXM datasheet (nvidia.com/en-us/data-center/a100), dense BF16",
    ),
}
# the short names every ``--gpu`` option also accepts (``specserve doctor``, ``specserve predict``)
GPU_ALIASES: dict[str, str] = {"h100": "h100-sxm", "a100": "a100-80g"}


def gpu_name(name: str) -> str:
    """The :data:`GPUS` key of a ``--gpu`` value (``h100`` -> ``h100-sxm``); unknown names pass."""
    return GPU_ALIASES.get(name, name)


# bytes per weight / per KV element
DTYPE_BYTES: dict[str, float] = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class Hardware:
    """What the roofline needs: bandwidth, peak FLOP/s for the compute dtype, TP size."""

    bandwidth_bytes_per_s: float
    peak_flops: float
    tp_size: int = 1
    name: str = "custom"


def hardware_for(gpu: GpuSpec, dtype: str, tp_size: int = 1) -> Hardware:
    """Pick the peak FLOP/s matching ``dtype`` (FP8 GEMMs for fp8 weights)."""
    if dtype not in DTYPE_BYTES:
        raise SpecserveError(f"dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}")
    if dtype == "fp8":
        if gpu.flops_fp8 is None:
            raise SpecserveError(f"gpu {gpu.name}: no FP8 tensor cores; use fp16 or bf16")
        return Hardware(gpu.bandwidth_bytes_per_s, gpu.flops_fp8, tp_size, gpu.name)
    return Hardware(gpu.bandwidth_bytes_per_s, gpu.flops_16bit, tp_size, gpu.name)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's size. Only ``params`` is required; the rest enables KV and attention terms."""

    params: float
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None

    def kv_elements_per_token(self) -> int | None:
        """K and V elements stored per token: ``2 * layers * kv_heads * head_dim``."""
        if self.num_layers is None or self.num_kv_heads is None or self.head_dim is None:
            return None
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def attention_flops_per_token(self, kv_len: int) -> float:
        """QK^T and PV products of one new token against ``kv_len`` cached tokens."""
        if self.num_layers is None or self.num_heads is None or self.head_dim is None:
            return 0.0
        return 4.0 * self.num_layers * self.num_heads * self.head_dim * kv_len


# Decoder families whose MLP is gated (gate, up, down: 3 * hidden * intermediate weights).
_GATED_MLP = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "internlm2", "yi"}


def _req_int(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecserveError(f"{where}: missing or invalid {key!r} (pass --params instead)")
    return value


def _opt_int(cfg: Mapping[str, Any], key: str, default: int, where: str) -> int:
    """``cfg[key]`` when set (a positive int), else ``default``."""
    if not cfg.get(key):
        return default
    return _req_int(cfg, key, where)


def shape_from_hf_config(cfg: Mapping[str, Any], where: str = "config.json") -> ModelShape:
    """Count the parameters of a Llama-family decoder from its HF ``config.json`` shapes.

    Embedding ``V*H``; per layer q/o ``2*H*(heads*head_dim)``, k/v ``2*H*(kv_heads*head_dim)``,
    gated MLP ``3*H*I``, two RMSNorm weights ``2*H`` (+ biases when configured); final norm
    ``H``; LM head ``V*H`` unless ``tie_word_embeddings``.
    """
    if not isinstance(cfg, Mapping):
        raise SpecserveError(f"{where}: expected a JSON object (an HF config.json)")
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    model_type = str(cfg.get("model_type", "llama"))
    if model_type not in _GATED_MLP:
        raise SpecserveError(f"{where}: model_type {model_type!r} not modelled (pass --params)")
    if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise SpecserveError(f"{where}: mixture-of-experts is not modelled (pass --params)")
    h = _req_int(cfg, "hidden_size", where)
    layers = _req_int(cfg, "num_hidden_layers", where)
    heads = _req_int(cfg, "num_attention_heads", where)
    inter = _req_int(cfg, "intermediate_size", where)
    vocab = _req_int(cfg, "vocab_size", where)
    kv_heads = _opt_int(cfg, "num_key_value_heads", heads, where)
    head_dim = _opt_int(cfg, "head_dim", h // heads, where)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn = 2 * h * q_out + 2 * h * kv_out
    if cfg.get("attention_bias") or model_type == "qwen2":
        attn += q_out + 2 * kv_out + (h if cfg.get("attention_bias") else 0)
    if model_type == "qwen3":
        attn += 2 * head_dim  # q_norm, k_norm
    mlp = 3 * h * inter + ((2 * inter + h) if cfg.get("mlp_bias") else 0)
    per_layer = attn + mlp + 2 * h
    tied = bool(cfg.get("tie_word_embeddings", False))
    total = vocab * h * (1 if tied else 2) + layers * per_layer + h
    return ModelShape(float(total), layers, heads, kv_heads, head_dim, h, vocab)


def medusa_head_params(num_heads: int, hidden_size: int, vocab_size: int,
                       num_layers: int = 1) -> float:
    """Medusa-1 heads (FasterDecoding layout): per head ``num_layers`` ResBlocks (H*H + H) and
    an own LM head (V*H)."""
    return float(num_heads * (num_layers * (hidden_size * hidden_size + hidden_size)
                              + vocab_size * hidden_size))


@dataclass(frozen=True)
class StepCost:
    """One forward of the target scoring ``n_tokens`` per sequence for ``batch`` sequences."""

    n_tokens: int
    batch: int
    bytes_read: float  # per GPU
    flops: float  # per GPU
    memory_s: float
    compute_s: float

    @property
    def time_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class Workload:
    """Model + precision + batch shape of the decode steps being modelled."""

    shape: ModelShape
    weight_bytes_per_param: float
    kv_bytes_per_element: float = 2.0
    batch: int = 1
    kv_len: int = 0  # cached tokens per sequence at the step being modelled

    @property
    def weight_bytes(self) -> float:
        return self.shape.params * self.weight_bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float | None:
        elems = self.shape.kv_elements_per_token()
        return None if elems is None else elems * self.kv_bytes_per_element


def step_cost(work: Workload, hw: Hardware, n_tokens: int) -> StepCost:
    """Roofline time of one target forward over ``n_tokens`` new tokens per sequence."""
    kv_tok = work.kv_bytes_per_token or 0.0
    bytes_read = (work.weight_bytes + work.batch * work.kv_len * kv_tok) / hw.tp_size
    per_token = 2.0 * work.shape.params + work.shape.attention_flops_per_token(work.kv_len)
    flops = per_token * work.batch * n_tokens / hw.tp_size
    return StepCost(n_tokens, work.batch, bytes_read, flops,
                    bytes_read / hw.bandwidth_bytes_per_s, flops / hw.peak_flops)


def free_verify_tokens(work: Workload, hw: Hardware) -> float:
    """Tokens per sequence a step can score before it turns compute-bound (ridge point)."""
    one = step_cost(work, hw, 1)
    return math.inf if one.compute_s == 0 else one.memory_s / one.compute_s


def expected_tokens(alpha: float, k: int) -> float:
    """``E = (1 - alpha^(K+1)) / (1 - alpha)``: tokens per step with K i.i.d. drafts."""
    if not 0.0 <= alpha <= 1.0:
        raise SpecserveError(f"alpha {alpha}: must be in [0, 1]")
    if k < 0:
        raise SpecserveError(f"draft length {k}: must be >= 0")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_tokens_from_rates(rates: Sequence[float], k: int) -> float:
    """``E = 1 + sum_{j<K} a_j`` from per-position acceptance rates (over all steps)."""
    check_rates(rates)
    if k > len(rates):
        raise SpecserveError(f"draft length {k}: only {len(rates)} per-position rates given")
    return 1.0 + float(sum(rates[:k]))


def check_rates(rates: Sequence[float]) -> None:
    """Per-position rates must lie in [0, 1] and not increase (a later draft needs all earlier
    ones accepted)."""
    if not rates:
        raise SpecserveError("per-position rates: empty")
    for i, r in enumerate(rates):
        if not 0.0 <= r <= 1.0:
            raise SpecserveError(f"per-position rate {i} = {r}: must be in [0, 1]")
        if i and r > rates[i - 1] + 1e-9:
            raise SpecserveError(f"per-position rate {i} = {r} exceeds rate {i - 1}")


@dataclass(frozen=True)
class SpeedupPoint:
    """Prediction for one draft length ``k`` (or tree with ``n_verify - 1`` nodes)."""

    k: int
    n_verify: int
    tau: float
    propose_s: float
    verify_s: float
    baseline_s: float
    overhead_s: float = 0.0  # fixed cost of every decode step outside the forward (serving)

    @property
    def speedup(self) -> float:
        o = self.overhead_s
        return self.tau * (self.baseline_s + o) / (self.propose_s + self.verify_s + o)

    def to_dict(self) -> dict[str, float]:
        return {"k": self.k, "n_verify": self.n_verify, "tau": self.tau,
                "propose_ms": self.propose_s * 1e3, "verify_ms": self.verify_s * 1e3,
                "overhead_ms": self.overhead_s * 1e3, "speedup": self.speedup}


@dataclass(frozen=True)
class Proposer:
    """Cost of proposing: ``kind`` is medusa (one pass, ``step_s``), draft (``k`` sequential
    steps of ``step_s``) or ngram (free)."""

    kind: str
    step_s: float = 0.0

    def propose_s(self, k: int) -> float:
        if self.kind == "draft":
            return k * self.step_s
        if self.kind == "medusa":
            return self.step_s
        if self.kind == "ngram":
            return 0.0
        raise SpecserveError(f"proposer {self.kind!r}: expected medusa, draft or ngram")


def speedup_point(k: int, tau: float, proposer: Proposer, step_s: Mapping[int, float],
                  n_verify: int | None = None, overhead_s: float = 0.0) -> SpeedupPoint:
    """``S = tau * (T(1) + o) / (T_propose(k) + T_verify(n) + o)``; ``step_s`` maps n -> T(n)
    seconds; ``o`` = ``overhead_s``, a fixed per-step cost outside the model (0 = pure model)."""
    n = k + 1 if n_verify is None else n_verify
    for need in (1, n):
        if need not in step_s:
            raise SpecserveError(f"no step time for n={need} tokens")
    if overhead_s < 0:
        raise SpecserveError(f"step overhead {overhead_s} s: must be >= 0")
    return SpeedupPoint(k, n, tau, proposer.propose_s(k), step_s[n], step_s[1], overhead_s)


def roofline_step_times(work: Workload, hw: Hardware, ns: Sequence[int]) -> dict[int, float]:
    """``{n: T(n)}`` seconds from the roofline for each token count in ``ns`` (and 1)."""
    return {n: step_cost(work, hw, n).time_s for n in sorted({1, *ns})}


@dataclass(frozen=True)
class Acceptance:
    """Acceptance given as i.i.d. ``alpha``, per-position ``rates``, or a measured ``tau`` that
    holds only at draft length ``tau_k`` (e.g. a Medusa tree of depth ``tau_k``)."""

    alpha: float | None = None
    rates: tuple[float, ...] | None = None
    tau: float | None = None
    tau_k: int | None = None

    def draft_lengths(self, max_k: int) -> list[int]:
        """The draft lengths this acceptance can predict (1..max_k, or the measured one)."""
        if self.alpha is not None:
            return list(range(1, max_k + 1))
        if self.rates is not None:
            return list(range(1, min(max_k, len(self.rates)) + 1))
        if self.tau is not None and self.tau_k is not None:
            return [self.tau_k]
        raise SpecserveError("acceptance: give alpha, per-position rates, or tau with its K")

    def tau_at(self, k: int) -> float:
        if self.alpha is not None:
            return expected_tokens(self.alpha, k)
        if self.rates is not None:
            return expected_tokens_from_rates(self.rates, k)
        if self.tau is not None and k == self.tau_k:
            return self.tau
        raise SpecserveError(f"acceptance: no tau known for draft length {k}")


@dataclass(frozen=True)
class Prediction:
    """``points`` over draft lengths, the best one, and the one asked for (if any)."""

    baseline_s: float
    batch: int
    points: tuple[SpeedupPoint, ...]
    best: SpeedupPoint
    chosen: SpeedupPoint | None

    @property
    def tokens_per_s_ceiling(self) -> float:
        return self.batch / self.baseline_s


def predict_speedup(acceptance: Acceptance, proposer: Proposer, step_s: Mapping[int, float],
                    *, batch: int = 1, max_k: int = 16, k: int | None = None,
                    tree_nodes: int | None = None, overhead_s: float = 0.0) -> Prediction:
    """Sweep draft lengths and pick the best speedup.

    ``tree_nodes`` (Medusa tree): verify ``tree_nodes + 1`` tokens at draft depth ``k``; only
    that one point is predicted. Otherwise a chain: verify ``k + 1`` tokens for each ``k``.
    """
    if tree_nodes is not None:
        if k is None:
            raise SpecserveError("tree: give the tree depth (--draft-len) with --tree-nodes")
        ks = [k]
    else:
        ks = acceptance.draft_lengths(max_k)
        if k is not None and k not in ks:
            ks = sorted({*ks, k})
    n_of = (lambda kk: tree_nodes + 1) if tree_nodes is not None else (lambda kk: kk + 1)
    points = tuple(speedup_point(kk, acceptance.tau_at(kk), proposer, step_s, n_of(kk),
                                 overhead_s) for kk in ks)
    best = max(points, key=lambda p: (p.speedup, -p.k))
    chosen = next((p for p in points if p.k == k), None) if k is not None else None
    return Prediction(step_s[1], batch, points, best, chosen)


# --------------------------------------------------------------- bench summaries (parsed JSON)


def spec_acceptance(summary: Any, where: str) -> dict[str, Any]:
    """The acceptance dict of the speculative variant in a bench ``summary.json``
    (``variants.spec.acceptance``, else ``acceptance``, else a plain
    ``AcceptanceStats.to_dict()``). ``where`` names the file in the error."""
    if isinstance(summary, dict):
        variants = summary.get("variants")
        if isinstance(variants, dict) and isinstance(variants.get("spec"), dict):
            acc = variants["spec"].get("acceptance")
            if isinstance(acc, dict):
                return acc
        if isinstance(summary.get("acceptance"), dict):
            return dict(summary["acceptance"])
        if "accepted_nodes" in summary or "per_position_acceptance" in summary:
            return summary
    raise SpecserveError(f"{where}: no variants.spec.acceptance (not a specserve bench summary?)")


def measured_speedups(summary: Any) -> dict[str, float]:
    """``{metric: speedup}`` from a bench summary's ``speedup`` block (entries without a numeric
    ``speedup`` are skipped; no block gives ``{}``)."""
    sp = summary.get("speedup") if isinstance(summary, dict) else None
    if not isinstance(sp, dict):
        return {}
    return {m: float(v["speedup"]) for m, v in sp.items()
            if isinstance(v, dict) and isinstance(v.get("speedup"), int | float)}


def needed_step_sizes(acceptance: Acceptance | None, k: int | None, tree_nodes: int | None,
                      max_k: int) -> list[int]:
    """The token counts ``n`` whose ``T(n)`` a prediction needs: always 1; for a tree
    ``tree_nodes + 1``; for a chain ``K + 1`` for every predictable ``K`` (and ``k``)."""
    if acceptance is None:
        return [1]
    if tree_nodes is not None:
        return [1, tree_nodes + 1]
    ks = set(acceptance.draft_lengths(max_k)) | ({k} if k is not None else set())
    return sorted({1, *(kk + 1 for kk in ks)})


def acceptance_from_summary(summary: Any, where: str) -> Acceptance:
    """Per-position acceptance of a bench summary's speculative variant
    (``per_position_acceptance`` of :func:`spec_acceptance`)."""
    raw = spec_acceptance(summary, where).get("per_position_acceptance") or []
    if not isinstance(raw, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in raw):
        raise SpecserveError(f"{where}: per_position_acceptance: expected a list of numbers, "
                             f"got {raw!r:.60}")
    if not raw:
        raise SpecserveError(f"{where}: the spec variant has no per_position_acceptance")
    rates = tuple(float(v) for v in raw)
    check_rates(rates)
    return Acceptance(rates=rates)
