"""The Dynamo worker's sender (no Dynamo needed): with ``n`` > 1 each choice's chunks carry
their own ``index`` and their own text from a detokenizer of that choice alone, because
Dynamo's backend detokenizes one stream per request (``dynamo_request`` docstring). The text
function here decodes ids as UTF-8 bytes, so a character cut between two chunks of one choice,
with another choice's chunk in between, shows whether the detokenizers are kept apart."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from specserve.frontends.dynamo_sender import DynamoSender
from specserve.runtime.params import SamplingParams


def utf8(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _arrays(ids: list[int]) -> dict[str, Any]:
    return {"output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, -1)}


def _drain(loop: asyncio.AbstractEventLoop, sender: DynamoSender) -> list[dict[str, Any]]:
    loop.run_until_complete(asyncio.sleep(0))
    out = []
    while not sender.out.empty():
        item, _ = sender.out.get_nowait()
        out.append(item)
    return out


def test_each_choice_is_decoded_on_its_own() -> None:
    loop = asyncio.new_event_loop()
    try:
        root = DynamoSender(loop, SamplingParams(max_tokens=2), None, utf8)
        a, b = root.split(2)
        # "é" = C3 A9 for choice 0, "ü" = C3 BC for choice 1, their chunks interleaved
        for s, ids in ((a, [0xC3]), (b, [0xC3]), (a, [0xA9]), (b, [0xBC])):
            assert s.send(_arrays(ids), None, final=False)
        a.send(None, None, final=True)
        b.send(None, None, final=True)
        items = _drain(loop, root)
    finally:
        loop.close()
    text = {i: "".join(x["text"] for x in items if x["index"] == i) for i in (0, 1)}
    ids = {i: [t for x in items if x["index"] == i for t in x["token_ids"]] for i in (0, 1)}
    assert text == {0: "é", 1: "ü"}, items
    assert ids == {0: [0xC3, 0xA9], 1: [0xC3, 0xBC]}
    assert [x.get("finish_reason") for x in items if "finish_reason" in x] == ["length"] * 2
