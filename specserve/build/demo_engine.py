"""``specserve engine`` (what ``make engine`` runs): the engine for a ``specserve demo-model``
checkpoint, built with the method its ``eval.json`` measured fastest, and reused when up to date.

This was a program in Make functions (the Makefile's old ``engine`` target); the
same rules, as plain functions:

- Method: ``method`` when given; else draft / EAGLE-3 / Medusa when that directory is given, or
  Medusa for a model other than the checkpoint's target; else ``fastest``: eval.json's
  ``fastest_method`` when it is draft, eagle3 or ngram, Medusa otherwise (it records
  ``medusa``/``medusa_tuned``, or nothing, or there is no eval.json). A directory the method
  does not use is refused, never ignored.
- Defaults: K = 4 for draft, EAGLE-3 and n-gram (``train/decoder_eval.py`` measured them at
  K = 4); the torch engine's Medusa tree is the checkpoint's tuned ``medusa_tree_cpu.json``
  (the 63-node default costs more than it saves on CPU) when the heads are the checkpoint's;
  the checkpoint's draft on the torch backend proposes from its last 64 keys (``--draft-window``);
  dtype float32 on the torch backend (the dtype ``eval.json``'s decoder eval measured, so the
  demo's served tau compares like with like; float16 matmuls over many tree tokens are very
  slow on CPU) and float16 on TensorRT-LLM; ``auto`` asks :mod:`specserve.cpu_dtype`.
- Reuse: when ``OUT/build_config.json`` records the same resolved options, input hashes and
  package versions (:func:`specserve.build.uptodate.is_up_to_date`); otherwise a rebuild that
  replaces OUT (only a directory ``specserve build`` wrote).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.build.builder import build_engine, resolve_backend, resolve_dtype
from specserve.build.config import BuildConfig
from specserve.build.uptodate import is_up_to_date
from specserve.config import JsonConfig, read_json
from specserve.errors import SpecserveError

METHODS = ("fastest", "medusa", "draft", "eagle3", "ngram")
SERVED = ("draft", "eagle3", "ngram")  # fastest_method values built as such; others: medusa
DRAFT_LEN = 4
# the checkpoint's draft (distilled on 128-token windows) proposes from its last 64 keys on the
# torch backend: 1.07-1.17x tok/s at c = 16 on builtin, 256- and 512-token prompts, acceptance
# equal or higher (docs/results.md, "Against vLLM-CPU")
DEMO_DRAFT_WINDOW = 64
TUNED_TREE = "medusa_tree_cpu.json"
BACKENDS = ("torch", "trtllm", "auto")


@dataclass(frozen=True)
class EngineRequest(JsonConfig):
    """``specserve engine``'s inputs; ``None`` (or ``""``) means "not given"."""

    checkpoint: str = "checkpoints/demo"  # demo-model output: target/, medusa/, ..., eval.json
    model: str | None = None
    medusa: str | None = None
    draft: str | None = None
    eagle3: str | None = None
    method: str | None = None
    backend: str = "torch"
    dtype: str | None = None
    out: str = "engines/demo"

    def given(self, name: str) -> str | None:
        value: str | None = getattr(self, name)
        return value or None

    def default_dir(self, part: str) -> str:
        return str(Path(self.checkpoint) / part)


def fastest_method(eval_data: dict[str, Any] | None) -> str:
    """What ``fastest`` builds: eval.json's draft/eagle3/ngram, else Medusa."""
    m = (eval_data or {}).get("fastest_method")
    return m if m in SERVED else "medusa"


def choose_method(req: EngineRequest, eval_data: dict[str, Any] | None) -> str:
    """The method to build (pure): see the module docstring."""
    method = req.given("method")
    dirs = [n for n in ("medusa", "draft", "eagle3") if req.given(n)]
    if method is None:
        if len(dirs) > 1:
            raise SpecserveError(f"engine: give at most one of --medusa, --draft, --eagle3 "
                                 f"(got {', '.join(dirs)}), or --method")
        other_model = req.given("model") not in (None, req.default_dir("target"))
        method = dirs[0] if dirs else "medusa" if other_model else "fastest"
    if method not in METHODS:
        raise SpecserveError(f"engine: --method {method!r}: choose one of {', '.join(METHODS)}")
    spec = fastest_method(eval_data) if method == "fastest" else method
    unused = [d for d in dirs if d != spec]
    if unused:
        raise SpecserveError(f"engine: --{unused[0]} is not used by method {spec}"
                             + (" (eval.json's fastest)" if method == "fastest" else ""))
    return spec


def _tuned_tree(req: EngineRequest, medusa_dir: str,
                backend: str) -> tuple[tuple[int, ...], ...] | None:
    path = Path(req.checkpoint) / TUNED_TREE
    if backend != "torch" or not path.is_file() \
            or Path(medusa_dir).resolve() != Path(req.default_dir("medusa")).resolve():
        return None
    from specserve.spec.tree import MedusaTree

    data = read_json(path)
    try:
        return MedusaTree.from_choices([tuple(p) for p in data]).choices
    except (SpecserveError, TypeError) as e:
        raise SpecserveError(f"{path}: not a Medusa tree ({e})") from e


def build_config(req: EngineRequest, spec: str, dtype: str, backend: str) -> BuildConfig:
    """The ``specserve build`` config for method ``spec`` with the demo's defaults."""
    model = req.given("model") or req.default_dir("target")
    parts: dict[str, Any] = {}
    if spec == "medusa":
        medusa = req.given("medusa") or req.default_dir("medusa")
        parts = {"medusa": medusa, "medusa_choices": _tuned_tree(req, medusa, backend)}
    elif spec == "draft":
        parts = {"draft": req.given("draft") or req.default_dir("draft")}
        if backend == "torch" and not req.given("draft"):
            parts["draft_window"] = DEMO_DRAFT_WINDOW
    elif spec == "eagle3":
        parts = {"eagle3": req.given("eagle3") or req.default_dir("eagle3"),
                 "max_draft_len": DRAFT_LEN}
    else:
        parts = {"max_draft_len": DRAFT_LEN}
    flow = "pytorch" if backend == "trtllm" and spec == "eagle3" else "engine"
    return BuildConfig(model=model, out=req.out, spec_mode=spec, backend=backend, flow=flow,
                       dtype=dtype, **parts)


def read_eval(req: EngineRequest) -> dict[str, Any] | None:
    path = Path(req.checkpoint) / "eval.json"
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict):
        raise SpecserveError(f"{path}: expected a JSON object")
    return data


def make_engine(req: EngineRequest) -> dict[str, Any]:
    """Pick the method, then reuse ``req.out`` when up to date or build it (replacing it)."""
    if req.backend not in BACKENDS:
        raise SpecserveError(f"engine: --backend {req.backend!r}: choose one of "
                             f"{', '.join(BACKENDS)}")
    spec = choose_method(req, read_eval(req))
    backend = resolve_backend(req.backend)
    dtype, choice = resolve_dtype(req.given("dtype")
                                  or ("float32" if backend == "torch" else "float16"), backend)
    cfg = build_config(req, spec, dtype, backend)
    planned = build_engine(cfg, dry_run=True, force=True)
    if is_up_to_date(planned):
        return {"method": spec, "reused": True, "out": cfg.out, "config": planned["config"]}
    built = build_engine(cfg, force=True, dtype_choice=choice)
    return {"method": spec, "reused": False, "out": cfg.out, "config": built["config"],
            "build_config": built["build_config"]}
