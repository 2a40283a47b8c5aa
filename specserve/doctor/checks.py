"""The doctor's static checks: pure functions over parsed :class:`~specserve.doctor.sides.Side`
objects, each returning :class:`~specserve.doctor.findings.Finding` lines.

What each guards against (silent acceptance collapse, where the pairing serves without an error and
acceptance falls):

- ``tokenizer-mismatch``: vocabulary, merges or special tokens differ (a hash of each, never
  just ``vocab_size``): the draft's ids mean other strings; vLLM's Token-Level Intersection
  (vllm-project/vllm PR #38174) is the route for a draft from another family.
- ``special-tokens-mismatch``: bos/eos/pad ids of ``config.json`` / ``generation_config.json``.
- ``chat-template-missing`` / ``chat-template-mismatch`` (ROCm/ATOM #609: a draft trained
  without the chat format loses acceptance on chat traffic).
- ``precision-mismatch``: one side quantized, the other not, or quantized differently
  (vllm-project/vllm #41789, #43455: 0.2% and 1.82% acceptance).
- ``sampler-mismatch`` / ``sampler-defaults``: ``generation_config.json`` sampler keys; vLLM
  applies the target's as request defaults (``--generation-config auto``), so a request that
  sets nothing samples (syv-ai/qwen38-27b-rtx3090 #73: a sampler default that changed).
- ``draft-context-short``: the draft's ``max_position_embeddings`` below the served context
  (vllm-project/speculators PR #684: EAGLE-3 tau 2.30 at 2k -> 1.08 at 20k).
- ``head-hidden-size`` / ``vocab-mismatch``: a head trained on another backbone (for a draft
  model with the target's tokenizer a width difference is padding: a warning).
"""

from __future__ import annotations

from typing import Any

from specserve.doctor.findings import Finding, error, info, warning
from specserve.doctor.sides import Side

# transformers' GenerationConfig defaults: what an absent key means
SAMPLER_DEFAULTS: dict[str, Any] = {"do_sample": False, "temperature": 1.0, "top_p": 1.0,
                                    "top_k": 50, "repetition_penalty": 1.0}
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
STORED_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_QUANT_FLOAT_DTYPES = {"F8_E4M3": "fp8", "F8_E5M2": "fp8"}
TLI_HINT = ("a draft from another tokenizer family needs vLLM's Token-Level Intersection "
            "(vllm-project/vllm PR #38174, draft_model only); TensorRT-LLM and specserve need one "
            "vocabulary")


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    return tuple(sorted(value)) if isinstance(value, list) else (value,)


def check_tokenizer(target: Side, draft: Side) -> list[Finding]:
    """Vocabulary, merges and special tokens of the two tokenizers (hashes, not sizes)."""
    t, d = target.tokenizer, draft.tokenizer
    if t is None or d is None:
        missing = target if t is None else draft
        return [warning("tokenizer-missing", f"{missing.path}: no tokenizer.json or "
                        f"tokenizer.model, the {missing.name}'s vocabulary cannot be checked")]
    parts = [name for name, a, b in (("format", t.path.name, d.path.name),
                                     ("vocabulary", t.vocab_sha256, d.vocab_sha256),
                                     ("merges", t.merges_sha256, d.merges_sha256),
                                     ("special tokens", t.special_sha256, d.special_sha256))
             if a != b]
    if not parts:
        return []
    sizes = (f"same size ({t.vocab_size})" if t.vocab_size == d.vocab_size
             else f"{d.vocab_size} vs the target's {t.vocab_size} tokens")
    return [error("tokenizer-mismatch", f"{d.path}: {', '.join(parts)} differ from the target's "
                  f"tokenizer ({t.path}; {sizes}): {TLI_HINT}")]


def special_ids(side: Side) -> dict[str, tuple[int, ...] | None]:
    """bos/eos/pad ids, ``generation_config.json`` over ``config.json`` (as transformers)."""
    gen = side.generation or {}
    return {k: _ids(gen.get(k, side.config.get(k))) for k in SPECIAL_IDS}


def check_special_tokens(target: Side, draft: Side) -> list[Finding]:
    t, d = special_ids(target), special_ids(draft)
    diff = [f"{k} {d[k]} vs {t[k]}" for k in SPECIAL_IDS
            if t[k] is not None and d[k] is not None and t[k] != d[k]]
    if not diff:
        return []
    return [error("special-tokens-mismatch", f"{draft.path}: {'; '.join(diff)} (draft vs "
                  "target): the draft stops or pads on other ids")]


def check_chat_template(target: Side, proposer: Side) -> list[Finding]:
    """The target's template must exist (chat requests are formatted with it); a draft's that
    exists and differs was trained on another chat format."""
    if target.chat_template is None:
        return [warning("chat-template-missing", f"{target.path}: no chat_template in "
                        "tokenizer_config.json (nor chat_template.jinja/.json): chat requests "
                        "cannot be formatted as the model was trained")]
    if proposer.chat_template is not None and proposer.chat_template != target.chat_template:
        return [warning("chat-template-mismatch", f"{proposer.path}: chat template differs from "
                        "the target's: the draft saw another chat format (lower acceptance on "
                        "chat traffic)")]
    return []


def weight_dtype(side: Side) -> str:
    """``torch_dtype`` (or ``dtype``) of ``config.json``, else the commonest stored dtype."""
    value = side.config.get("torch_dtype") or side.config.get("dtype")
    if isinstance(value, str):
        return value
    counts: dict[str, int] = {}
    for t in side.tensors.values():
        counts[t.dtype] = counts.get(t.dtype, 0) + 1
    if not counts:
        return "unknown"
    common = max(counts, key=lambda k: counts[k])
    return STORED_DTYPE_NAMES.get(common, common.lower())


def quantization(side: Side) -> str | None:
    """The weight quantization of a side, or None: ``quantization_config`` (HF), ModelOpt's
    ``hf_quant_config.json``, specserve's own FP8 key, or FP8 tensors in the safetensors."""
    q = side.config.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method") or "quantized").lower()
        algo = q.get("quant_algo") or q.get("fmt") or q.get("bits")
        return f"{method}:{str(algo).lower()}" if algo else method
    mo = (side.quant_config or {}).get("quantization")
    if isinstance(mo, dict) and mo.get("quant_algo"):
        return f"modelopt:{str(mo['quant_algo']).lower()}"
    own = side.config.get("specserve_quantization")
    if isinstance(own, dict):
        return f"specserve:{str(own.get('quant_algo', 'fp8')).lower()}"
    stored = {_QUANT_FLOAT_DTYPES[t.dtype] for t in side.tensors.values()
              if t.dtype in _QUANT_FLOAT_DTYPES}
    return f"stored:{stored.pop()}" if stored else None


def quant_scheme(q: str | None) -> str | None:
    """The number format of a quantization, whoever recorded it (``modelopt:fp8``,
    ``fp8:e4m3`` and ``stored:fp8`` are all ``fp8``)."""
    if q is None:
        return None
    for scheme, marks in (("fp4", ("fp4",)), ("fp8", ("fp8", "e4m3", "e5m2")),
                          ("int4", ("awq", "int4", "w4a16")), ("int8", ("int8", "w8a8"))):
        if any(m in q for m in marks):
            return scheme
    return q


def _precision(side: Side) -> str:
    q = quantization(side)
    return weight_dtype(side) + (f" quantized {q}" if q else "")


def check_precision(target: Side, proposer: Side) -> list[Finding]:
    """A quantized side opposite an unquantized one (either way), or two quantizations."""
    qt, qp = quant_scheme(quantization(target)), quant_scheme(quantization(proposer))
    pt, pp = _precision(target), _precision(proposer)
    out = [info("precision", f"target {pt}; {proposer.name} {pp}")]
    if qt != qp:
        out.append(warning("precision-mismatch", f"{proposer.path}: {proposer.name} is {pp}, the "
                           f"target is {pt}: the draft proposes from another distribution than "
                           "the one verified (acceptance collapses silently, vLLM #41789, "
                           "#43455); pair precisions or measure (the probe)"))
    return out


def sampler(side: Side) -> dict[str, Any]:
    """The sampler keys of ``generation_config.json``, absent ones at transformers' defaults."""
    gen = side.generation or {}
    return {k: gen.get(k, default) for k, default in SAMPLER_DEFAULTS.items()}


def check_sampler(target: Side, proposer: Side) -> list[Finding]:
    """Sampler defaults that differ between the sides, and target defaults that sample."""
    out: list[Finding] = []
    t = sampler(target)
    if t["do_sample"]:
        keys = ", ".join(f"{k}={t[k]}" for k in ("temperature", "top_p", "top_k"))
        out.append(info("sampler-defaults", f"{target.path}/generation_config.json samples "
                        f"({keys}): vLLM applies it to requests that set nothing "
                        "(--generation-config auto), so acceptance there is the sampled one, "
                        "below a greedy probe's"))
    if t["repetition_penalty"] != 1.0:
        out.append(warning("sampler-penalty", f"{target.path}/generation_config.json sets "
                           f"repetition_penalty={t['repetition_penalty']}: applied to the "
                           "target's logits but not the draft's proposals"))
    if target.generation is None or proposer.generation is None:
        return out
    p = sampler(proposer)
    diff = [f"{k} {p[k]} vs {t[k]}" for k in SAMPLER_DEFAULTS if p[k] != t[k]]
    if diff:
        out.append(warning("sampler-mismatch", f"{proposer.path}/generation_config.json: "
                           f"{'; '.join(diff)} (draft vs target): the draft was tuned for "
                           "another sampler; requests get the target's"))
    return out


def check_context(target: Side, proposer: Side, max_seq_len: int) -> list[Finding]:
    """The draft's trained context against the served one (Medusa heads have no positions)."""
    limit = proposer.config.get("max_position_embeddings")
    if proposer.kind == "medusa" or not isinstance(limit, int) or limit >= max_seq_len:
        return []
    return [warning("draft-context-short", f"{proposer.path}: max_position_embeddings {limit} "
                    f"< the served context {max_seq_len}: past {limit} tokens the "
                    f"{proposer.name} extrapolates and acceptance falls")]


def medusa_shape(side: Side) -> tuple[int | None, int | None]:
    """(hidden size, vocab rows) of Medusa heads: from the weights, else ``config.json``."""
    layers = int(side.config.get("medusa_num_layers", 1))
    w, lm = side.tensors.get("0.0.linear.weight"), side.tensors.get(f"0.{layers}.weight")
    hidden = w.shape[-1] if w is not None else side.config.get("hidden_size")
    vocab = lm.shape[0] if lm is not None else side.config.get("vocab_size")
    return hidden, vocab


def proposer_shape(side: Side) -> tuple[Any, Any]:
    """(the target hidden size it reads, the vocabulary it proposes over)."""
    if side.kind == "medusa":
        return medusa_shape(side)
    if side.kind == "eagle3":
        c = side.config
        return c.get("target_hidden_size") or c.get("hidden_size"), c.get("vocab_size")
    return None, side.config.get("vocab_size")  # a draft model reads no hidden state


def check_shapes(target: Side, proposer: Side, same_tokenizer: bool = False) -> list[Finding]:
    """A head trained for another hidden size; a proposal vocabulary of another width (a
    warning only for a draft model whose tokenizer is the target's: padded embeddings)."""
    hidden, vocab = proposer_shape(proposer)
    t_hidden, t_vocab = target.config.get("hidden_size"), target.config.get("vocab_size")
    out = []
    if hidden is not None and hidden != t_hidden:
        out.append(error("head-hidden-size", f"{proposer.path}: {proposer.name} read hidden "
                         f"size {hidden}, the target's is {t_hidden}: trained for another "
                         "backbone"))
    if vocab is not None and vocab != t_vocab:
        text = (f"{proposer.path}: {proposer.name} proposes over {vocab} ids, the target's "
                f"vocab_size is {t_vocab}")
        if proposer.kind == "draft" and same_tokenizer:
            out.append(warning("vocab-mismatch", f"{text}; the tokenizers match (padded "
                               "embeddings), so drafts are accepted by token ids (TensorRT-LLM's "
                               "engine flow without use_draft_logits, --flow pytorch, vLLM); "
                               "specserve's torch engine refuses the pair"))
        else:
            out.append(error("vocab-mismatch", text))
    return out


def static_checks(target: Side, proposer: Side, max_seq_len: int) -> list[Finding]:
    """Every static check of a target and its proposer."""
    out = []
    same_tokenizer = False
    if proposer.kind == "draft":
        tokenizer = check_tokenizer(target, proposer)
        same_tokenizer = not tokenizer
        out += tokenizer + check_special_tokens(target, proposer)
    out += check_chat_template(target, proposer)
    out += check_precision(target, proposer)
    out += check_sampler(target, proposer)
    out += check_context(target, proposer, max_seq_len)
    out += check_shapes(target, proposer, same_tokenizer)
    return out
