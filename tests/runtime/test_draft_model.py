"""The draft-model proposer's backlog (``DraftModelProposer.backlog``, ``catch_up_s``): a row
that ran k = 0 steps is a token further behind the draft for each, the proposal after them
feeds those tokens first and times that apart, and the count follows rows that join and leave
a running batch (the draft-length policy reads both: ``runtime/draft_policy.py``)."""

from __future__ import annotations

import torch

from specserve.runtime.decoder import SamplingParams
from specserve.runtime.proposers import DraftModelProposer
from specserve.runtime.proposers.base import StepOutcome
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPT = [5, 6, 7, 8, 9, 10, 11]


def test_k0_steps_make_a_backlog_its_catch_up_timed_apart(tiny_models: TinyModels) -> None:
    """After its prefill the draft is two tokens behind, the most a step leaves (every draft
    accepted: the last draft and the bonus token): no backlog, no catch-up. A verify that kept
    one token leaves it one behind; three k = 0 steps make that four, a backlog of two, and
    the next proposal's catch-up goes to ``catch_up_s``; after it and a verify, none."""
    prop = DraftModelProposer(tiny_models.draft, max_draft_len=2)
    g = [torch.Generator().manual_seed(0)]
    with torch.inference_mode():
        prop.start([PROMPT], 64)
        seq = PROMPT + [40]
        assert prop.backlog() == 0
        prop.propose([seq], [2], [SamplingParams()], g)
        assert prop.catch_up_s == 0.0
        seq += [41]  # a verify that kept one token: the draft holds seq[:-1] after rollback
        prop.update(StepOutcome(torch.zeros(1, 3, 1), [1], [1], [seq]))
        for t in (42, 43, 44):  # three plain steps: the draft is not run
            seq += [t]
            prop.update(StepOutcome(torch.zeros(1, 1, 1), [0], [0], [seq]))
        assert prop.backlog() == 2
        prop.propose([seq], [2], [SamplingParams()], g)
        assert prop.catch_up_s > 0
        seq += [45]
        prop.update(StepOutcome(torch.zeros(1, 3, 1), [1], [1], [seq]))
        assert prop.backlog() == 0
        prop.propose([seq], [2], [SamplingParams()], g)
        assert prop.catch_up_s == 0.0


def test_the_backlog_follows_rows_that_join_and_leave(tiny_models: TinyModels) -> None:
    """In flight: two rows join (no backlog), the second falls five tokens beyond the usual
    two behind, the first leaves (the second moves into its row): the backlog is still the
    second row's five."""
    prop = DraftModelProposer(tiny_models.draft, max_draft_len=2)
    prop.reserve(3, 64)
    prompts = [PROMPT, [20, 21, 22]]
    with torch.inference_mode():
        prop.admit(prompts, StepOutcome(torch.zeros(2, 1, 1), [0, 0], [0, 0],
                                        [p + [1] for p in prompts]), [_nothing(), _nothing()])
        assert prop.backlog() == 0
        seqs = [PROMPT + [1], [20, 21, 22, 1, 2, 3, 4, 5, 6]]
        prop.update(StepOutcome(torch.zeros(2, 1, 1), [0, 0], [0, 0], seqs))
        assert prop.backlog() == 5
        prop.evict(0)
        assert prop.backlog() == 5


def _nothing() -> object:
    from specserve.runtime.proposers.base import NOTHING_RESTORED
    return NOTHING_RESTORED
