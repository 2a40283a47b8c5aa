"""What a worker registers with NVIDIA Dynamo, and the frontend's verdict on it (pure).

Chat or completions only: ai-dynamo 1.6.1's frontend builds a model's prompt formatter from the
chat template it finds next to the tokenizer (``tokenizer_config.json``'s ``chat_template`` or a
``chat_template.jinja`` file; both seen working here). A model registered as
``ModelType.Chat | ModelType.Completions`` without one is never served: the frontend's
discovery controller logs ``Model materialization failed; scheduling retry ...
error="prompt_formatter_from_mdc: chat_template field is required in the tokenizer_config.json
file"`` and retries with backoff for ever (``lib/llm/src/discovery``), while ``/v1/models``
stays empty. So a checkpoint without a chat template (a base model) registers
``ModelType.Completions`` alone: ``/v1/completions`` serves it and the frontend answers
``/v1/chat/completions`` for it with its own OpenAI error.

Health: the canary (:func:`canary_request`) is the request Dynamo's runtime sends through the
engine when the endpoint has been idle for ``DYN_CANARY_WAIT_TIME`` seconds, with
``DYN_HEALTH_CHECK_ENABLED=true`` (ai-dynamo-runtime 1.6.1 ``lib/runtime/src/health_check.rs``,
``serve_endpoint(..., health_check_payload=...)``); no answer within
``DYN_HEALTH_CHECK_REQUEST_TIMEOUT`` marks the endpoint not ready on its system status server
(``Health check timeout for generate``), which is what ``specserve serve`` probes from outside.

:func:`rejection` reads the frontend's log for that line, so ``specserve serve`` reports a
registration the frontend refuses within seconds, with Dynamo's reason, instead of waiting for
its readiness time-out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: the frontend's log line for a registration it could not turn into a served model
REJECTED = "Model materialization failed"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR = re.compile(r'error\s*=\s*"((?:[^"\\]|\\.)*)"')


def has_chat_template(model_dir: Path) -> bool:
    """``model_dir`` (the tokenizer's directory) carries a chat template Dynamo's frontend
    reads: ``chat_template.jinja``, or a non-empty ``chat_template`` in
    ``tokenizer_config.json``."""
    if (model_dir / "chat_template.jinja").is_file():
        return True
    try:
        cfg = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    value = cfg.get("chat_template") if isinstance(cfg, dict) else None
    return bool(value) and (not isinstance(value, str) or bool(value.strip()))


def canary_request(eos: int | None) -> dict[str, Any]:
    """The smallest request the worker serves: one prompt token, one greedy token (the
    preprocessed form the frontend sends: :mod:`specserve.frontends.dynamo_request`)."""
    return {"token_ids": [0 if eos is None else eos], "stop_conditions": {"max_tokens": 1},
            "sampling_options": {"temperature": 0.0}, "output_options": {},
            "eos_token_ids": [] if eos is None else [eos]}


def rejection(frontend_log: str) -> str | None:
    """Dynamo's reason for the first registration its frontend refused (the ``error`` field
    of its ``Model materialization failed`` line, colour codes removed), or None."""
    for line in frontend_log.splitlines():
        if REJECTED not in line:
            continue
        plain = _ANSI.sub("", line)
        m = _ERROR.search(plain)
        return m.group(1).replace('\\"', '"') if m else plain.strip()[-300:]
    return None
