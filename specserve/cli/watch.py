"""``specserve watch``: raise an alarm when served acceptance falls below its baseline.

Parses the options into a :class:`specserve.watch.run.WatchConfig` and calls
:func:`specserve.watch.run.watch`, printing its events; ``--emit-rules`` writes the same rule
as a Prometheus alerting-rules file (:func:`specserve.watch.rules_yaml.alert_rules`) instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from specserve.cli._output import FORMAT_OPTION
from specserve.errors import SpecserveError

EXAMPLES = """
\b
Examples:
  # our Triton server (metrics port), baseline from a bench run, 30 s intervals, one hour
  specserve watch --metrics-url http://127.0.0.1:8002/metrics \\
      --baseline reports/bench/summary.json --interval 30 --duration 3600
\b
  # two vLLM workers behind Dynamo, summed; the doctor's probe as the baseline; JSON lines
  specserve watch --metrics-url http://w0:8081/metrics --metrics-url http://w1:8081/metrics \\
      --baseline doctor.json --interval 60 --format json
\b
  # the same rule as Prometheus alerting rules, to load instead
  specserve watch --emit-rules rules.yaml --engine vllm --baseline summary.json --interval 60

\b
Rule: an interval with fewer than --min-draft-tokens draft tokens (SGLang: generated tokens)
is idle and not judged; an active interval is low when its acceptance rate or its tokens per
step (tau) is below baseline x (1 - --tolerance); --consecutive low active intervals in a row
raise one alarm (a JSON line, "event": "alarm"); a good interval ends it ("recovered").
Counter resets (restart, model reload) count from 0. Exit code: 0 no alarm, 1 an alarm,
2 bad input (unreachable URL, no speculative series, a baseline file of another kind).
"""


def _printer(fmt: str) -> Any:
    def emit(ev: dict[str, Any]) -> None:
        if fmt == "json" or ev["event"] not in ("interval", "start", "end"):
            click.echo(json.dumps(ev, sort_keys=False, default=str), nl=True)
        elif ev["event"] == "interval":
            rate, tau = ev["acceptance_rate"], ev["tau"]
            click.echo(f"interval {ev['index']}: {ev['status']}"
                       f" rate={'-' if rate is None else f'{rate:.3f}'}"
                       f" tau={'-' if tau is None else f'{tau:.3f}'}"
                       f" draft_tokens={ev['draft_tokens']} workers={ev['workers']}")
        elif ev["event"] == "start":
            th = ev["thresholds"]
            click.echo(f"watching {ev['engine']} at {', '.join(ev['workers'])}: floors "
                       f"rate {th['acceptance_rate']} tau {th['tau']} "
                       f"({ev['baseline']['source']})")
        else:
            click.echo(f"watch: {ev['intervals']} interval(s), {ev['alarms']} alarm(s)")
    return emit


@click.command("watch", epilog=EXAMPLES,
               short_help="Alarm when served acceptance falls below its baseline.")
@click.option("--metrics-url", "urls", multiple=True,
              help="A worker's Prometheus metrics URL (repeat for several workers: summed).")
@click.option("--baseline", type=click.Path(dir_okay=False), required=True,
              help="specserve bench summary.json or specserve doctor --format json output.")
@click.option("--variant", default=None, help="The bench variant [default: the one that drafted].")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0, min_open=True),
              default=30.0, show_default=True, help="Seconds per interval.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Stop after this many seconds [default: run until stopped].")
@click.option("--engine", type=click.Choice(["auto", "specserve", "vllm", "trtllm", "sglang"]),
              default="auto", show_default=True, help="Whose series to read.")
@click.option("--tolerance", type=float, default=0.3, show_default=True,
              help="Alarm below baseline x (1 - tolerance).")
@click.option("--consecutive", type=click.IntRange(min=1), default=2, show_default=True,
              help="Low active intervals in a row that raise the alarm.")
@click.option("--min-draft-tokens", "min_activity", type=click.FloatRange(min=0), default=64,
              show_default=True, help="Fewer in an interval: idle, not judged.")
@click.option("--exit-on-alarm", is_flag=True, help="Stop at the first alarm (exit 1).")
@click.option("--emit-rules", type=click.Path(dir_okay=False), default=None,
              help="Write Prometheus alerting rules for the same rule to this file and exit.")
@click.option("--selector", default="",
              help='PromQL label matchers for --emit-rules, e.g. \'job="vllm"\'.')
@FORMAT_OPTION
def command(fmt: str, urls: tuple[str, ...], emit_rules: str | None, selector: str,
            tolerance: float, consecutive: int, min_activity: float, **opts: Any) -> None:
    """Poll the served speculation counters (Prometheus metrics of specserve, vLLM,
    TensorRT-LLM or SGLang workers) every --interval seconds and raise an alarm when the
    acceptance rate or tokens per step stays below the --baseline's; or, with --emit-rules,
    write the same rule as Prometheus alerting rules."""
    from specserve.watch.rule import Rule

    rule = Rule(tolerance=tolerance, consecutive=consecutive, min_activity=min_activity)
    if emit_rules is not None:
        _emit_rules(emit_rules, opts, rule, selector, urls)
        return
    from specserve.watch.run import WatchConfig, watch

    cfg = WatchConfig(urls=urls, baseline=opts["baseline"], interval_s=opts["interval_s"],
                      duration_s=opts["duration_s"], engine=opts["engine"], rule=rule,
                      variant=opts["variant"], exit_on_alarm=opts["exit_on_alarm"])
    code = watch(cfg, _printer(fmt))
    raise SystemExit(code)


def _emit_rules(out: str, opts: dict[str, Any], rule: Any, selector: str,
                urls: tuple[str, ...]) -> None:
    from specserve.config import write_text_atomic
    from specserve.watch.baseline import read_baseline
    from specserve.watch.rule import thresholds
    from specserve.watch.rules_yaml import alert_rules
    from specserve.yamlio import dump

    if urls:
        raise SpecserveError("--emit-rules writes a file for Prometheus to evaluate; it takes "
                             "no --metrics-url (select the workers with --selector)")
    if opts["engine"] == "auto":
        raise SpecserveError("--emit-rules needs --engine (specserve, vllm, trtllm or sglang): "
                             "there is no server to detect it from")
    base = read_baseline(opts["baseline"], opts["variant"])
    rules = alert_rules(opts["engine"], thresholds(base, rule), rule, opts["interval_s"],
                        selector, base.source)
    write_text_atomic(Path(out), dump(rules))
    click.echo(f"wrote {out}: {len(rules['groups'][0]['rules'])} alert rule(s) for "
               f"{opts['engine']}")
