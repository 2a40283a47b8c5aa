"""Two commits of the served path side by side: does a refactor change a served figure?

Exports ``--before`` and ``--after`` (``git archive``) into ``--work``, builds one torch engine
with the *before* tree (draft-target on ``--checkpoint``; both trees then serve the same
engine), writes each tree's Triton repository with its own ``specserve repo`` and starts one
tritonserver per tree on 127.0.0.1 (``specserve serve`` with ``PYTHONPATH`` = that tree, so
its Python models import that tree's ``specserve``), and with ``--control`` (default) a second
server of the *before* tree, measured exactly like *after*: control/before is the noise floor
of this machine, against which after/before is read. Each server first serves ``--prewarm``
untimed requests at c = 8 (its pools touched). Then, per concurrency:

* two ``specserve bench`` runs per compared server (it as ``--url`` and before as
  ``--baseline-url``, then swapped), the two interleaved request by request: per-user tok/s and
  TTFT as speedups over before with the tool's 95% bootstrap intervals (the two orientations'
  geometric mean), and whether each prompt's greedy output text is the same;
* ``--rounds`` rounds of one phase per server, the order rotating each round, for output tok/s
  (throughput needs the machine to itself): the per-round ratios, their median and a 95%
  bootstrap interval of their geometric mean.

Every figure is a ratio over before (> 1: faster than before); nothing is asserted. Writes
``OUT/core_before_after.json``. Every server is stopped on exit.

On a loaded shared machine the server started first runs faster, alone or not, and two servers
loaded at once (the interleaved run at c > 1) are no fair race: run once per ``--start-order``
of a Latin square and pool the single-server phases with ``--combine OUT1 OUT2 OUT3``.

    for o in before,after,control after,control,before control,before,after; do
        .venv/bin/python benchmarks/core_before_after.py --start-order $o --out reports/cba-${o%%,*}
    done
    .venv/bin/python benchmarks/core_before_after.py --combine reports/cba-* --out reports/cba
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def export(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def cli(tree: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, "-m", "specserve.cli.main", *args], cwd=tree, env=env,
                   check=True, stdout=subprocess.DEVNULL)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``specserve serve --repo REPO`` of one tree, in its own process group."""

    def __init__(self, tree: Path, repo: Path, log: Path) -> None:
        self.tree, self.repo, self.log = tree, repo, log
        self.grpc = free_port()
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = 300) -> None:
        env = dict(os.environ, PYTHONPATH=str(self.tree))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specserve.cli.main", "serve", "--repo", str(self.repo),
             "--host", "127.0.0.1", "--grpc-port", str(self.grpc),
             "--http-port", str(free_port()), "--metrics-port", str(free_port()),
             "--log", str(self.log)],
            cwd=self.tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready in"):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"{self.repo}: server not ready (log {self.log})")

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def bench(out: Path, args: argparse.Namespace, c: int, requests: int, url: str,
          baseline_url: str | None = None) -> dict[str, Any]:
    from specserve.client.config import BenchmarkConfig
    from specserve.client.run import run_benchmark

    cfg = BenchmarkConfig(out=str(out), url=url, baseline_url=baseline_url, model="ensemble",
                          requests=requests, warmup=args.warmup, concurrency=c,
                          max_tokens=args.max_tokens, temperature=0.0, seed=0,
                          prompts="builtin-code", bootstrap=0 if baseline_url is None else 2000)
    return run_benchmark(cfg, progress=False, plots=False).summary


def same_outputs(out: Path) -> dict[str, int]:
    texts: dict[str, dict[int, str]] = {"spec": {}, "baseline": {}}
    for line in (out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["phase"] == "measure" and r.get("error") is None:
            texts[r["variant"]].setdefault(r["prompt_index"], r["output_text"])
    both = texts["spec"].keys() & texts["baseline"].keys()
    return {"prompts_compared": len(both),
            "identical": sum(texts["spec"][i] == texts["baseline"][i] for i in both)}


def interleaved(out: Path, args: argparse.Namespace, c: int, url: str,
                baseline_url: str) -> dict[str, Any]:
    """One interleaved run: url's speedups over baseline_url (the tool's 95% intervals)."""
    summ = bench(out, args, c, args.requests, url, baseline_url)
    sp, va, vb = summ["speedup"], summ["variants"]["spec"], summ["variants"]["baseline"]
    return {"per_user_tok_s": {k: sp["per_user_tok_s"][k]
                               for k in ("speedup", "ci_low", "ci_high")},
            "ttft_mean": {k: sp["ttft_s"][k] for k in ("speedup", "ci_low", "ci_high")},
            "ttft_p50": {"speedup": vb["ttft_ms"]["p50"] / va["ttft_ms"]["p50"],
                         "url_ms": va["ttft_ms"]["p50"], "baseline_ms": vb["ttft_ms"]["p50"]},
            "tau": {"url": va["acceptance"].get("tau_stream"),
                    "baseline": vb["acceptance"].get("tau_stream")},
            "outputs": same_outputs(out)}


def _ci(run: dict[str, Any], key: str, invert: bool = False) -> str:
    """``run[key]``'s speedup and interval, inverted (1/x) when the tested server was the
    baseline."""
    f = run[key]
    if key == "ttft_p50" or "ci_low" not in f:
        return f"{f['speedup'] ** (-1 if invert else 1):.3f}"
    if invert:
        return f"{1 / f['speedup']:.3f} [{1 / f['ci_high']:.3f}, {1 / f['ci_low']:.3f}]"
    return f"{f['speedup']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}]"


def geo_ci(ratios: list[float], n: int = 4000) -> tuple[float, float, float]:
    logs = [math.log(r) for r in ratios]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(n))
    return (math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * n)]),
            math.exp(means[int(0.975 * n) - 1]))


PHASE = {"output_tok_s": ("output_token_throughput_tok_s", None),
         "per_user_tok_s": ("per_user_tok_s", "mean"), "ttft_p50_speedup": ("ttft_ms", "p50")}


def combine(dirs: list[Path]) -> dict[str, Any]:
    """Pool the single-server phases of several runs (e.g. one per start order, so each server
    starts first once): per concurrency and server, the per-round ratios over before of output
    tok/s, per-user tok/s and TTFT p50 (before/server: > 1 is faster), their geometric mean
    with a 95% bootstrap interval, and whether every phase's texts match before's."""
    out: dict[str, Any] = {}
    for d in dirs:
        for f in sorted(d.glob("c*-r*-*/summary.json")):
            c, r, name = f.parent.name.split("-", 2)
            if name == "before":
                continue
            base = f.parent.with_name(f"{c}-{r}-before")
            one, two = (json.loads(x.read_text())["variants"]["spec"]
                        for x in (f, base / "summary.json"))
            cell = out.setdefault(c, {}).setdefault(name, {k: [] for k in PHASE})
            for k, (key, sub) in PHASE.items():
                a, b = (v[key][sub] if sub else v[key] for v in (one, two))
                cell[k].append(b / a if k.startswith("ttft") else a / b)
            texts = [{(json.loads(line)["prompt_index"]): json.loads(line)["output_text"]
                      for line in (x / "requests.jsonl").read_text().splitlines()}
                     for x in (f.parent, base)]
            cell.setdefault("texts_same", []).append(texts[0] == texts[1])
    for c, names in out.items():
        for name, cell in names.items():
            for k in PHASE:
                g, lo, hi = geo_ci(cell[k])
                cell[k] = {"geomean": g, "ci_low": lo, "ci_high": hi, "rounds": len(cell[k])}
                print(f"{c} {name}/before {k}: {g:.3f} [{lo:.3f}, {hi:.3f}] "
                      f"({cell[k]['rounds']} rounds)")
            print(f"{c} {name}: every phase's texts equal before's: {all(cell['texts_same'])}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="cf923e8~1")
    ap.add_argument("--after", default="cf923e8")
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "demo"),
                    help="folder with target/ and draft/")
    ap.add_argument("--work", default="/tmp/core-before-after")
    ap.add_argument("--out", default="reports/core-before-after")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=32, help="per variant, interleaved run")
    ap.add_argument("--phase-requests", type=int, default=16,
                    help="per throughput phase (x c/4 above c = 4)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                    help="a second before server, compared like after: the noise floor")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--start-order", default="before,after,control",
                    help="which server starts (and is prewarmed) first")
    ap.add_argument("--prewarm", type=int, default=32,
                    help="requests per server at c = 8 before any measurement (0: none)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--combine", nargs="+", type=Path, metavar="OUT",
                    help="only pool the phases of earlier runs' OUT folders, print, exit")
    args = ap.parse_args()
    if args.combine:
        pooled = combine(args.combine)
        (Path(args.out) / "combined.json").parent.mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "combined.json").write_text(json.dumps(pooled, indent=2) + "\n")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trees = {"before": export(args.before, work / "before"),
             "after": export(args.after, work / "after")}
    engine = work / "engine"
    ck = Path(args.checkpoint).resolve()
    cli(trees["before"], "build", "--model", str(ck / "target"), "--draft", str(ck / "draft"),
        "--backend", "torch", "--dtype", "float32", "--out", str(engine), "--force")
    servers = {}
    for name, tree in trees.items():
        cli(tree, "repo", "--engine", str(engine), "--out", str(work / f"repo-{name}"), "--force")
        servers[name] = Server(tree, work / f"repo-{name}", work / f"server-{name}.log")
    if args.control:  # a second server of the before tree: the noise floor (control/before)
        servers["control"] = Server(trees["before"], work / "repo-before",
                                    work / "server-control.log")
    compared = ["after", "control"] if args.control else ["after"]
    result: dict[str, Any] = {"config": vars(args), "levels": {}}
    try:
        first = [n for n in args.start_order.split(",") if n in servers]
        for name in first + [n for n in servers if n not in first]:
            servers[name].start()
        for name in first + [n for n in servers if n not in first]:  # pools touched, untimed
            s = servers[name]
            if args.prewarm:
                bench(out / f"prewarm-{name}", args, 8, args.prewarm, s.url)
        for c in (int(x) for x in args.concurrency.split(",")):
            lv: dict[str, Any] = {}
            for name in compared:
                # both orientations (the server under test as --url, then as --baseline-url):
                # whatever the client's roles do to a figure cancels in their geometric mean
                one = interleaved(out / f"c{c}-interleaved-{name}", args, c,
                                  servers[name].url, servers["before"].url)
                two = interleaved(out / f"c{c}-interleaved-before-vs-{name}", args, c,
                                  servers["before"].url, servers[name].url)
                lv[name] = {"as_url": one, "as_baseline_url": two}
                for k in ("per_user_tok_s", "ttft_mean", "ttft_p50"):
                    lv[name][k] = math.sqrt(one[k]["speedup"] / two[k]["speedup"])
                lv[name]["outputs"] = {k: one["outputs"][k] + two["outputs"][k]
                                       for k in one["outputs"]}
            tps: dict[str, list[float]] = {name: [] for name in servers}
            names = list(servers)
            for r in range(args.rounds):
                shift = r % len(names)
                order = names[shift:] + names[:shift]
                if (r // len(names)) % 2:
                    order.reverse()
                for name in order:
                    ph = bench(out / f"c{c}-r{r}-{name}", args, c,
                               args.phase_requests * max(1, c // 4), servers[name].url)
                    tps[name].append(ph["variants"]["spec"]["output_token_throughput_tok_s"])
            lv["output_tok_s"] = tps
            for name in compared:
                ratios = [a / b for a, b in zip(tps[name], tps["before"], strict=True)]
                g, lo, hi = geo_ci(ratios)
                lv[name]["output_tok_s"] = {"per_round": ratios, "geomean": g, "ci_low": lo,
                                            "ci_high": hi, "median": statistics.median(ratios)}
                x = lv[name]
                o, t = x["as_url"], x["as_baseline_url"]
                print(f"c={c} {name}/before: per-user tok/s {x['per_user_tok_s']:.3f} "
                      f"({_ci(o, 'per_user_tok_s')}; {_ci(t, 'per_user_tok_s', True)})  "
                      f"TTFT p50 speedup {x['ttft_p50']:.3f} (mean {x['ttft_mean']:.3f}: "
                      f"{_ci(o, 'ttft_mean')}; {_ci(t, 'ttft_mean', True)})  output tok/s {g:.3f} "
                      f"[{lo:.3f}, {hi:.3f}] (median {x['output_tok_s']['median']:.3f})  "
                      f"identical {x['outputs']['identical']}/{x['outputs']['prompts_compared']}",
                      flush=True)
            result["levels"][f"c{c}"] = lv
    finally:
        for s in servers.values():
            s.stop()
    result["load_avg_1m_end"] = os.getloadavg()[0]
    (out / "core_before_after.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
