"""One step of in-flight batching as data, in the split of vLLM v1's engine core: the scheduler
decides (``Scheduler.schedule() -> SchedulerOutput``: which requests run, how many tokens each,
the newcomers' data, the finished ids), the model runner executes
(``GPUModelRunner.execute_model(scheduler_output) -> ModelRunnerOutput``: sampled token ids per
request) and the scheduler applies the result (``Scheduler.update_from_output``: append tokens,
check stops, free what finished) - vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``,
``vllm/v1/core/sched/output.py``, ``vllm/v1/worker/gpu_model_runner.py``,
``vllm/v1/outputs.py``.

Here: :class:`StepPlan` is what :meth:`specserve.runtime.scheduler.Scheduler.schedule` returns
(and all it returns), :class:`specserve.runtime.runner.ModelRunner` executes it and returns
:class:`StepOutput` (one per phase: the newcomers' prefill, then the running rows' speculative
step), and ``Scheduler.update`` applies each. The plan names pool rows as the runner will see
them after ``evict``: newcomers go in the rows after the running ones, and all of them run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from specserve.runtime.batch import Batch, GenerationResult, RowOutput
from specserve.runtime.params import SamplingParams

OnTokens = Callable[[list[int]], None]
OnDone = Callable[[GenerationResult], None]


@dataclass
class Handle:
    """One submitted request (vLLM's ``Request``): its prompt and callbacks; ``cancelled`` is set
    by ``Scheduler.cancel``; ``row`` is its state (a one-row :class:`Batch`) from the step it is
    scheduled; ``result`` once it has finished."""

    prompt: list[int]
    params: SamplingParams
    on_tokens: OnTokens | None = None
    on_done: OnDone | None = None
    return_logits: bool = False
    cancelled: bool = False
    admitted_ns: int = 0   # time.monotonic_ns() when it got a slot
    arrival: int = 0       # its submission's number in its scheduler
    passed: int = 0        # steps in which a request that came after it joined while it waited
    decoded: bool = False  # it has taken a decode phase (it is generating, not just joined)
    result: GenerationResult | None = None
    row: Batch | None = field(default=None, repr=False)
    # prefix cache (runtime/kv_pool.py): the pool blocks it holds (reused or stored), the
    # hash chain of its full blocks so far, and how many leading blocks of it are in the pool
    blocks: list[int] = field(default_factory=list, repr=False)
    hashes: list[int] = field(default_factory=list, repr=False)
    stored: int = 0

    def state(self) -> Batch:
        """Its request state (scheduled requests only)."""
        assert self.row is not None, "scheduled requests have a row"
        return self.row


@dataclass(frozen=True)
class Join:
    """A newcomer (vLLM's ``NewRequestData``) prefilled this step into pool row ``row``; the
    first ``fed`` prompt tokens are in the runner's scratch row already (the last chunk of a
    chunked prompt), else 0. Its first token is sampled there; it takes the step's speculative
    step too."""

    handle: Handle
    row: int
    fed: int = 0
    blocks: tuple[int, ...] = ()  # its prompt's first blocks, restored from the prefix cache

    def cached(self, block_size: int) -> int:
        """Prompt tokens restored from the prefix cache (``blocks``)."""
        return len(self.blocks) * block_size

    def skip(self, block_size: int) -> int:
        """Prompt tokens in its row before its prefill forward (from the scratch row or the
        prefix cache)."""
        return self.fed or self.cached(block_size)


@dataclass(frozen=True)
class Store:
    """Copy full blocks of pool row ``row`` (the rows as the previous plan left them: row i =
    the previous plan's ``decode[i]``) into the prefix cache before this plan's evictions:
    ``blocks`` pairs (block index in the row's sequence, pool block id)."""

    row: int
    blocks: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Chunk:
    """One chunk, ``prompt[start:stop]``, of a long prompt fed into the runner's scratch row
    (chunked prefill, Sarathi: Agrawal et al. 2024); its last chunk is a :class:`Join`."""

    handle: Handle
    start: int
    stop: int


@dataclass(frozen=True)
class StepPlan:
    """What one step does, decided before it runs.

    ``evict``: pool rows that leave first, in this order (each: the last row moves into it;
    what finished or was cancelled since the last plan); ``decode``: the requests that take one
    speculative step, pool row i = ``decode[i]``: the running ones, then the newcomers;
    ``join``: the newcomers, prefilled first into the rows after the running ones, in row
    order; ``chunk``: a long prompt's chunk into the scratch row;
    ``token_budget``: prompt tokens the running rows may wait for between two decode phases
    (``prefill_chunk``; more while none has decoded: ``scheduler.IDLE_PREFILL_TOKENS``);
    ``prefill_tokens``: this step's (the chunk's included; prefixes restored from the prefix
    cache are not); ``store``: blocks copied into the prefix cache first (:class:`Store`);
    ``decodes``: whether the speculative step runs after the prefill (False: a prefill-only
    step, more prompts wait and the running rows' wait is within its bound)."""

    evict: tuple[int, ...]
    decode: tuple[Handle, ...]
    join: tuple[Join, ...]
    chunk: Chunk | None
    token_budget: int
    prefill_tokens: int
    store: tuple[Store, ...] = ()
    decodes: bool = True

    @property
    def empty(self) -> bool:
        return not (self.evict or self.decode or self.join or self.chunk or self.store)


@dataclass(frozen=True)
class StepOutput:
    """What the runner did for one phase of a plan (vLLM's ``ModelRunnerOutput``): ``rows[i]``
    belongs to ``plan.join[i]`` (phase "prefill") or ``plan.decode[i]`` (phase "decode")."""

    phase: Literal["prefill", "decode"]
    rows: tuple[RowOutput, ...]
