"""Input validation before any heavy work: target checkpoint, Medusa heads, EAGLE, parallelism.

Every check reads headers and small JSON files only (never full weight tensors) and raises
:class:`specserve.errors.SpecserveError` with one line ``<file>: <mismatch>``. File reading
(safetensors headers, tokenizer fingerprints and the draft/target tokenizer match) lives in
:mod:`specserve.checkpoint`, shared with the runtime.

Formats checked:
- Hugging Face ``config.json`` (Llama / Mistral / Qwen2 / Qwen3 keys; the family and per-layer
  attention by :func:`specserve.checkpoint.check_family`) and safetensors weight headers.
- Medusa-1 heads in the FasterDecoding layout (Cai et al. 2024, "Medusa", arXiv:2401.10774):
  ``config.json`` with ``medusa_num_heads``/``medusa_num_layers`` and
  ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.weight|bias`` and ``{h}.{L}.weight``,
  which is what TensorRT-LLM's ``examples/medusa/convert_checkpoint.py`` reads. The head count
  comes from the weights: the converter ignores the heads' ``config.json`` (it takes
  ``--num_medusa_heads``), and the public ``FasterDecoding/medusa-vicuna-7b-v1.3`` heads, which
  upstream's Medusa README converts, say ``medusa_num_heads: 2`` while holding more; a mismatch
  is one ``warning:`` line on stderr, not an error.
- EAGLE weights as TensorRT-LLM's ``ModelWeightsLoader.detect_format`` (used by
  ``examples/eagle/convert_checkpoint.py``) reads them: ``*.safetensors``, ``*.bin`` or ``*.pth``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.checkpoint import (
    check_family,
    load_pt_state_dict,
    medusa_weights_file,
    model_tensors,
    read_json,
    read_safetensors_header,
)
from specserve.errors import SpecserveError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")
_HEAD_TENSOR = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


@dataclass(frozen=True)
class MedusaInfo:
    """What :func:`validate_medusa` found in a heads directory."""

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    weights: Path


def _int_key(cfg: dict[str, Any], key: str, path: Path) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecserveError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


def validate_target(model_dir: str | Path, any_architecture: bool = False) -> dict[str, Any]:
    """Check an HF decoder checkpoint (architecture, config consistency, weights); return its
    config.json. ``any_architecture``: TensorRT-LLM's PyTorch route, whose LLM API loads many
    more families than the converters of the engine flow (it names an unsupported one itself)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: not a directory")
    cfg_path = d / "config.json"
    cfg = read_json(cfg_path)
    archs = cfg.get("architectures") or []
    if any_architecture:
        return _validate_llmapi_target(cfg, cfg_path)
    if not archs or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise SpecserveError(f"{cfg_path}: architecture {archs[0] if archs else None!r} is not "
                             f"supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    check_family(cfg, cfg_path)
    hidden = _int_key(cfg, "hidden_size", cfg_path)
    heads = _int_key(cfg, "num_attention_heads", cfg_path)
    _int_key(cfg, "num_hidden_layers", cfg_path)
    vocab = _int_key(cfg, "vocab_size", cfg_path)
    kv = cfg.get("num_key_value_heads") or heads
    if cfg.get("model_type") != "qwen3" and hidden % heads:  # Qwen3: head_dim its own key
        raise SpecserveError(f"{cfg_path}: hidden_size {hidden} is not divisible by "
                             f"num_attention_heads {heads}")
    if not isinstance(kv, int) or kv <= 0 or heads % kv:
        raise SpecserveError(f"{cfg_path}: num_key_value_heads {kv!r} does not divide "
                             f"num_attention_heads {heads}")
    tensors = model_tensors(d)
    emb = tensors.get("model.embed_tokens.weight")
    if emb is None:
        raise SpecserveError(f"{d}: weights have no 'model.embed_tokens.weight'")
    if emb.shape != (vocab, hidden):
        raise SpecserveError(f"{d}: model.embed_tokens.weight has shape {list(emb.shape)} but "
                             f"config.json says [vocab_size, hidden_size] = [{vocab}, {hidden}]")
    head = tensors.get("lm_head.weight")
    if head is None and not cfg.get("tie_word_embeddings", False):
        raise SpecserveError(f"{d}: weights have no 'lm_head.weight' and config.json does not set "
                             "tie_word_embeddings")
    if head is not None and head.shape != (vocab, hidden):
        raise SpecserveError(f"{d}: lm_head.weight has shape {list(head.shape)}, expected "
                             f"[{vocab}, {hidden}]")
    return cfg


def _validate_llmapi_target(cfg: dict[str, Any], cfg_path: Path) -> dict[str, Any]:
    """The PyTorch route's target: architecture support is the LLM API's own list
    (NVIDIA/TensorRT-LLM ``docs/source/models/supported-models.md``: DeepSeek-V3, Llama 4,
    Mixtral, Qwen3-MoE, ...; it names an unsupported one itself), so no family check here; only
    what the route's own checks read (heads and layers for TP/PP, hidden and vocab sizes for the
    head/draft fit). Multimodal configs keep these under ``text_config``."""
    if not cfg.get("architectures"):
        raise SpecserveError(f"{cfg_path}: no 'architectures' (not a Hugging Face model config)")
    dims = {**(cfg.get("text_config") or {}), **cfg} if "hidden_size" not in cfg else cfg
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        _int_key(dims, key, cfg_path)
    return dims


def _medusa_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    if weights.suffix == ".safetensors":
        return {k: v.shape for k, v in read_safetensors_header(weights).items()}
    return {k: tuple(v.shape) for k, v in load_pt_state_dict(weights, mmap=True).items()}


def validate_medusa(heads_dir: str | Path, target_cfg: dict[str, Any],
                    tree: Sequence[Sequence[int]] | None = None) -> MedusaInfo:
    """Check Medusa heads against their own config, the target's config and the tree depth."""
    d = Path(heads_dir)
    cfg_path = d / "config.json"
    cfg = read_json(cfg_path)
    n_heads = _int_key(cfg, "medusa_num_heads", cfg_path)
    n_layers = _int_key({"medusa_num_layers": 1, **cfg}, "medusa_num_layers", cfg_path)
    weights = medusa_weights_file(d)
    shapes = _medusa_shapes(weights)
    hidden, vocab = int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"])
    for key, want in (("hidden_size", hidden), ("vocab_size", vocab)):
        if key in cfg and cfg[key] != want:
            raise SpecserveError(f"{cfg_path}: {key} {cfg[key]} does not match the target's {want}")
    found: dict[int, set[int]] = {}
    for name in shapes:
        m = _HEAD_TENSOR.match(name)
        if m is None:
            raise SpecserveError(f"{weights}: unexpected tensor {name!r} (not a Medusa head)")
        found.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if not found:
        raise SpecserveError(f"{weights}: holds no Medusa heads")
    if sorted(found) != list(range(len(found))):
        raise SpecserveError(f"{weights}: heads {sorted(found)} are not numbered 0..N-1 "
                             "(the converter reads heads 0..num_medusa_heads-1)")
    if len(found) != n_heads:
        warn(f"{weights}: holds {len(found)} heads but {cfg_path.name} says "
             f"medusa_num_heads={n_heads}; using {len(found)} (the count in the weights, "
             "passed to the converter as --num_medusa_heads)")
        n_heads = len(found)
    for h in range(n_heads):
        _check_head(weights, shapes, h, n_layers, hidden, vocab)
    if tree is not None and tree:
        depth = max(len(path) for path in tree)
        if depth > n_heads:
            raise SpecserveError(f"{cfg_path}: medusa_choices depth {depth} exceeds the "
                                 f"{n_heads} heads")
    return MedusaInfo(n_heads, n_layers, hidden, vocab, weights)


def warn(message: str) -> None:
    """One ``warning: <message>`` line on stderr (stdout stays the command's output)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _check_head(weights: Path, shapes: dict[str, tuple[int, ...]], h: int, n_layers: int,
                hidden: int, vocab: int) -> None:
    expected: dict[str, tuple[int, ...]] = {
        f"{h}.{n}.linear.weight": (hidden, hidden) for n in range(n_layers)}
    expected.update({f"{h}.{n}.linear.bias": (hidden,) for n in range(n_layers)})
    expected[f"{h}.{n_layers}.weight"] = (vocab, hidden)
    for name, shape in expected.items():
        got = shapes.get(name)
        if got is None:
            raise SpecserveError(f"{weights}: missing {name!r} (config.json says "
                                 f"medusa_num_layers={n_layers})")
        if got != shape:
            raise SpecserveError(f"{weights}: {name} has shape {list(got)}, expected "
                                 f"{list(shape)} (target hidden_size={hidden}, vocab={vocab})")
    extra = sorted({k for k in shapes if k.startswith(f"{h}.")} - set(expected))
    if extra:
        raise SpecserveError(f"{weights}: head {h} has tensors {extra} beyond "
                             f"medusa_num_layers={n_layers} in config.json")


def validate_parallelism(cfg: dict[str, Any], tp: int, pp: int,
                         source: str = "config.json") -> None:
    """Check tensor/pipeline parallel sizes against the attention heads and layers.

    TensorRT-LLM splits query heads evenly over TP ranks; KV heads are split when tp divides
    them and replicated when they divide tp. Layers are split over PP ranks."""
    name = source
    if tp < 1 or pp < 1:
        raise SpecserveError(f"--tp {tp} / --pp {pp}: both must be >= 1")
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    layers = int(cfg["num_hidden_layers"])
    if heads % tp:
        raise SpecserveError(f"{name}: num_attention_heads {heads} is not divisible by --tp {tp}")
    if kv % tp and tp % kv:
        raise SpecserveError(f"{name}: num_key_value_heads {kv} and --tp {tp}: one must divide "
                             "the other")
    if pp > layers:
        raise SpecserveError(f"{name}: --pp {pp} exceeds num_hidden_layers {layers}")


def validate_eagle(eagle_dir: str | Path, target_cfg: dict[str, Any]) -> dict[str, Any]:
    """Check an EAGLE draft-head checkpoint (config.json + weights) against the target."""
    d = Path(eagle_dir)
    cfg_path = d / "config.json"
    cfg = read_json(cfg_path)
    for key in ("hidden_size", "vocab_size"):
        if key in cfg and cfg[key] != target_cfg[key]:
            raise SpecserveError(f"{cfg_path}: {key} {cfg[key]} does not match the target's "
                                 f"{target_cfg[key]}")
    files = sorted(d.glob("*.safetensors"))
    if files:
        for f in files:
            read_safetensors_header(f)
    elif not any(d.glob("*.bin")) and not any(d.glob("*.pth")):
        pt = sorted(d.glob("*.pt"))
        if pt:
            raise SpecserveError(
                f"{pt[0]}: EAGLE weights as *.pt are not read by the pinned TensorRT-LLM "
                "(examples/eagle/convert_checkpoint.py loads *.safetensors, *.bin or *.pth: "
                "ModelWeightsLoader.detect_format); save them as safetensors")
        raise SpecserveError(f"{d}: no EAGLE weights (*.safetensors, *.bin or *.pth)")
    return cfg


EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3",)


def _tensor_names(d: Path) -> set[str] | None:
    """Tensor names of a checkpoint directory from its safetensors index or headers (None
    when it has neither)."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise SpecserveError(f"{index}: has no 'weight_map' object")
        return set(weight_map)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for f in files:
        names.update(read_safetensors_header(f))
    return names


def validate_eagle3(eagle_dir: str | Path, target_cfg: dict[str, Any],
                    reference: bool = False) -> dict[str, Any]:
    """Check an EAGLE-3 head (Li et al. 2025, "EAGLE-3", arXiv:2503.01840) against the target
    from its config.json and weight names only: the yuhuili/SpecForge layout
    (``architectures: [LlamaForCausalLMEagle3]``, ``draft_vocab_size`` with a ``d2t`` map) or a
    ModelOpt export (an ``eagle_config`` block), as TensorRT-LLM's PyTorch backend reads them
    through ``speculative_model_dir``."""
    d = Path(eagle_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: not a directory")
    cfg_path = d / "config.json"
    cfg = read_json(cfg_path)
    archs = cfg.get("architectures") or []
    if not any(a in EAGLE3_ARCHITECTURES for a in archs) and "eagle_config" not in cfg:
        raise SpecserveError(f"{cfg_path}: not an EAGLE-3 head (architectures {archs} has no "
                             f"{EAGLE3_ARCHITECTURES[0]} and there is no eagle_config block)")
    hidden, vocab = int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"])
    if cfg.get("hidden_size") != hidden:
        raise SpecserveError(f"{cfg_path}: hidden_size {cfg.get('hidden_size')!r} does not match "
                             f"the target's {hidden} (an EAGLE-3 head reads the target's hidden "
                             "states)")
    if "vocab_size" in cfg and cfg["vocab_size"] != vocab:
        raise SpecserveError(f"{cfg_path}: vocab_size {cfg['vocab_size']} does not match the "
                             f"target's {vocab}")
    draft_vocab = cfg.get("draft_vocab_size", vocab)
    if not isinstance(draft_vocab, int) or isinstance(draft_vocab, bool) or not (
            0 < draft_vocab <= vocab):
        raise SpecserveError(f"{cfg_path}: draft_vocab_size {draft_vocab!r} must be in 1.."
                             f"{vocab} (the target's vocab_size)")
    names = _tensor_names(d)
    if names is not None and draft_vocab != vocab and "d2t" not in names:
        raise SpecserveError(f"{d}: draft_vocab_size {draft_vocab} < vocab_size {vocab} but the "
                             "weights have no 'd2t' (draft-to-target token map)")
    _check_eagle3_layers(cfg, target_cfg, str(cfg_path), required=reference)
    if reference:  # the reference decoder reads the portable layout itself
        if names is None:
            raise SpecserveError(f"{d}: no model.safetensors (the torch backend reads EAGLE-3 "
                                 "heads as safetensors)")
        maps = ("d2t", "t2d") if draft_vocab < vocab else ()  # none over the whole vocab
        missing = [k for k in ("fc.weight", "norm.weight", "lm_head.weight", *maps)
                   if k not in names]
        if missing:
            raise SpecserveError(f"{d}: missing {', '.join(missing)} in the head's weights")
    return cfg


def _check_eagle3_layers(cfg: dict[str, Any], target_cfg: dict[str, Any], where: str,
                         required: bool) -> None:
    """``eagle_aux_hidden_state_layer_ids`` within the target's layers 0..L (vLLM's numbering:
    id i is the input of layer i, L the last layer's output)."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or cfg.get(
        "eagle_aux_hidden_state_layer_ids")
    if not ids:
        if required:
            raise SpecserveError(f"{where}: no eagle_config.eagle_aux_hidden_state_layer_ids "
                                 "(which target layers the head reads)")
        return
    layers = int(target_cfg.get("num_hidden_layers", 0))
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i <= layers]
    if bad:
        raise SpecserveError(f"{where}: eagle_aux_hidden_state_layer_ids {bad} do not fit the "
                             f"{layers}-layer target (0..{layers})")


def validate_mtp(target_cfg: dict[str, Any], source: str) -> int:
    """The target's MTP layer count (``num_nextn_predict_layers`` > 0, DeepSeek-V3 style)."""
    n = target_cfg.get("num_nextn_predict_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SpecserveError(f"{source}: --mtp needs MTP layers, but num_nextn_predict_layers is "
                             f"{n!r} (the checkpoint has none; use --eagle3, --draft or --ngram)")
    return n
