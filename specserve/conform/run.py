"""``specserve conform`` as a library call: :func:`run_conform` opens both targets, runs the
chosen checks in the order given (default: their numbered order) within a time budget (a check that
would start with no budget left is "not run"), writes each non-pass check's evidence to
``OUT/evidence/CHECK.json`` and the matrix to ``OUT/matrix.json`` / ``OUT/matrix.md``, and
returns the report."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specserve.config import write_json_atomic, write_text_atomic
from specserve.conform.checks import ORDER, REGISTRY, Context, Outcome, Settings
from specserve.conform.checks.base import NOT_RUN
from specserve.conform.matrix import Row, counts, markdown, summary
from specserve.conform.probe import NotExpressible
from specserve.conform.targets import ServerInfo, Target, make_target
from specserve.errors import SpecserveError

MIN_CHECK_S = 5.0   # no check starts with less budget than this


@dataclass(frozen=True)
class ConformConfig:
    """One conformance run (a field per CLI option)."""

    url: str
    protocol: str
    model: str
    out: Path
    baseline_url: str | None = None
    baseline_model: str | None = None
    checks: tuple[str, ...] = ORDER
    budget_s: float = 1800.0
    method: str = "unknown"
    engine: str | None = None          # default: what the server says (owned_by / "triton")
    engine_version: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict, hash=False)
    num_draft_tokens: int | None = None   # Triton: the speculative model's num_draft_tokens
    settings: Settings = field(default_factory=Settings)

    def validate(self) -> None:
        if self.protocol not in ("openai", "grpc", "http"):
            raise SpecserveError(f"--protocol {self.protocol!r}: expected openai, grpc or http")
        if self.baseline_url is None and self.baseline_model is None:
            raise SpecserveError("give --baseline-url PLAIN or --baseline-model NAME (the "
                                 "no-speculation baseline)")
        unknown = [c for c in self.checks if c not in REGISTRY]
        if unknown:
            raise SpecserveError(f"--checks: unknown check {unknown[0]!r} (known: "
                                 f"{', '.join(ORDER)})")
        if self.budget_s <= 0:
            raise SpecserveError(f"--budget-s must be positive, got {self.budget_s:g}")
        if self.extra_body and self.protocol != "openai":
            raise SpecserveError("--extra-body is for --protocol openai")
        if self.num_draft_tokens is not None and self.protocol == "openai":
            raise SpecserveError("--num-draft-tokens is for --protocol grpc/http "
                                 "(tensorrt_llm_bls)")


def _targets(cfg: ConformConfig) -> tuple[Target, Target]:
    spec = make_target(cfg.protocol, cfg.url, cfg.model, cfg.extra_body, cfg.num_draft_tokens)
    base = make_target(cfg.protocol, cfg.baseline_url or cfg.url,
                       cfg.baseline_model or cfg.model, cfg.extra_body)
    return spec, base


async def _info(t: Target, what: str) -> ServerInfo:
    try:
        return await t.info()
    except SpecserveError as e:
        raise SpecserveError(f"{what} {t.url} ({t.protocol}): {e}") from None
    except Exception as e:  # noqa: BLE001 - one line, never a traceback
        raise SpecserveError(f"{what} {t.url} ({t.protocol}): cannot reach it "
                             f"({type(e).__name__}: {e})") from None


async def _run_one(ctx: Context, name: str) -> Outcome:
    fn = REGISTRY[name].fn
    try:
        return await asyncio.wait_for(fn(ctx), max(ctx.time_left(), 0.1))
    except TimeoutError:
        return Outcome(NOT_RUN, "the time budget ran out during the check")
    except NotExpressible as e:
        return Outcome("refused", f"not expressible: {e}")
    except Exception as e:  # noqa: BLE001 - an answer the checks could not read
        return Outcome("broken", f"unreadable answer ({type(e).__name__}: {e})")


def _evidence_path(out: Path, name: str, outcome: Outcome) -> str | None:
    if outcome.evidence is None:
        return None
    path = out / "evidence" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"check": name, "verdict": outcome.verdict,
                             "detail": outcome.detail, **outcome.evidence})
    return str(path.relative_to(out))


async def _run(cfg: ConformConfig, on_check: Callable[[str, int], None]) -> list[Row]:
    spec, base = _targets(cfg)
    try:
        info = await _info(spec, "speculative server")
        await _info(base, "baseline")
        ctx = Context(spec, base, cfg.settings, context_limit=info.context_limit)
        t_end = time.monotonic() + cfg.budget_s
        date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        rows = []
        for i, name in enumerate(dict.fromkeys(cfg.checks)):
            on_check(name, i)
            t0 = time.monotonic()
            if t_end - t0 < MIN_CHECK_S:
                outcome = Outcome(NOT_RUN, "no time budget left")
            else:
                ctx.deadline = t_end
                outcome = await _run_one(ctx, name)
            rows.append(Row(cfg.engine or info.engine, cfg.engine_version or info.version,
                            cfg.method, cfg.protocol, name, REGISTRY[name].group,
                            outcome.verdict, outcome.detail,
                            _evidence_path(cfg.out, name, outcome), date,
                            round(time.monotonic() - t0, 1)))
        return rows
    finally:
        await spec.close()
        await base.close()


def run_conform(cfg: ConformConfig, progress: bool = False) -> dict[str, Any]:
    """Run the checks; write ``OUT/matrix.json``, ``OUT/matrix.md``; return the report."""
    cfg.validate()
    cfg.out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(cfg.checks))
    for name in names:   # no stale evidence of an earlier run beside this run's matrix
        (cfg.out / "evidence" / f"{name}.json").unlink(missing_ok=True)
    bar, advance = _progress(len(names), progress)
    try:
        rows = asyncio.run(_run(cfg, advance))
    finally:
        if bar is not None:
            bar.stop()
    report = {"url": cfg.url, "baseline_url": cfg.baseline_url or cfg.url,
              "model": cfg.model, "baseline_model": cfg.baseline_model or cfg.model,
              "counts": counts(rows), "rows": [r.to_dict() for r in rows],
              "summary": summary(rows)}
    write_json_atomic(cfg.out / "matrix.json", report)
    write_text_atomic(cfg.out / "matrix.md", markdown(rows))
    return report


def _progress(total: int, enabled: bool) -> tuple[Any, Callable[[str, int], None]]:
    if not enabled:
        return None, lambda name, i: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("conform {task.fields[check]:<18}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), transient=True,
                   console=Console(stderr=True))
    task = bar.add_task("conform", total=total, check="")
    bar.start()

    def advance(name: str, i: int) -> None:
        bar.update(task, completed=i, check=name)
    return bar, advance
