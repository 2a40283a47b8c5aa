"""The reference (``torch``) engine: validated weights re-saved in the build dtype, optional FP8
emulation (:func:`specserve.checkpoint.quantize_state_dict`), plus the heads or draft and the
tokenizer.

Layout (docs/architecture.md): ``target/`` and ``draft/`` are Hugging Face directories
(``config.json``, ``model.safetensors``, tokenizer files), ``medusa/`` the FasterDecoding layout
(``config.json`` + ``medusa_lm_head.safetensors``), ``tokenizer/`` the tokenizer alone. Writes are
deterministic (sorted keys, fixed metadata, no timestamps), so a rebuild is byte-identical.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from specserve.build.config import BuildConfig
from specserve.build.validate import MedusaInfo
from specserve.checkpoint import load_state_dict, load_tensors, quantize_state_dict, read_json
from specserve.config import write_json_atomic
from specserve.errors import SpecserveError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "chat_template.jinja")
MODEL_EXTRA_FILES = ("generation_config.json",)
FP8_CONFIG_KEY = "specserve_quantization"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _save(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, str(path),
              metadata={"format": "pt"})


def cast_state_dict(sd: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """Floating tensors to the build dtype; integer tensors unchanged."""
    dtype = _torch_dtype(dtype_name)
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of ``src`` into ``dst``; at least tokenizer.json or .model."""
    dst.mkdir(parents=True, exist_ok=True)
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not {"tokenizer.json", "tokenizer.model"} & set(copied):
        raise SpecserveError(f"{src}: no tokenizer.json or tokenizer.model to copy")
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    return copied


def write_model(src: Path, dst: Path, dtype: str, fp8: bool) -> None:
    """An HF model dir re-saved as one ``model.safetensors`` in ``dtype`` (FP8 weights +
    per-channel scales when ``fp8``), with its config and tokenizer."""
    dst.mkdir(parents=True)
    sd = cast_state_dict(load_state_dict(src), dtype)
    if fp8:
        sd = quantize_state_dict(sd)
    _save(sd, dst / "model.safetensors")
    cfg = read_json(src / "config.json")
    cfg["torch_dtype"] = dtype
    if "dtype" in cfg:
        cfg["dtype"] = dtype
    if fp8:
        cfg[FP8_CONFIG_KEY] = {"quant_algo": "FP8_PER_CHANNEL", "weight_dtype": "float8_e4m3fn",
                               "scale_suffix": "_scale", "excluded": ["embed_tokens", "norm",
                                                                      "lm_head"]}
    write_json_atomic(dst / "config.json", cfg)
    for name in MODEL_EXTRA_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    copy_tokenizer(src, dst)


def write_medusa(src: Path, dst: Path, info: MedusaInfo, dtype: str) -> None:
    """Medusa heads in ``dtype`` (never FP8, like TensorRT-LLM) as safetensors + config."""
    dst.mkdir(parents=True)
    sd = load_tensors(info.weights)
    _save(cast_state_dict(sd, dtype), dst / "medusa_lm_head.safetensors")
    cfg = read_json(src / "config.json")
    cfg.update({"medusa_num_heads": info.num_heads, "medusa_num_layers": info.num_layers,
                "hidden_size": info.hidden_size, "vocab_size": info.vocab_size})
    write_json_atomic(dst / "config.json", cfg)


def write_eagle3(src: Path, dst: Path, dtype: str) -> None:
    """An EAGLE-3 head in ``dtype`` (never FP8), in the portable layout (checked against the
    target by :func:`specserve.build.validate.validate_eagle3`)."""
    dst.mkdir(parents=True)
    sd = load_tensors(src / "model.safetensors")
    maps: dict[str, Any] = {k: sd.pop(k) for k in ("d2t", "t2d") if k in sd}  # int, bool
    _save({**cast_state_dict(sd, dtype), **maps}, dst / "model.safetensors")
    cfg = read_json(src / "config.json")
    cfg["torch_dtype"] = dtype
    write_json_atomic(dst / "config.json", cfg)


def write_torch_engine(cfg: BuildConfig, stage: Path, medusa: MedusaInfo | None) -> list[str]:
    """Write every part of a torch engine into ``stage``; return the parts written."""
    fp8 = cfg.quantize == "fp8"
    write_model(Path(cfg.model), stage / "target", cfg.dtype, fp8)
    parts = ["target"]
    if cfg.spec_mode == "medusa":
        assert cfg.medusa is not None and medusa is not None
        write_medusa(Path(cfg.medusa), stage / "medusa", medusa, cfg.dtype)
        parts.append("medusa")
    if cfg.spec_mode == "draft":
        assert cfg.draft is not None
        write_model(Path(cfg.draft), stage / "draft", cfg.dtype, fp8)
        parts.append("draft")
    if cfg.spec_mode == "eagle3":
        assert cfg.eagle3 is not None
        write_eagle3(Path(cfg.eagle3), stage / "eagle3", cfg.dtype)
        parts.append("eagle3")
    copy_tokenizer(Path(cfg.model), stage / "tokenizer")
    return [*parts, "tokenizer"]
