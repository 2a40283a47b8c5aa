"""Where a verify step's time goes on the real model, and plain decoding's share of the
measured read bandwidth (the profile mode of ``benchmarks/verify_cost.py``).

Same setup as ``verify_cost.py`` (its prompts; an oracle proposer fed the model's own greedy
continuation, so every draft is accepted; one torch thread), for each batch B and draft length
K (K = 0: plain decoding). Only decode steps count (``SpecDecoder._step``, wrapped here; the
prefill is left out). Per batch, two passes over the K values: one unprofiled, timing each step
(the step cost over plain decoding's at the same batch, in the thread's CPU time, which other
jobs on a shared machine move far less than wall time), then one under ``torch.profiler``.
The benchmark (never the product) wraps the one C call that runs a forward's layers for up to
16 rows (``cpu_layer.layers``: linears, attention, norms and rotary together, "C layers"), the
C element-wise kernels of larger forwards (``cpu_layer.rms`` ...: norms+rotary, with
``cpu_forward.attend``: attention), every call of ``linear`` (the model's and ``cpu_forward``'s;
the few-row C kernel runs through ``ctypes``: no ATen op, so its time is the wrapper's own),
``Transformer.logits`` (the LM head; the ``linear`` inside it counted there), ``_attention``,
``_rms_norm``, the verification (``step.pick``, ``step.verify_chain``) and the proposer: in the
timed pass in ``time.perf_counter`` spans, each span's time less its nested spans'; in the
profiled pass in ``record_function`` ranges, each event's self time going to the innermost
range around it. The shares are the timed pass's spans over the step's wall time, the
``_attention`` span (less its linears) split into attention (KV writes, the C attention kernel
or SDPA) and rotary (its ``mul``, ``add``, ``roll`` ops, counted with the norms), and the time
in no span into other ATen ops (embedding, step inputs, token tensors; ``sampling`` ops of
``profile_step.py``'s groups count as verification) and Python (the interpreter, bookkeeping),
in the profiled pass's proportions (whose Python includes the profiler's own cost, so that
split leans to Python). Both passes' shares are in the JSON.

Bandwidth share: at batch 1, K = 0, the model's parameter bytes (``model.parameters()``: the
embedding tied to the LM head counted once) x decode steps per second, over the read bandwidth
of ``specserve doctor --roofline``'s probe (:func:`specserve.doctor.roofline.measure`), probed
before, between and after two decode timings; each timing against the mean of its two probes.

    .venv/bin/python benchmarks/verify_profile.py --batches 1,4,8 --ks 1,2,4,7 --tokens 32 \
        [--prompt-tokens 64] [--no-bandwidth | --bandwidth-only]

Shares and ratios, not absolute times, are the result: a shared machine moves the totals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function
from torch.profiler import profile as torch_profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from profile_step import group_of  # noqa: E402
from verify_cost import _prompts, oracle_args  # noqa: E402

CATEGORIES = ("C layers", "linears", "lm head", "attention", "norms+rotary", "verify",
              "other aten", "python")
RANGES = {"sp.layers": "C layers", "sp.linear": "linears", "sp.lm_head": "lm head",
          "sp.attention": "attention", "sp.norm": "norms+rotary", "sp.verify": "verify",
          "sp.proposer": "proposer"}
ROTARY_OPS = ("aten::mul", "aten::add", "aten::roll")
STEP = "sp.step"


class Clock:
    """Exclusive wall time per category of nested wrapped calls (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self._inner: list[float] = []  # per open call: its children's time so far
        self.on = False  # inside a decode step: spans elsewhere (the prefill) are not kept

    @contextmanager
    def span(self, cat: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            inner = self._inner.pop()
            self.acc[cat] = self.acc.get(cat, 0.0) + dt - inner
            if self._inner:
                self._inner[-1] += dt


def _ranged(fn: Callable[..., Any], name: str, clock: Clock | None) -> Callable[..., Any]:
    """``fn`` in a ``record_function`` range (profiled pass) or a clock span (timed pass)."""
    def wrapper(*a: Any, **kw: Any) -> Any:
        with record_function(name) if clock is None else clock.span(RANGES[name]):
            return fn(*a, **kw)
    return wrapper


def _linear_ranged(fn: Callable[..., Any], head: list[bool], clock: Clock | None
                   ) -> Callable[..., Any]:
    """The model's ``linear`` in an ``sp.linear`` range, except inside the LM head."""
    ranged = _ranged(fn, "sp.linear", clock)

    def wrapper(*a: Any, **kw: Any) -> Any:
        return fn(*a, **kw) if head[0] else ranged(*a, **kw)
    return wrapper


def _head_ranged(fn: Callable[..., Any], head: list[bool], clock: Clock | None
                 ) -> Callable[..., Any]:
    ranged = _ranged(fn, "sp.lm_head", clock)

    def wrapper(*a: Any, **kw: Any) -> Any:
        head[0] = True
        try:
            return ranged(*a, **kw)
        finally:
            head[0] = False
    return wrapper


@contextmanager
def patched(targets: list[tuple[Any, str, Callable[[Any], Any]]]) -> Iterator[None]:
    """Set ``obj.name = make(obj.name)`` for each target; restored on exit."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    try:
        for obj, name, make in targets:
            setattr(obj, name, make(getattr(obj, name)))
        yield
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


def profile_ranges(proposer: Any, clock: Clock | None = None
                   ) -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """The benchmark-side wrappers: ``record_function`` ranges, or ``clock``'s spans."""
    from specserve.runtime import cpu_forward, cpu_layer, step
    from specserve.runtime import model as m

    head = [False]
    out: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (m, "linear", lambda f: _linear_ranged(f, head, clock)),
        (cpu_forward, "linear", lambda f: _linear_ranged(f, head, clock)),
        (m.Transformer, "logits", lambda f: _head_ranged(f, head, clock)),
        (m, "_attention", lambda f: _ranged(f, "sp.attention", clock)),
        (m, "_rms_norm", lambda f: _ranged(f, "sp.norm", clock)),
        (cpu_forward, "attend", lambda f: _ranged(f, "sp.attention", clock)),
        (cpu_layer, "layers", lambda f: _ranged(f, "sp.layers", clock)),
        *((cpu_layer, name, lambda f: _ranged(f, "sp.norm", clock))
          for name in ("rms", "add_rms", "rope_kv", "silu_mul")),
        (step, "pick", lambda f: _ranged(f, "sp.verify", clock)),
        (step, "verify_chain", lambda f: _ranged(f, "sp.verify", clock))]
    if proposer is not None:
        out.append((proposer, "get_proposal", lambda f: _ranged(f, "sp.proposer", clock)))
    return out


def step_timer(times: list[float], clock: Clock | None = None, cpu: list[float] | None = None
               ) -> list[tuple[Any, str, Callable[[Any], Any]]]:
    """Wrap ``SpecDecoder._step``: its wall time into ``times`` (its thread's CPU time into
    ``cpu``), inside an ``sp.step`` range (and with ``clock`` on)."""
    from specserve.runtime.decoder import SpecDecoder

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **kw: Any) -> Any:
            if clock is not None:
                clock.on = True
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                with record_function(STEP):
                    return fn(*a, **kw)
            finally:
                times.append(time.perf_counter() - t0)
                if cpu is not None:
                    cpu.append(time.thread_time() - c0)
                if clock is not None:
                    clock.on = False
        return wrapper
    return [(SpecDecoder, "_step", make)]


def _category(ev: Any) -> str | None:
    """The category of one profiler event's self time (None: not in a step, or not counted)."""
    label, in_step, in_attention, node = None, False, False, ev
    while node is not None:
        if node.name == STEP:
            in_step = True
        elif label is None and node.name in RANGES:
            label = RANGES[node.name]
        in_attention = in_attention or node.name == "sp.attention"
        node = node.cpu_parent
    if not in_step or ev.name == STEP:
        return None
    if label == "attention" and ev.name in ROTARY_OPS:
        return "rotary"
    if label is not None:
        return label
    if ev.name.startswith(("aten::", "mkldnn::")):
        return "verify" if group_of(ev.name) == "sampling" else "other aten"
    return None


def shares(events: Any, wall: float) -> dict[str, float]:
    """Share of ``wall`` per profiled category (rotary apart from norms), from the events."""
    acc: dict[str, float] = {c: 0.0 for c in (*RANGES.values(), "rotary", "other aten")}
    for ev in events:
        cat = _category(ev)
        if cat is not None:
            acc[cat] += ev.self_cpu_time_total / 1e6
    acc["python"] = max(0.0, wall - sum(acc.values()))
    return {c: round(v / wall, 4) for c, v in acc.items()}


def _split(total: float, a: float, b: float) -> tuple[float, float]:
    """``total`` split in the proportion a : b (all to b when both are 0)."""
    part = total * a / (a + b) if a + b > 0 else 0.0
    return part, total - part


def combined(clock: dict[str, float], wall: float, prof: dict[str, float]) -> dict[str, float]:
    """The table's shares: the timed pass's clock spans, with the attention span split into
    attention and rotary, and the time outside all spans into other ATen and Python, in the
    profiled pass's proportions."""
    att, rot = _split(clock.get("attention", 0.0), prof["attention"], prof["rotary"])
    rest = max(0.0, wall - sum(clock.values()))
    aten, py = _split(rest, prof["other aten"], prof["python"])
    out = {"C layers": clock.get("C layers", 0.0), "linears": clock.get("linears", 0.0),
           "lm head": clock.get("lm head", 0.0),
           "attention": att, "norms+rotary": clock.get("norms+rotary", 0.0) + rot,
           "verify": clock.get("verify", 0.0), "other aten": aten, "python": py,
           "proposer": clock.get("proposer", 0.0)}
    return {c: round(v / wall, 4) for c, v in out.items()}


def _generate(dec: Any, prompts: list[list[int]], tokens: int) -> None:
    from specserve.runtime.params import SamplingParams

    dec.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0))


def timed_steps(dec: Any, prompts: list[list[int]], tokens: int, clock: Clock | None = None
                ) -> tuple[float, int, float]:
    """Decode steps' total wall time, count and thread CPU time in one ``generate`` (the
    prefill left out); ``clock``: also time the wrapped calls into it."""
    times: list[float] = []
    cpu: list[float] = []
    spans = [] if clock is None else profile_ranges(dec.proposer, clock)
    with patched(step_timer(times, clock, cpu) + spans):
        _generate(dec, prompts, tokens)
    return sum(times), len(times), sum(cpu)


def profiled_steps(dec: Any, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """One profiled ``generate``: shares of its decode steps' wall time."""
    times: list[float] = []
    with patched(step_timer(times) + profile_ranges(dec.proposer)):
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            _generate(dec, prompts, tokens)
    wall = sum(times)
    return {"profiled_step_ms": round(1e3 * wall / len(times), 2),
            "profiled_shares": shares(prof.events(), wall)}


def decoders(model: Any, prompts: list[list[int]], ks: list[int], tokens: int) -> dict[int, Any]:
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.params import SamplingParams
    from specserve.runtime.proposers.oracle import OracleProposer

    plain = SpecDecoder(model)
    refs = [p + list(r.token_ids) for p, r in zip(
        prompts, plain.generate(prompts, SamplingParams(max_tokens=tokens)), strict=True)]
    return {k: plain if k == 0 else SpecDecoder(model, OracleProposer(refs, k)) for k in ks}


def run_batch(model: Any, prompts: list[list[int]], ks: list[int], tokens: int
              ) -> dict[str, Any]:
    """Both passes at one batch: the step cost over plain, then the profile."""
    decs = decoders(model, prompts, ks, tokens)  # its plain run is the warm-up
    timed: dict[int, tuple[float, int, float, Clock]] = {}
    for k in ks:
        clock = Clock()
        timed[k] = (*timed_steps(decs[k], prompts, tokens, clock), clock)
    plain_wall, plain_cpu = (timed[0][0] / timed[0][1], timed[0][2] / timed[0][1])
    rows = {}
    for k in ks:
        wall, steps, cpu, clock = timed[k]
        prof = profiled_steps(decs[k], prompts, tokens)
        rows[k] = {"batch": len(prompts), "k": k, "step_ms": round(1e3 * wall / steps, 2),
                   "step_cpu_ms": round(1e3 * cpu / steps, 2),
                   "step_over_plain": round(cpu / steps / plain_cpu, 3),
                   "wall_step_over_plain": round(wall / steps / plain_wall, 3),
                   "shares": combined(clock.acc, wall, prof["profiled_shares"]), **prof}
    return {f"B={len(prompts)} K={k}": r for k, r in rows.items()}


def bandwidth_share(model: Any, prompt: list[int], tokens: int, size_mb: int
                    ) -> dict[str, Any]:
    """Plain decoding at batch 1: parameter bytes x steps/s over the probe's read bandwidth,
    probes and decode timings alternated (probe, decode, probe, decode, probe)."""
    from specserve.doctor.roofline import measure
    from specserve.runtime.decoder import SpecDecoder

    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once
    dec = SpecDecoder(model)
    _generate(dec, [prompt], 4)  # warm-up
    probes, decode = [measure(size_mb).read_gbs], []
    for _ in range(2):
        wall, steps, _ = timed_steps(dec, [prompt], tokens)
        decode.append(nbytes * steps / wall / 1e9)
        probes.append(measure(size_mb).read_gbs)
        torch.set_num_threads(1)
    pairs = [d / ((probes[i] + probes[i + 1]) / 2) for i, d in enumerate(decode)]
    return {"param_bytes": nbytes, "probe_gbs": probes, "decode_gbs": [round(d, 2)
            for d in decode], "shares": [round(s, 3) for s in pairs],
            "share_median": round(statistics.median(pairs), 3)}


def markdown(rows: dict[str, Any]) -> str:
    head = "| B | K | " + " | ".join(CATEGORIES) + " | step / plain |"
    lines = [head, "|" + "---|" * (len(CATEGORIES) + 3)]
    for r in rows.values():
        cells = " | ".join(f"{100 * r['shares'][c]:.0f}" for c in CATEGORIES)
        lines.append(f"| {r['batch']} | {r['k']} | {cells} | {r['step_over_plain']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    oracle_args(ap, 32)
    ap.add_argument("--prompt-tokens", type=int, default=256,
                    help="each prompt's last N tokens (at most 256, as verify_cost.py)")
    ap.add_argument("--probe-mb", type=int, default=512)
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth share")
    ap.add_argument("--bandwidth-only", action="store_true", help="skip the profile")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "verify-profile.json")
    args = ap.parse_args()

    from specserve.runtime.model import load_model

    torch.set_num_threads(1)
    model = load_model(args.model)
    batches = [] if args.bandwidth_only else [int(b) for b in args.batches.split(",")]
    ks = [0] + [int(k) for k in args.ks.split(",")]
    prompts = [p[-args.prompt_tokens:]
               for p in _prompts(args.model, args.data, max(batches, default=1))]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "tokens": args.tokens,
                              "prompt_tokens": [len(p) for p in prompts],
                              "torch": torch.__version__, "rows": {}}
    if not args.no_bandwidth:
        result["bandwidth"] = bandwidth_share(model, prompts[0], args.tokens, args.probe_mb)
        print(json.dumps(result["bandwidth"]), flush=True)
    for b in batches:
        result["rows"].update(run_batch(model, prompts[:b], ks, args.tokens))
        print(f"batch {b} done", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result["rows"]))


if __name__ == "__main__":
    main()
