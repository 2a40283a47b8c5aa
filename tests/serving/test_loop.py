"""The serving loop every door runs, without Triton or Dynamo
(``specserve/serving/loop.py``): a real Scheduler over the tiny target, the serving core's
requests checked as every door checks them (``serving.admission.sampling_params``), and a
recording sender that behaves as Triton's wrapped response sender does (once the client is
gone, only a final flag goes out and ``send`` answers False).

Each test guards one rule of the loop: completion, backpressure at exactly ``max_pending``,
``draft_input_ids`` routed to their own verify call, a failed step failing what was in flight
(and the loop going on), a client that goes away freeing its slot, the final response's
tokens and perf outputs, streamed chunks adding up, and a proposer that cannot join a batch
refused when the loop is made.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
import torch

from specserve.errors import SpecserveError
from specserve.runtime.batch import GenerationResult
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.model import load_model
from specserve.runtime.proposers import OracleProposer
from specserve.runtime.scheduler import Scheduler
from specserve.serving.admission import sampling_params
from specserve.serving.engine import external_verify, make_scheduler
from specserve.serving.loop import Arrays, Pending, ServingLoop, final_arrays
from specserve.serving.request import EngineLimits, LlmRequest
from specserve.spec.stats import AcceptanceStats
from tests.helpers.tiny import TinyCheckpoint

torch.set_num_threads(1)

PROMPT = [5, 6, 7, 8, 9, 10, 11]


@dataclass
class Recorder:
    """A client: every response it got; it goes away after ``leave_after`` streamed ones."""

    leave_after: int | None = None
    got: list[tuple[Arrays | None, str | None, bool]] = field(default_factory=list)
    gone: bool = False

    def send(self, arrays: Arrays | None, error: str | None, final: bool) -> bool:
        if self.gone:
            if final:
                self.got.append((None, None, True))
            return False
        self.got.append((arrays, error, final))
        streamed = sum(1 for _, _, f in self.got if not f)
        if self.leave_after is not None and streamed >= self.leave_after:
            self.gone = True
        return True

    def cancelled(self) -> bool:
        return self.gone

    @property
    def finals(self) -> list[tuple[Arrays | None, str | None, bool]]:
        return [g for g in self.got if g[2]]


@cache
def _decoder(target: str) -> SpecDecoder:
    return SpecDecoder(load_model(target), None)


@pytest.fixture()
def decoder(tiny_ckpt: TinyCheckpoint) -> SpecDecoder:
    return _decoder(str(tiny_ckpt.target))


def limits(d: SpecDecoder) -> EngineLimits:
    return EngineLimits(vocab_size=d.target.cfg.vocab_size, max_draft_len=4, eos=None)


def pending(d: SpecDecoder, prompt: list[int], n: int, sender: Recorder | None = None,
            **fields: Any) -> Pending:
    """A request as a door hands it to the loop: ``fields`` of the core's ``LlmRequest``
    (never stopping on a token, the prompt excluded unless asked), checked."""
    req = LlmRequest(prompt=list(prompt), max_tokens=n, end_id=-1,
                     **{"exclude_input": True, **fields})
    return Pending(req=req, params=sampling_params(req, limits(d)), sender=sender or Recorder(),
                   arrival=1)


def make_loop(d: SpecDecoder, capacity: int = 2, max_pending: int = 8,
              scheduler: Scheduler | None = None) -> tuple[ServingLoop, queue.Queue[Any]]:
    q: queue.Queue[Pending | None] = queue.Queue()
    sch = scheduler or make_scheduler(d, capacity, 0, 256)
    return ServingLoop(sch, q, max_pending, external_verify(d, 4), lambda ids: "x" * len(ids)), q


def greedy(d: SpecDecoder, prompt: list[int], n: int) -> list[int]:
    return list(d.generate([prompt], [SamplingParams(max_tokens=n)])[0].token_ids)


def tokens(resp: tuple[Arrays | None, str | None, bool]) -> list[int]:
    arrays, error, _ = resp
    assert arrays is not None, error
    return [int(t) for t in arrays["output_ids"].reshape(-1)]


def test_queued_requests_complete_with_their_own_tokens(decoder: SpecDecoder) -> None:
    loop, q = make_loop(decoder)
    ps = [pending(decoder, PROMPT, 9), pending(decoder, [20, 21], 5),
          pending(decoder, [30, 31, 32], 6)]
    for p in [*ps, None]:
        q.put(p)
    loop.run()
    for p in ps:
        assert isinstance(p.sender, Recorder) and len(p.sender.got) == 1
        assert tokens(p.sender.finals[0]) == greedy(decoder, p.req.prompt, p.req.max_tokens)
    assert loop.sch.idle and not loop.live


def test_backpressure_stops_taking_at_exactly_max_pending(decoder: SpecDecoder) -> None:
    """max_pending 2: with 1 request in the scheduler the next one is taken, with 2 nothing
    more is (it stays in the model's bounded queue, which answers "server busy")."""
    loop, q = make_loop(decoder, capacity=1, max_pending=2)
    q.put(pending(decoder, PROMPT, 4))
    loop.intake()
    assert loop.sch.waiting == 1 and q.empty()
    q.put(pending(decoder, PROMPT, 4))
    loop.intake()
    assert loop.sch.waiting == 2 and q.empty()
    q.put(pending(decoder, PROMPT, 4))
    loop.intake()
    assert loop.sch.waiting == 2 and q.qsize() == 1


def test_draft_input_ids_get_a_verify_call_of_their_own(decoder: SpecDecoder) -> None:
    """Drafts right for 2 tokens then wrong: one verify step answers the 2 accepted + 1, with
    perf outputs 3 drafted / 2 accepted; the plain neighbour runs in the batch."""
    want = greedy(decoder, PROMPT, 4)
    loop, q = make_loop(decoder)
    wrong = (want[2] + 1) % decoder.target.cfg.vocab_size
    drafts = (want[0], want[1], wrong)
    ext = pending(decoder, PROMPT, 8, draft_ids=drafts, perf=True)
    plain = pending(decoder, PROMPT, 4)
    for p in (ext, plain, None):
        q.put(p)
    loop.run()
    assert isinstance(ext.sender, Recorder) and isinstance(plain.sender, Recorder)
    final = ext.sender.finals[0]
    assert tokens(final) == want[:3]
    assert final[0] is not None
    assert int(final[0]["total_draft_tokens"][0, 0]) == 3
    assert int(final[0]["total_accepted_draft_tokens"][0, 0]) == 2
    assert tokens(plain.sender.finals[0]) == want
    assert ext.first_scheduled > 0 and ext.first_token >= ext.first_scheduled


class FailingOnce(Scheduler):
    """The real scheduler whose first step raises (a forward that failed)."""

    failed = threading.Event()

    def step(self) -> bool:
        if not self.failed.is_set():
            self.failed.set()
            raise RuntimeError("boom")
        return super().step()


def test_a_failed_step_fails_what_was_in_flight_and_the_loop_goes_on(
        decoder: SpecDecoder) -> None:
    FailingOnce.failed = threading.Event()
    loop, q = make_loop(decoder, scheduler=FailingOnce(decoder, 2, 64))
    first = [pending(decoder, PROMPT, 6), pending(decoder, [20, 21], 6)]
    for p in first:
        q.put(p)
    worker = threading.Thread(target=loop.run, daemon=True)
    worker.start()
    assert FailingOnce.failed.wait(60)
    later = pending(decoder, [30, 31], 5)
    q.put(later)
    q.put(None)
    worker.join(60)
    assert not worker.is_alive()
    for p in first:
        assert isinstance(p.sender, Recorder)
        assert p.sender.got == [(None, "tensorrt_llm: generation failed: boom", True)]
    assert isinstance(later.sender, Recorder)
    assert tokens(later.sender.finals[0]) == greedy(decoder, [30, 31], 5)
    assert not loop.live


def test_a_client_that_goes_away_frees_its_slot(decoder: SpecDecoder) -> None:
    """Capacity 1: a streamed request whose client leaves after its first chunk is cancelled
    (its slot freed for the waiting one) and gets only the final flag, once."""
    loop, q = make_loop(decoder, capacity=1)
    leaver = pending(decoder, PROMPT, 40, Recorder(leave_after=1), streaming=True)
    waiting = pending(decoder, [20, 21], 5)
    for p in (leaver, waiting, None):
        q.put(p)
    loop.run()
    result = leaver.handle.result
    assert result is not None and result.finish_reason == "cancelled"
    assert len(result.token_ids) < 10
    assert isinstance(leaver.sender, Recorder)
    assert leaver.sender.finals == [(None, None, True)]
    assert isinstance(waiting.sender, Recorder)
    assert tokens(waiting.sender.finals[0]) == greedy(decoder, [20, 21], 5)


def test_streamed_chunks_add_up_to_the_tokens(decoder: SpecDecoder) -> None:
    loop, q = make_loop(decoder)
    p = pending(decoder, PROMPT, 7, streaming=True, num_output_tokens=True)
    q.put(p)
    q.put(None)
    loop.run()
    assert isinstance(p.sender, Recorder)
    *streamed, final = p.sender.got
    # nothing held back at the end: the final is the flag alone (docs/reliability.md §5)
    assert final == (None, None, True) and not any(g[2] for g in streamed)
    chunks = [tokens(g) for g in streamed]
    assert [t for c in chunks for t in c] == greedy(decoder, PROMPT, 7)
    for g, c in zip(streamed, chunks, strict=True):
        assert g[0] is not None and int(g[0]["num_output_tokens"][0, 0]) == len(c)


def test_final_arrays_tokens_and_perf_outputs(decoder: SpecDecoder) -> None:
    stats = AcceptanceStats()
    stats.observe(4, 3)
    stats.observe(2, 0)
    result = GenerationResult(token_ids=[40, 41, 42, 43, 44], stats=stats, finish_reason="length",
                              first_token_time_ns=0, last_token_time_ns=0)
    p = pending(decoder, PROMPT, 5, perf=True, exclude_input=False)
    p.first_scheduled, p.first_token, p.last_token = 10, 0, 30
    out = final_arrays(p, result)
    assert [int(t) for t in out["output_ids"].reshape(-1)] == PROMPT + [40, 41, 42, 43, 44]
    assert int(out["sequence_length"][0, 0]) == len(PROMPT) + 5
    assert int(out["total_draft_tokens"][0, 0]) == 6
    assert int(out["total_accepted_draft_tokens"][0, 0]) == 3
    assert float(out["acceptance_rate"][0, 0]) == pytest.approx(0.5)
    assert [int(out[k][0, 0]) for k in ("arrival_time_ns", "first_scheduled_time_ns",
                                         "first_token_time_ns", "last_token_time_ns")] == \
        [1, 10, 10, 30]  # no first token time: the scheduled time
    assert json.loads(out["spec_stats_json"][0, 0].decode()) == stats.to_dict()
    q = pending(decoder, PROMPT, 5)
    assert [int(t) for t in final_arrays(q, result)["output_ids"].reshape(-1)] == \
        [40, 41, 42, 43, 44]
    assert "total_draft_tokens" not in final_arrays(q, result)


def test_a_streamed_final_with_nothing_left_is_the_flag_alone(decoder: SpecDecoder) -> None:
    """An empty final response keeps tritonserver's ensembles live on SIGTERM (the server test:
    test_triton_serving_medusa.py::test_sigterm_unloads_every_model_after_streams)."""
    result = GenerationResult(token_ids=[40, 41], stats=AcceptanceStats(), finish_reason="length",
                              first_token_time_ns=0, last_token_time_ns=0)
    assert final_arrays(pending(decoder, PROMPT, 2, streaming=True), result) is None
    perf = final_arrays(pending(decoder, PROMPT, 2, streaming=True, perf=True),
                        result)
    assert perf is not None and int(perf["sequence_length"][0, 0]) == 0
    assert "total_draft_tokens" in perf


def test_a_proposer_that_cannot_join_a_batch_is_refused(decoder: SpecDecoder) -> None:
    oracle = SpecDecoder(decoder.target, OracleProposer([[1, 2]]))
    with pytest.raises(SpecserveError, match="oracle proposer .* cannot join a running batch"):
        make_scheduler(oracle, 2, 64, 256)


def test_finished_requests_reach_the_counters_and_a_failing_counter_costs_nothing(
        decoder: SpecDecoder) -> None:
    """``on_stats`` (the model's Prometheus counters, triton/spec_counters.py) gets every
    finished request's AcceptanceStats after its final response (the counters' I/O never delays
    it); when it raises, the responses still go out."""
    want = greedy(decoder, PROMPT, 4)
    wrong = (want[2] + 1) % decoder.target.cfg.vocab_size
    drafts = (want[0], want[1], wrong)
    for raising in (False, True):
        seen: list[dict[str, Any]] = []
        finals_then: list[int] = []  # final responses sent when on_stats was called
        ext = pending(decoder, PROMPT, 8, draft_ids=drafts)
        plain = pending(decoder, PROMPT, 4)
        senders = [p.sender for p in (ext, plain) if isinstance(p.sender, Recorder)]

        def on_stats(stats: dict[str, Any], raising: bool = raising,
                     seen: list[dict[str, Any]] = seen, finals_then: list[int] = finals_then,
                     senders: list[Recorder] = senders) -> None:
            seen.append(stats)
            finals_then.append(sum(len(s.finals) for s in senders))
            if raising:
                raise RuntimeError("metrics down")

        q: queue.Queue[Pending | None] = queue.Queue()
        loop = ServingLoop(make_scheduler(decoder, 2, 0, 256), q, 8, external_verify(decoder, 4),
                           lambda ids: "x" * len(ids), on_stats=on_stats)
        for p in (ext, plain, None):
            q.put(p)
        loop.run()
        by_drafted = sorted(seen, key=lambda s: s["draft_tokens"])
        assert [(s["draft_tokens"], s["accepted_tokens"]) for s in by_drafted] == [(0, 0), (3, 2)]
        assert finals_then == [1, 2]  # each request counted after its final response
        assert len(senders) == 2
        for sender in senders:
            assert len(sender.finals) == 1 and sender.finals[0][1] is None


class Ticks:
    """A trimmer that records the ``idle`` of every tick."""

    def __init__(self) -> None:
        self.idle: list[bool] = []

    def tick(self, idle: bool) -> bool:
        self.idle.append(idle)
        return False


def test_trimmer_ticks_idle_only_before_the_loop_waits(decoder: SpecDecoder) -> None:
    """The loop starts idle (its first tick says so: it is about to wait for work), then serves
    two requests with every tick saying busy; after the stop marker no tick says idle."""
    q: queue.Queue[Pending | None] = queue.Queue()
    ticks = Ticks()
    loop = ServingLoop(make_scheduler(decoder, 2, 0, 256), q, 8, external_verify(decoder, 4),
                       lambda ids: "x" * len(ids), trimmer=ticks)  # type: ignore[arg-type]
    senders = [Recorder(), Recorder()]
    for s in senders:
        q.put(pending(decoder, PROMPT, 6, s))
    q.put(None)
    loop.run()
    assert all(s.finals and s.finals[0][1] is None for s in senders)
    assert ticks.idle[0] is True and len(ticks.idle) >= 3
    assert not any(ticks.idle[1:])


def test_the_draft_length_policy_times_its_step_costs_when_the_batcher_is_made(
        decoder: SpecDecoder) -> None:
    """A served engine's draft-length policy has its step-cost curve, as wide as a full
    batch's verify forward (capacity x (K + 1) rows), before the first request: no timing
    forward runs inside a served step; engines without the policy time nothing."""
    from specserve.runtime.draft_policy import DraftLenPolicy
    from specserve.runtime.proposers import NgramProposer

    policy = DraftLenPolicy()
    spec = SpecDecoder(decoder.target, NgramProposer(max_draft_len=4), draft_policy=policy)
    make_scheduler(spec, 6, 64, 256)
    assert policy.cost is not None and policy.cost.rows[-1] >= 6 * 5
    plain = SpecDecoder(decoder.target)
    make_scheduler(plain, 6, 64, 256)
    assert plain.draft_policy is None
