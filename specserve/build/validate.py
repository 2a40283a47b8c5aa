"""Input validation before any heavy work: checkpoints, Medusa heads, tokenizers, parallelism.

Every check reads headers and small JSON files only (never full weight tensors) and raises
:class:`specserve.errors.SpecserveError` with one line ``<file>: <mismatch>``.

Formats checked:
- safetensors (https://github.com/huggingface/safetensors#format): 8-byte little-endian header
  length N, an N-byte JSON header ``{name: {dtype, shape, data_offsets}}``, then the data.
- Hugging Face ``config.json`` (Llama / Mistral / Qwen2 keys) and ``tokenizer.json``.
- Medusa-1 heads in the FasterDecoding layout (Cai et al. 2024, "Medusa", arXiv:2401.10774):
  ``config.json`` with ``medusa_num_heads``/``medusa_num_layers`` and
  ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.weight|bias`` and ``{h}.{L}.weight``,
  which is what TensorRT-LLM's ``examples/medusa/convert_checkpoint.py`` reads.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.config import read_json as _read_any_json
from specserve.errors import SpecserveError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}
_HEAD_TENSOR = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a safetensors header."""

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


@dataclass(frozen=True)
class MedusaInfo:
    """What :func:`validate_medusa` found in a heads directory."""

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    weights: Path


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, or raise ``<path>: ...`` for a missing or malformed file."""
    data = _read_any_json(path)
    if not isinstance(data, dict):
        raise SpecserveError(f"{path}: expected a JSON object")
    return data


def read_safetensors_header(path: str | Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header: readable, consistent, and the file not truncated."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise SpecserveError(f"{p}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", raw_len)
            if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise SpecserveError(f"{p}: truncated or corrupt safetensors header ({n} bytes "
                                     f"declared, file is {size} bytes)")
            header = json.loads(f.read(n))
    except FileNotFoundError as e:
        raise SpecserveError(f"{p}: not found") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecserveError(f"{p}: unreadable safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise SpecserveError(f"{p}: safetensors header is not a JSON object")
    return _tensor_infos(p, header, size - 8 - n)


def _tensor_infos(p: Path, header: dict[str, Any], data_size: int) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            info = TensorInfo(str(entry["dtype"]), tuple(int(d) for d in entry["shape"]),
                              (int(entry["data_offsets"][0]), int(entry["data_offsets"][1])))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise SpecserveError(f"{p}: malformed header entry for tensor {name!r}") from e
        begin, end = info.data_offsets
        if end > data_size:
            raise SpecserveError(f"{p}: truncated: tensor {name!r} ends at byte {end} of the data "
                                 f"section but only {data_size} bytes are present")
        numel = 1
        for d in info.shape:
            numel *= d
        width = _DTYPE_BYTES.get(info.dtype)
        if width is not None and end - begin != numel * width:
            raise SpecserveError(f"{p}: tensor {name!r} has {end - begin} bytes, expected "
                                 f"{numel * width} for {info.dtype}{list(info.shape)}")
        out[name] = info
    return out


def model_weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of an HF model dir (single file or sharded with an index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SpecserveError(f"{index}: missing or empty 'weight_map'")
        return [model_dir / f for f in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise SpecserveError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                         "(only safetensors weights are accepted)")


def model_tensors(model_dir: Path) -> dict[str, TensorInfo]:
    """Headers of all weight files of an HF model dir, merged."""
    tensors: dict[str, TensorInfo] = {}
    for f in model_weight_files(model_dir):
        tensors.update(read_safetensors_header(f))
    return tensors


def _int_key(cfg: dict[str, Any], key: str, path: Path) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecserveError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    return value


def validate_target(model_dir: str | Path) -> dict[str, Any]:
    """Check an HF decoder checkpoint (architecture, config consistency, weights); return its
    config.json."""
    d = Path(model_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: not a directory")
    cfg_path = d / "config.json"
    cfg = read_json(cfg_path)
    archs = cfg.get("architectures") or []
    if not archs or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise SpecserveError(f"{cfg_path}: architecture {archs[0] if archs else None!r} is not "
                             f"supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    hidden = _int_key(cfg, "hidden_size", cfg_path)
    heads = _int_key(cfg, "num_attention_heads", cfg_path)
    _int_key(cfg, "num_hidden_layers", cfg_path)
    vocab = _int_key(cfg, "vocab_size", cfg_path)
    kv = cfg.get("num_key_value_heads") or heads
    if hidden % heads:
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


def medusa_weights_file(heads_dir: Path) -> Path:
    """The heads' weight file; safetensors preferred, ``.pt`` loaded with weights_only."""
    for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt"):
        if (heads_dir / name).exists():
            return heads_dir / name
    raise SpecserveError(f"{heads_dir}: no medusa_lm_head.safetensors or medusa_lm_head.pt")


def _medusa_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    if weights.suffix == ".safetensors":
        return {k: v.shape for k, v in read_safetensors_header(weights).items()}
    import torch

    try:
        state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is bad input
        raise SpecserveError(f"{weights}: unreadable ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise SpecserveError(f"{weights}: expected a state dict")
    return {str(k): tuple(v.shape) for k, v in state.items()}


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
    if sorted(found) != list(range(n_heads)):
        raise SpecserveError(f"{weights}: holds {len(found)} heads but {cfg_path.name} says "
                             f"medusa_num_heads={n_heads}")
    for h in range(n_heads):
        _check_head(weights, shapes, h, n_layers, hidden, vocab)
    if tree is not None and tree:
        depth = max(len(path) for path in tree)
        if depth > n_heads:
            raise SpecserveError(f"{cfg_path}: medusa_choices depth {depth} exceeds the "
                                 f"{n_heads} heads")
    return MedusaInfo(n_heads, n_layers, hidden, vocab, weights)


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


@dataclass(frozen=True)
class TokenizerFingerprint:
    """Hashes of the parts of a tokenizer that must agree between draft and target."""

    path: Path  # the file that was hashed (tokenizer.json or tokenizer.model)
    vocab_size: int
    vocab_sha256: str
    merges_sha256: str
    special_sha256: str

    @property
    def sha256(self) -> str:
        """One hash over vocab, merges and special tokens."""
        joined = f"{self.vocab_sha256}{self.merges_sha256}{self.special_sha256}"
        return hashlib.sha256(joined.encode()).hexdigest()


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _special_tokens(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = read_json(cfg_path) if cfg_path.exists() else {}
    out: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = cfg.get(key)
        out[key] = value.get("content") if isinstance(value, dict) else value
    return out


def tokenizer_fingerprint(model_dir: str | Path) -> TokenizerFingerprint:
    """Fingerprint the tokenizer saved in ``model_dir`` (fast ``tokenizer.json`` or a
    SentencePiece ``tokenizer.model``)."""
    d = Path(model_dir)
    specials = _special_tokens(d)
    tj = d / "tokenizer.json"
    if tj.exists():
        data = read_json(tj)
        model = data.get("model") or {}
        vocab = model.get("vocab") or {}
        added = sorted((int(t["id"]), str(t["content"]), bool(t.get("special")))
                       for t in data.get("added_tokens") or [])
        ids = [int(i) for i in (vocab.values() if isinstance(vocab, dict) else range(len(vocab)))]
        size = max([*ids, *(a[0] for a in added)], default=-1) + 1
        specials["added_tokens"] = added
        return TokenizerFingerprint(tj, size, _sha(vocab), _sha(model.get("merges") or []),
                                    _sha(specials))
    sp = d / "tokenizer.model"
    if sp.exists():
        digest = hashlib.sha256(sp.read_bytes()).hexdigest()
        return TokenizerFingerprint(sp, -1, digest, digest, _sha(specials))
    raise SpecserveError(f"{d}: no tokenizer.json or tokenizer.model")


def check_tokenizers_match(target_dir: str | Path, draft_dir: str | Path) -> None:
    """Raise unless draft and target share vocab, merges, special tokens and vocab_size."""
    t_dir, d_dir = Path(target_dir), Path(draft_dir)
    t_cfg, d_cfg = t_dir / "config.json", d_dir / "config.json"
    tv, dv = read_json(t_cfg).get("vocab_size"), read_json(d_cfg).get("vocab_size")
    if tv != dv:
        raise SpecserveError(f"{d_cfg}: vocab_size {dv} differs from the target's {tv} ({t_cfg})")
    t, d = tokenizer_fingerprint(t_dir), tokenizer_fingerprint(d_dir)
    if t.path.name != d.path.name:
        raise SpecserveError(f"{d.path}: tokenizer format differs from the target's ({t.path})")
    if t.vocab_size != d.vocab_size:
        raise SpecserveError(f"{d.path}: tokenizer has {d.vocab_size} tokens, the target's "
                             f"({t.path}) has {t.vocab_size}")
    for part, a, b in (("vocab", t.vocab_sha256, d.vocab_sha256),
                       ("merges", t.merges_sha256, d.merges_sha256),
                       ("special tokens", t.special_sha256, d.special_sha256)):
        if a != b:
            raise SpecserveError(f"{d.path}: {part} differ from the target's tokenizer ({t.path})")


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
    elif not any(d.glob("*.bin")) and not any(d.glob("*.pt")):
        raise SpecserveError(f"{d}: no EAGLE weights (*.safetensors, *.bin or *.pt)")
    return cfg
