"""Runtime checks of local Hugging Face checkpoints and loading of FasterDecoding Medusa heads.

Everything a user can get wrong about a checkpoint directory (missing or corrupted files, a vocab
that differs between target and draft, Medusa heads of the wrong shape) becomes one
:class:`SpecserveError` line naming the file and the mismatch. Only local files are read
(safetensors; ``.pt`` heads with ``weights_only=True``); the model hub is never contacted.

File reading (safetensors headers and tensors, FP8 dequantization, the tokenizer match,
weights-only ``.pt`` loading) is :mod:`specserve.checkpoint`, shared with ``specserve build``;
this module adds what only the decoder needs (``model_type`` support, heads shaped for the
target). Formats: the Medusa-1 heads layout of FasterDecoding/Medusa
(``{h}.{l}.linear.weight|bias``, ``{h}.{num_layers}.weight``) that TensorRT-LLM's
``examples/medusa/convert_checkpoint.py`` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specserve.checkpoint import check_family, read_json, read_medusa_state_dict
from specserve.errors import SpecserveError

if TYPE_CHECKING:
    from specserve.runtime.medusa import MedusaHeads

def load_target_config(model_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of a Llama/Mistral/Qwen2/Qwen3 causal LM directory, checked for what we
    run (:func:`specserve.checkpoint.check_family`: the family, full attention on every layer)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: model directory not found")
    cfg = read_json(d / "config.json")
    check_family(cfg, d / "config.json")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            raise SpecserveError(f"{d / 'config.json'}: missing or invalid {key!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise SpecserveError(f"{d / 'config.json'}: hidden_act {act!r} not supported (silu)")
    return cfg


def load_medusa_heads(heads_dir: str | Path, hidden_size: int, vocab_size: int) -> MedusaHeads:
    """Medusa-1 heads from a FasterDecoding-layout directory, checked against the target."""
    from specserve.runtime.medusa import MedusaHeads

    d = Path(heads_dir)
    if not d.is_dir():
        raise SpecserveError(f"{d}: Medusa heads directory not found")
    cfg = read_json(d / "config.json")
    n_heads, n_layers = cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers", 1)
    if not isinstance(n_heads, int) or n_heads <= 0 or not isinstance(n_layers, int) \
            or n_layers < 0:
        raise SpecserveError(
            f"{d / 'config.json'}: needs positive integer 'medusa_num_heads' and "
            f"'medusa_num_layers'")
    sd, src = read_medusa_state_dict(d)
    expect: dict[str, tuple[int, ...]] = {}
    for h in range(n_heads):
        for layer in range(n_layers):
            expect[f"{h}.{layer}.linear.weight"] = (hidden_size, hidden_size)
            expect[f"{h}.{layer}.linear.bias"] = (hidden_size,)
        expect[f"{h}.{n_layers}.weight"] = (vocab_size, hidden_size)
    for name, shape in expect.items():
        if name not in sd:
            raise SpecserveError(f"{src}: missing tensor {name!r}")
        got = tuple(sd[name].shape)
        if got != shape:
            what = "vocab size" if name.endswith(f"{n_layers}.weight") and got[1:] == shape[1:] \
                else "hidden size"
            raise SpecserveError(
                f"{src}: tensor {name!r} has shape {list(got)}, expected {list(shape)} "
                f"({what} mismatch with the target)")
    return MedusaHeads.from_state_dict(sd, n_heads, n_layers)

