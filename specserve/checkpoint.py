"""Reading checkpoints: the file I/O shared by ``specserve build`` and the reference runtime.

Neither :mod:`specserve.build` nor :mod:`specserve.runtime` imports the other; both read
checkpoints through this module (it imports only :mod:`specserve.config`,
:mod:`specserve.errors`, the standard library, and torch/safetensors inside functions). Every
problem a user can cause (a missing, truncated or corrupted file, a tokenizer that differs
between draft and target, a pickled heads file) is one :class:`SpecserveError` line
``<file>: <what is wrong>``. Only local files are read; the model hub is never contacted.

Formats:
- safetensors (https://github.com/huggingface/safetensors#format): 8-byte little-endian header
  length N, an N-byte JSON header ``{name: {dtype, shape, data_offsets}}``, then the data.
- Hugging Face model directories: ``model.safetensors`` or ``model.safetensors.index.json``
  with its shards; ``tokenizer.json`` (fast) or ``tokenizer.model`` (SentencePiece).
- Medusa-1 heads in the FasterDecoding layout (Cai et al. 2024, "Medusa", arXiv:2401.10774):
  ``medusa_lm_head.safetensors`` (preferred) or ``medusa_lm_head.pt``, the latter loaded with
  ``torch.load(weights_only=True)`` only.
- FP8 (E4M3) torch engines: OCP 8-bit floating point (E4M3, max 448), as in Micikevicius et al.
  2022, "FP8 Formats for Deep Learning" (arXiv:2209.05433). Each decoder-layer Linear weight
  W [out, in] is stored as ``q = round_e4m3(W / s)`` with ``s = amax(|W[o, :]|) / 448`` per
  output row, next to ``<name>_scale`` [out] float32 (ModelOpt's ``weight_scale`` naming).
  Embeddings, norms and the LM head stay in the model dtype, matching TensorRT-LLM's FP8
  ``exclude_modules`` (``lm_head``, ``*vocab_embedding``); Medusa heads are never quantized.
  Loading multiplies back (W' = q * s), so the reference decoder sees exactly the rounding an
  FP8 engine's weights would have.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.config import read_json as _read_any_json
from specserve.errors import SpecserveError

if TYPE_CHECKING:
    import torch

MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}
MEDUSA_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """The sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --- JSON and safetensors headers -----------------------------------------------------------

def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, or raise ``<path>: ...`` for a missing or malformed file."""
    data = _read_any_json(path)
    if not isinstance(data, dict):
        raise SpecserveError(f"{path}: expected a JSON object")
    return data


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a safetensors header."""

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


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


# --- model families ---------------------------------------------------------------------------

#: HF ``model_type`` of the decoder families the reference decoder runs and ``specserve build``
#: accepts: the Llama architecture (Touvron et al. 2023, arXiv 2302.13971) with GQA and SwiGLU;
#: Qwen2 adds q/k/v biases; Qwen3 (Yang et al. 2025, "Qwen3 Technical Report", arXiv 2505.09388)
#: drops them and RMS-normalizes each query and key head before RoPE (``q_norm``/``k_norm``), with
#: ``head_dim`` independent of ``hidden_size / num_attention_heads`` (transformers'
#: ``models/qwen3/modeling_qwen3.py``, ``Qwen3Attention``).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: Families whose ``config.json`` may switch sliding-window attention on per layer
#: (``use_sliding_window``, ``sliding_window``, ``max_window_layers``, ``layer_types``).
_PER_LAYER_WINDOW = ("qwen2", "qwen3")


def attention_layer_types(cfg: dict[str, Any]) -> list[str]:
    """Each layer's attention kind as transformers' Qwen2/Qwen3 configs define it: ``layer_types``
    when given, else ``sliding_attention`` for layers ``i >= max_window_layers`` once
    ``use_sliding_window`` sets a ``sliding_window`` (``Qwen3Config.__post_init__``)."""
    given = cfg.get("layer_types")
    if isinstance(given, list):
        return [str(k) for k in given]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    first = int(cfg.get("max_window_layers", 28))
    return ["sliding_attention" if window is not None and i >= first else "full_attention"
            for i in range(int(cfg.get("num_hidden_layers") or 0))]


def check_family(cfg: dict[str, Any], where: Path) -> None:
    """Raise one line unless ``cfg`` (a ``config.json``) is a dense decoder of a supported family
    with full attention on every layer (the reference decoder applies no sliding window)."""
    mtype = cfg.get("model_type")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise SpecserveError(f"{where}: model_type {mtype!r} not supported "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if mtype not in _PER_LAYER_WINDOW:
        return
    kinds = attention_layer_types(cfg)
    other = sorted(set(kinds) - {"full_attention", "sliding_attention"})
    if other:
        raise SpecserveError(f"{where}: layer_types {other} not supported (full_attention only)")
    sliding = [i for i, k in enumerate(kinds) if k == "sliding_attention"]
    if sliding:
        mixed = "mixed with full attention" if len(sliding) < len(kinds) else "on every layer"
        raise SpecserveError(
            f"{where}: sliding-window attention (sliding_window {cfg.get('sliding_window')}) on "
            f"layers {sliding[0]}..{sliding[-1]} of {len(kinds)}, {mixed}, is not supported "
            "(the reference decoder attends over the whole context)")


# --- tensors ----------------------------------------------------------------------------------

def load_safetensors(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, after the header and size checks of
    :func:`read_safetensors_header`."""
    from safetensors.torch import load_file

    read_safetensors_header(path)
    try:
        return load_file(str(path), device=device)
    except Exception as e:  # safetensors raises its own error types
        raise SpecserveError(f"{path}: cannot read safetensors ({_first_line(e)})") from e


def load_pt_state_dict(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A pickled ``.pt`` state dict, loaded with ``weights_only=True`` (never arbitrary code)."""
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError as e:
        raise SpecserveError(f"{path}: not found") from e
    except pickle.UnpicklingError as e:  # torch explains a refusal in six lines: one here
        raise SpecserveError(f"{path}: not loadable with weights_only=True "
                             f"({_weights_only_reason(e)}); save the heads as safetensors") from e
    except Exception as e:  # noqa: BLE001 - any other unpickling failure is bad input
        raise SpecserveError(f"{path}: unreadable ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise SpecserveError(f"{path}: expected a state dict (tensor name -> tensor)")
    return {str(k): v for k, v in state.items()}


def load_tensors(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A ``.safetensors`` file or a weights-only ``.pt`` state dict, by suffix."""
    if path.suffix == ".safetensors":
        return load_safetensors(path)
    return load_pt_state_dict(path, mmap=mmap)


def load_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """The weights of an HF directory (``model.safetensors`` or an indexed set of shards), FP8
    weights of a torch engine dequantized (:func:`dequantize_state_dict`)."""
    out: dict[str, torch.Tensor] = {}
    for f in model_weight_files(Path(model_dir)):
        out.update(load_safetensors(f))
    return dequantize_state_dict(out)


def medusa_weights_file(heads_dir: Path) -> Path:
    """The heads' weight file; safetensors preferred, ``.pt`` loaded with weights_only."""
    for name in MEDUSA_WEIGHT_FILES:
        if (heads_dir / name).exists():
            return heads_dir / name
    raise SpecserveError(f"{heads_dir}: no {' or '.join(MEDUSA_WEIGHT_FILES)}")


def read_medusa_state_dict(heads_dir: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of a Medusa heads directory and the file they came from."""
    weights = medusa_weights_file(heads_dir)
    return load_tensors(weights), weights


def _weights_only_reason(e: BaseException) -> str:
    text = str(e)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it pickles {found.group(1)}, code rather than tensors"
    detail = text.partition("WeightsUnpickler error:")[2]
    lines = [s.strip() for s in detail.splitlines() if s.strip()]
    return f"{lines[0][:120]}: corrupt, or not a torch.save file" if lines else "refused"


def _first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0][:200] if lines else type(e).__name__


# --- tokenizers -------------------------------------------------------------------------------

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


def check_tokenizers_match(target_dir: str | Path, draft_dir: str | Path, *,
                           same_vocab_size: bool = True, why: str = "") -> None:
    """Raise unless draft and target share vocab, merges and special tokens, and (with
    ``same_vocab_size``: where the draft's logits rows are compared with the target's, e.g.
    TensorRT-LLM's ``draft_logits``) the same ``config.json`` ``vocab_size``. Acceptance by
    token ids needs only the tokenizer: Qwen2.5-0.5B (151936 rows) drafts for Qwen2.5-7B
    (152064, padded embeddings) with one tokenizer."""
    t_dir, d_dir = Path(target_dir), Path(draft_dir)
    t_cfg, d_cfg = t_dir / "config.json", d_dir / "config.json"
    tv, dv = read_json(t_cfg).get("vocab_size"), read_json(d_cfg).get("vocab_size")
    if same_vocab_size and tv != dv:
        raise SpecserveError(f"{d_cfg}: vocab_size {dv} differs from the target's {tv} ({t_cfg})"
                             + (f"; {why}" if why else ""))
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


# --- FP8 (E4M3) weights with per-output-channel scales ---------------------------------------

FP8_MAX = 448.0  # largest finite float8_e4m3fn
SCALE_SUFFIX = "_scale"
_QUANTIZED = re.compile(r"\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")


def is_quantized_weight(name: str) -> bool:
    """True for the decoder-layer Linear weights that FP8 stores in E4M3."""
    return _QUANTIZED.search(name) is not None


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q [out, in] float8_e4m3fn, scale [out] float32)."""
    import torch

    w32 = w.float()
    scale = (w32.abs().amax(dim=1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # [out]
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # [out, in]
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [out, in] e4m3, scale [out] -> float32 [out, in]."""
    return q.float() * scale.float()[:, None]


def quantize_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every decoder-layer Linear weight by its E4M3 copy plus a ``_scale`` tensor."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if is_quantized_weight(name) and t.dim() == 2:
            out[name], out[name + SCALE_SUFFIX] = quantize_per_channel(t)
        else:
            out[name] = t
    return out


def dequantize_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`quantize_state_dict` (float32 weights); other tensors unchanged."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in sd:
            continue
        scale = sd.get(name + SCALE_SUFFIX)
        out[name] = dequantize(t, scale) if t.dtype == torch.float8_e4m3fn and scale is not None \
            else t
    return out
