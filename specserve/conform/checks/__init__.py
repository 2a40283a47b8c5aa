"""The conformance checks, one module per API feature, registered by name in
:data:`REGISTRY` (importing this package registers them all, in their numbered order)."""

from specserve.conform.checks import greedy, logprobs, prompts, sampling, stops, structured
from specserve.conform.checks.base import REGISTRY, Check, Context, Outcome, Settings

ORDER = ("greedy-completions", "greedy-chat", "stream-bytes", "stop-string", "stop-token-ids",
         "max-tokens", "min-tokens", "ignore-eos", "finish-reason", "usage", "seed",
         "distribution", "n", "logprobs", "logprobs-stream", "top-logprobs",
         "logprobs-chat", "json-schema", "json-object",
         "regex", "long-prompt", "empty-prompt", "one-token-prompt")

__all__ = ["ORDER", "REGISTRY", "Check", "Context", "Outcome", "Settings", "greedy",
           "logprobs", "prompts", "sampling", "stops", "structured"]
