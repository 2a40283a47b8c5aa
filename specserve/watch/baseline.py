"""The baseline a watch compares with: acceptance rate and tau from a ``specserve bench``
``summary.json`` or a ``specserve doctor --format json`` report (pure; the file read is here).

- bench (``specserve.client.summary``): ``variants[V].engine_counters`` (the server's own
  Prometheus delta over the run: the very series watch reads) when present, else
  ``variants[V].acceptance`` {``acceptance_rate``, ``tau_server``}. ``V`` is ``--variant`` or
  else the one variant that drafted (``spec`` in a paired run).
- doctor (``specserve.doctor.run.doctor``): ``probe`` {``status`` "ran", ``acceptance_rate``,
  ``tau``}: the reference engine's greedy acceptance on built-in prompts.

Anything else, or a file without these figures, is refused with one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.errors import SpecserveError


@dataclass(frozen=True)
class Baseline:
    acceptance_rate: float | None
    tau: float | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance_rate": self.acceptance_rate, "tau": self.tau, "source": self.source}


def _num(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _drafted(v: dict[str, Any]) -> bool:
    acc = v.get("acceptance") or {}
    counters = v.get("engine_counters") or {}
    return bool((_num(acc, "draft_tokens") or 0) > 0 or (_num(counters, "draft_tokens") or 0) > 0)


def from_bench(path: str, d: dict[str, Any], variant: str | None) -> Baseline:
    variants = d["variants"]
    if not isinstance(variants, dict):
        raise SpecserveError(f"{path}: 'variants' is not an object; not a bench summary.json")
    if variant is not None:
        if variant not in variants:
            raise SpecserveError(f"{path}: no variant {variant!r} (has {sorted(variants)})")
        name = variant
    else:
        drafted = sorted(k for k, v in variants.items() if isinstance(v, dict) and _drafted(v))
        if len(drafted) != 1:
            raise SpecserveError(f"{path}: {len(drafted)} variants drafted tokens "
                                 f"({drafted}); name one with --variant")
        name = drafted[0]
    v = variants[name]
    counters = v.get("engine_counters") or {}
    if _num(counters, "acceptance_rate") is not None:
        return Baseline(_num(counters, "acceptance_rate"), _num(counters, "tau"),
                        f"{path}: bench variant {name!r}, {counters.get('source')}")
    acc = v.get("acceptance") or {}
    base = Baseline(_num(acc, "acceptance_rate"), _num(acc, "tau_server"),
                    f"{path}: bench variant {name!r}, acceptance")
    if base.acceptance_rate is None and base.tau is None:
        raise SpecserveError(f"{path}: bench variant {name!r} has no acceptance figures")
    return base


def from_doctor(path: str, d: dict[str, Any]) -> Baseline:
    probe = d["probe"]
    if not isinstance(probe, dict) or probe.get("status") != "ran":
        raise SpecserveError(f"{path}: the doctor report has no acceptance probe (run doctor "
                             "with --probe)")
    return Baseline(_num(probe, "acceptance_rate"), _num(probe, "tau"),
                    f"{path}: doctor probe ({probe.get('prompts')} prompts, "
                    f"{probe.get('tokens')} tokens)")


def read_baseline(path: str, variant: str | None = None) -> Baseline:
    """The baseline in ``path``; SpecserveError for anything that is not one."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecserveError(f"{path}: cannot read the baseline: {e.strerror}") from None
    except ValueError as e:
        raise SpecserveError(f"{path}: not JSON ({e})") from None
    if isinstance(d, dict) and "variants" in d:
        return from_bench(path, d, variant)
    if isinstance(d, dict) and "probe" in d and "findings" in d:
        return from_doctor(path, d)
    raise SpecserveError(f"{path}: neither a specserve bench summary.json ('variants') nor a "
                         "specserve doctor --format json report ('probe', 'findings')")
