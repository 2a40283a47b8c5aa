"""``BenchmarkConfig``: every input of a ``specserve bench`` run (saved in ``summary.json``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specserve.client.tokens import COUNT_MODES
from specserve.config import JsonConfig
from specserve.errors import SpecserveError

_HOSTPORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")
PROTOCOLS = ("grpc", "http", "openai")
BALANCE = ("round-robin", "least-outstanding")  # client/balance.py


def host_port(url: str) -> str:
    """``http://host:port/v1/`` -> ``host:port`` (what users paste for OpenAI servers); other
    text (``https://`` too: not supported) is left for :meth:`BenchmarkConfig.validate`."""
    return url.strip().removeprefix("http://").rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class BenchmarkConfig(JsonConfig):
    """A benchmark run. ``requests`` and ``warmup`` count per variant (spec, baseline)."""

    url: str
    out: str
    protocol: str = "grpc"                  # grpc | http (Triton) | openai
    endpoint: str = "completions"           # openai: completions | chat
    model: str = "ensemble"
    baseline_model: str | None = None
    baseline_url: str | None = None
    concurrency: int | None = None          # closed loop (default 1 when no request_rate)
    request_rate: float | None = None       # open loop, Poisson arrivals per second
    requests: int = 32
    warmup: int = 2
    dataset: str | None = None
    prompts: str | None = None
    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    end_id: int | None = None
    num_draft_tokens: int | None = None     # tensorrt_llm_bls input (models that declare it)
    stream: bool = True
    ignore_eos: bool = False                # openai: ask for exactly max_tokens tokens
    scrape_metrics: bool = True             # openai: Prometheus counters before/after the run
    perf_outputs: bool = True               # request return_perf_metrics / num_output_tokens
    slo: str | None = None                  # "ttft=200,tpot=50" (milliseconds)
    tokenizer: str | None = None            # fallback token counting only
    timeout_s: float = 300.0                # per request
    num_output_tokens_mode: str = "per_response"
    bootstrap: int = 2000
    abort_after_errors: int = 5              # consecutive failed requests
    replicas: tuple[str, ...] = ()           # more servers of the same model (--url A --url B)
    balance: str = "round-robin"             # over url + replicas: or "least-outstanding"
    # openai: the Prometheus endpoints whose counters are the variant's (the workers behind a
    # Dynamo frontend), scraped instead of the server's own and summed
    metrics_urls: tuple[str, ...] = ()
    baseline_metrics_urls: tuple[str, ...] = ()
    # Predicted Outputs: send the prompts' predictions (spec variant only), and at --protocol
    # openai where: "nvext" (Dynamo's nvext.annotations) or "openai" (top-level, e.g. vLLM)
    send_prediction: bool = True
    prediction_field: str = "nvext"

    @property
    def urls(self) -> tuple[str, ...]:
        """Every server the spec variant's requests are spread over (``url`` first)."""
        return (self.url, *self.replicas)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if not self.replicas:  # one server: summary.json's config as before
            d.pop("replicas")
            d.pop("balance")
        else:
            d["replicas"] = list(self.replicas)
        if self.send_prediction and self.prediction_field == "nvext":
            d.pop("send_prediction")   # the defaults: summary.json's config as before
            d.pop("prediction_field")
        for k in ("metrics_urls", "baseline_metrics_urls"):
            if not d[k]:
                d.pop(k)  # none given: summary.json's config as before
            else:
                d[k] = list(d[k])
        return d

    @property
    def has_baseline(self) -> bool:
        return self.baseline_model is not None or self.baseline_url is not None

    @property
    def closed_loop_concurrency(self) -> int:
        return self.concurrency if self.concurrency is not None else 1

    def validate(self) -> None:
        for name, v in (("url", self.url), ("baseline_url", self.baseline_url),
                        *(("url", r) for r in self.replicas)):
            if v is not None and not _HOSTPORT.match(v):
                raise SpecserveError(f"--{name.replace('_', '-')}: '{v}' is not HOST:PORT")
        if len(set(self.urls)) != len(self.urls):
            raise SpecserveError("--url: the same server twice "
                                 f"({', '.join(self.urls)})")
        if (self.metrics_urls or self.baseline_metrics_urls) and (
                self.protocol != "openai" or not self.scrape_metrics):
            raise SpecserveError("--metrics-url needs --protocol openai and --server-metrics")
        if self.baseline_metrics_urls and not self.has_baseline:
            raise SpecserveError("baseline metrics URLs without --baseline-model")
        if self.balance not in BALANCE:
            raise SpecserveError(f"--balance: '{self.balance}' is not one of {list(BALANCE)}")
        if self.protocol not in PROTOCOLS:
            raise SpecserveError(f"--protocol: '{self.protocol}' is not grpc, http or openai")
        if self.prediction_field not in ("nvext", "openai"):
            raise SpecserveError(f"--prediction-field: '{self.prediction_field}' is not nvext "
                                 "or openai")
        if self.endpoint not in ("completions", "chat"):
            raise SpecserveError(f"--endpoint: '{self.endpoint}' is not completions or chat")
        if self.concurrency is not None and self.request_rate is not None:
            raise SpecserveError("give --concurrency or --request-rate, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecserveError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise SpecserveError(f"--request-rate must be > 0, got {self.request_rate}")
        if self.requests < 1 or self.warmup < 0 or self.max_tokens < 1:
            raise SpecserveError("--requests and --max-tokens must be >= 1, --warmup >= 0")
        if self.dataset and self.prompts:
            raise SpecserveError("give --dataset or --prompts, not both")
        if self.temperature is not None and self.temperature < 0:
            raise SpecserveError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise SpecserveError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise SpecserveError(f"--num-draft-tokens must be >= 0, got {self.num_draft_tokens}")
        if self.seed < 0:
            raise SpecserveError(f"--seed must be >= 0 (UINT64), got {self.seed}")
        if self.abort_after_errors < 1:
            raise SpecserveError(f"abort_after_errors must be >= 1, got {self.abort_after_errors}")
        if self.timeout_s <= 0:
            raise SpecserveError(f"--timeout must be > 0, got {self.timeout_s}")
        if self.num_output_tokens_mode not in COUNT_MODES:
            raise SpecserveError(f"num_output_tokens_mode must be one of {COUNT_MODES}")
        if self.baseline_url is not None and self.baseline_model is None and \
                self.baseline_url == self.url:
            raise SpecserveError("--baseline-url is the --url itself; give --baseline-model")
