"""Exposition text of upstream's metric definitions (names, help, labels, kinds), written by
prometheus_client's own ``generate_latest`` -- the call trtllm-serve and SGLang serve /metrics
with -- one registry per engine, scraped twice (``_created`` stays, counters grow).

Run: ``.peers/vllm/bin/python tests/data/watch/gen_samples.py tests/data/watch``.
"""

import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


def trtllm(out: str) -> None:
    # NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py MetricsCollector (PR #12545)
    r = CollectorRegistry()
    labels = {"model_name": "llama", "engine_type": "trtllm"}
    drafted = Counter("trtllm_spec_decode_num_draft_tokens_total",
                      "Total number of draft tokens in speculative decoding",
                      labelnames=labels.keys(), registry=r).labels(**labels)
    accepted = Counter("trtllm_spec_decode_num_accepted_tokens_total",
                       "Total number of accepted tokens in speculative decoding",
                       labelnames=labels.keys(), registry=r).labels(**labels)
    length = Gauge("trtllm_spec_decode_acceptance_length",
                   "Acceptance length in speculative decoding",
                   labelnames=labels.keys(), registry=r).labels(**labels)
    Gauge("trtllm_spec_decode_draft_overhead", "Draft overhead in speculative decoding",
          labelnames=labels.keys(), registry=r).labels(**labels).set(0.12)
    drafted.inc(1200)
    accepted.inc(780)
    length.set(2.95)
    open(f"{out}/trtllm_metrics_before.txt", "w").write(generate_latest(r).decode())
    drafted.inc(600)
    accepted.inc(30)
    length.set(1.15)
    open(f"{out}/trtllm_metrics_after.txt", "w").write(generate_latest(r).decode())


def sglang(out: str) -> None:
    # sgl-project/sglang python/sglang/srt/metrics/collector.py @93d04878
    r = CollectorRegistry()
    labels = {"model_name": "llama"}
    length = Gauge("sglang:spec_accept_length",
                   "The average acceptance length of speculative decoding.",
                   labelnames=labels.keys(), registry=r).labels(**labels)
    rate = Gauge("sglang:spec_accept_rate",
                 "The average acceptance rate of speculative decoding (`accepted tokens / "
                 "total draft tokens` in batch).", labelnames=labels.keys(),
                 registry=r).labels(**labels)
    tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                     labelnames=labels.keys(), registry=r).labels(**labels)
    tokens.inc(5000)
    length.set(3.1)
    rate.set(0.7)
    open(f"{out}/sglang_metrics_before.txt", "w").write(generate_latest(r).decode())
    tokens.inc(600)
    length.set(1.05)
    rate.set(0.02)
    open(f"{out}/sglang_metrics_after.txt", "w").write(generate_latest(r).decode())


if __name__ == "__main__":
    trtllm(sys.argv[1])
    sglang(sys.argv[1])
