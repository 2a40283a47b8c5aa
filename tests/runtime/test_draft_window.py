"""A windowed draft (``DraftModelProposer.window``, ``specserve build --draft-window``): the
draft's proposing forwards attend only keys from the shortest row's length minus the window on
(MagicDec / TriForce draft with a bounded KV). Checked here: the window slices K, V and the mask
alike (equal to attending everything with the early keys masked out), its start, that it
changes the draft's proposals (a copy of the target accepts less), that the output stays the
target's own, and that the build records it and the engine applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specserve.cli.main import cli
from specserve.runtime.decoder import SamplingParams, SpecDecoder
from specserve.runtime.kvcache import StepInputs
from specserve.runtime.model import Transformer, _attention
from specserve.runtime.proposers import DraftModelProposer
from tests.helpers.tiny import TinyCheckpoint
from tests.runtime.conftest import TinyModels

torch.set_num_threads(1)

PROMPTS = [list(range(5, 40)), list(range(60, 81)), [7, 100, 7, 100, 7, 100, 7, 100, 9]]
GREEDY = SamplingParams(max_tokens=24)  # EOS off


def _filled_cache(model: Transformer, lens: list[int]) -> object:
    """A cache whose rows hold ``lens`` positions of random tokens (row b's later slots are
    stale, as a shorter row's are in a running batch)."""
    cache = model.new_cache(len(lens), 64)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (len(lens), max(lens)), generator=g)
    cache.lengths = [0] * len(lens)
    with torch.inference_mode():
        model(tokens, cache)
    cache.lengths = list(lens)
    return cache


@pytest.mark.parametrize("t", [1, 3])
def test_window_equals_masking_the_early_keys(tiny_models: TinyModels, t: int) -> None:
    """Rows of 20 and 13 positions, T new tokens, window 5: start = 13 - 5 = 8; attention over
    keys 8.. equals attention over every key with keys 0..7 masked out, for every layer's
    shapes (one layer's attention here, K/V written alike)."""
    model = tiny_models.target
    cache = _filled_cache(model, [20, 13])
    tokens = torch.tensor([[3, 4, 5][:t], [6, 7, 8][:t]])
    st_w = model.step_inputs(tokens, cache, window=5)
    st_0 = model.step_inputs(tokens, cache)
    assert st_w.start == 8 and st_0.start == 0
    assert st_w.mask is not None and st_w.mask.shape[-1] == st_w.span - 8
    keys = torch.arange(st_0.span)
    full = st_0.mask if st_0.mask is not None else torch.ones(1, 1, t, st_0.span,
                                                              dtype=torch.bool)
    masked = StepInputs(st_0.cos, st_0.sin, st_0.write, st_0.span, full & (keys >= 8))
    x = torch.randn(2, t, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    attn = model.layers[0].attn
    with torch.inference_mode():
        got = _attention(x, attn, cache.k[0].clone(), cache.v[0].clone(), st_w)
        want = _attention(x, attn, cache.k[0].clone(), cache.v[0].clone(), masked)
        unwindowed = _attention(x, attn, cache.k[0].clone(), cache.v[0].clone(), st_0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, unwindowed, atol=1e-4)  # the window does hide keys


def test_window_start_is_the_shortest_rows(tiny_models: TinyModels) -> None:
    model = tiny_models.target
    cache = _filled_cache(model, [20, 13])
    tok = torch.tensor([[3], [4]])
    assert model.step_inputs(tok, cache, window=13).start == 0  # the short row keeps all
    assert model.step_inputs(tok, cache, window=30).start == 0
    assert model.step_inputs(tok, cache, window=1).start == 12


@pytest.fixture(scope="module")
def reference(tiny_models: TinyModels) -> list[list[int]]:
    dec = SpecDecoder(tiny_models.target)
    return [dec.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def test_windowed_draft_stays_exact_and_proposes_differently(tiny_models: TinyModels,
                                                             reference: list[list[int]]) -> None:
    """A copy of the target as the draft: whole context, every draft accepted; windowed to 4
    keys its proposals are another model's, fewer are accepted, and the output is still the
    target's own token for token."""
    accepted = {}
    for window in (0, 4):
        draft = DraftModelProposer(tiny_models.target_copy, max_draft_len=4)
        draft.window = window
        out = SpecDecoder(tiny_models.target, draft).generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in out] == reference, window
        accepted[window] = sum(int(o.stats.accepted_tokens) for o in out)
        drafted = sum(int(o.stats.draft_tokens) for o in out)
        if window == 0:
            assert accepted[0] == drafted
    assert accepted[4] < accepted[0]


def test_build_records_the_window_and_the_engine_applies_it(tiny_ckpt: TinyCheckpoint,
                                                            tmp_path: Path) -> None:
    from specserve.runtime.engine import load_engine

    out = tmp_path / "dt"
    res = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), "--draft",
                                   str(tiny_ckpt.draft), "--draft-window", "8", "--backend",
                                   "torch", "--out", str(out)])
    assert res.exit_code == 0, res.output
    engine = load_engine(out)
    assert isinstance(engine.decoder.proposer, DraftModelProposer)
    assert engine.decoder.proposer.window == 8
    assert "--draft-window 8" in " ".join(engine.record.get("command") or [])


@pytest.mark.parametrize(("extra", "message"), [
    (["--ngram", "--draft-window", "8"], "--draft-window: only with --draft"),
    (["--draft", "D", "--draft-window", "0"], "--draft-window: must be >= 1"),
    (["--draft", "D", "--draft-window", "8", "--backend", "trtllm", "--dry-run"],
     "--draft-window: the reference decoder's"),
])
def test_build_refuses_a_window_it_cannot_serve(tiny_ckpt: TinyCheckpoint, tmp_path: Path,
                                                extra: list[str], message: str) -> None:
    extra = [str(tiny_ckpt.draft) if a == "D" else a for a in extra]
    backend = [] if "--backend" in extra else ["--backend", "torch"]
    res = CliRunner().invoke(cli, ["build", "--model", str(tiny_ckpt.target), *extra, *backend,
                                   "--out", str(tmp_path / "e")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "e").exists()
