"""One prompt of a benchmark run (:class:`Prompt`: a request, a chat history or a multi-turn
conversation, with its category), shared by the dataset readers
(:mod:`specserve.client.datasets`), the built-in sets (:mod:`specserve.client.builtin_prompts`)
and the runner (:mod:`specserve.client.benchmark`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNCATEGORIZED = "uncategorized"


@dataclass(frozen=True)
class Prompt:
    """One request, or one conversation.

    ``text``: what a text endpoint is sent (for ``messages``, the history rendered by
    :func:`conversation_text`; for ``turns``, the first turn). ``max_tokens`` overrides the run's
    ``--max-tokens`` when set. ``messages``: (role, content) pairs of a chat history sent as one
    request. ``turns``: the user turns of a multi-turn conversation (empty: a single request).
    ``prediction``: the expected output's text (Predicted Outputs), sent with the request by
    ``specserve bench`` (not with ``turns``)."""

    text: str
    max_tokens: int | None = None
    category: str = UNCATEGORIZED
    messages: tuple[tuple[str, str], ...] = ()
    turns: tuple[str, ...] = ()
    prediction: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSONL record that :func:`load_jsonl` reads back as this prompt."""
        d: dict[str, Any] = ({"turns": list(self.turns)} if self.turns else
                             {"messages": [{"role": r, "content": c} for r, c in self.messages]}
                             if self.messages else {"prompt": self.text})
        d["category"] = self.category
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.prediction is not None:
            d["prediction"] = self.prediction
        return d


def conversation_text(messages: tuple[tuple[str, str], ...] | list[tuple[str, str]],
                      open_reply: bool = True) -> str:
    """A chat history as plain text for completion endpoints (Triton ``text_input``, OpenAI
    ``/v1/completions``): ``User: ...`` / ``Assistant: ...`` blocks, ending with an open
    ``Assistant:`` for the model to answer. The chat endpoint is sent the messages themselves."""
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    text = "\n\n".join(f"{names[r]}: {c}" for r, c in messages)
    return text + "\n\nAssistant:" if open_reply else text
