"""The engine every door serves (no Triton, torch imported lazily): its decoder and tokenizer
(:func:`load_decoder`), the limits requests are checked against (:func:`engine_limits`), its
in-flight batcher (:func:`make_scheduler`) and the verify calls of ``draft_input_ids``
(:func:`external_verify`).
Shared by the reference Triton model (``triton/models/llm.py``) and the Dynamo worker
(``frontends/dynamo_worker.py``), so both serve the same engine the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specserve.serving.request import PLAIN_ENGINE_MAX_DRAFT_LEN, EngineLimits

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord
    from specserve.runtime.batch import GenerationResult
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.kv_pool import KVEvent
    from specserve.runtime.scheduler import Scheduler
    from specserve.serving.loop import OnStep, Pending, VerifyFn


def load_decoder(engine_dir: str, speculation: bool, checkpoint: str = "target"
                 ) -> tuple[Any, Any, EngineRecord]:
    """(decoder, tokenizer, :class:`~specserve.engine_record.EngineRecord`) of a specserve
    engine; speculation off gives the target alone; ``checkpoint`` "draft" gives the engine's
    draft model alone (a draft-target engine's ``draft/``)."""
    from specserve.runtime.engine import load_engine

    if checkpoint == "draft":
        return _load_draft(engine_dir)

    engine = load_engine(engine_dir)
    decoder = engine.decoder
    if not speculation:
        from specserve.runtime.decoder import SpecDecoder

        decoder = SpecDecoder(decoder.target, None)
    return decoder, engine.tokenizer, engine.record


def _load_draft(engine_dir: str) -> tuple[Any, Any, EngineRecord]:
    """The draft checkpoint of a draft-target engine as a plain decoder."""
    from pathlib import Path

    from specserve.engine_record import read_engine_record
    from specserve.errors import SpecserveError
    from specserve.runtime import loader
    from specserve.runtime.decoder import SpecDecoder
    from specserve.runtime.model import load_model

    d = Path(engine_dir)
    rec = read_engine_record(d)
    if rec.spec_mode != "draft" or not (d / "draft").is_dir():
        raise SpecserveError(f"{d}: specserve_checkpoint 'draft' needs a draft-target engine "
                             f"(spec_mode {rec.spec_mode!r})")
    model = load_model(d / "draft", loader.parse_dtype(rec.dtype))
    tok_dir = d / "tokenizer" if (d / "tokenizer").is_dir() else d / "target"
    return SpecDecoder(model, None), loader.load_tokenizer(tok_dir), rec


def engine_limits(build: EngineRecord, vocab_size: int, eos: int | None) -> EngineLimits:
    """The served engine's limits (draft_input_ids: at most its max_draft_len; a plain engine:
    a fixed limit)."""
    draft = build.max_draft_len if build.spec_mode != "none" and build.max_draft_len > 0 \
        else PLAIN_ENGINE_MAX_DRAFT_LEN
    return EngineLimits(vocab_size=vocab_size, max_draft_len=draft,
                        max_input_len=build.max_input_len, max_seq_len=build.max_seq_len, eos=eos)


def make_scheduler(decoder: SpecDecoder, capacity: int, max_seq_len: int,
                   prefill_chunk: int, prefix_cache_bytes: int = 0,
                   on_event: Callable[[KVEvent], None] | None = None,
                   prefill_threads: int = 0) -> Scheduler:
    """The model's in-flight batcher (with a prefix cache of ``prefix_cache_bytes``, 0: none;
    ``on_event`` hears of its blocks stored and removed); SpecserveError for a proposer that
    cannot join a running batch (the model then fails to load with that message)."""
    from specserve.runtime.scheduler import Scheduler

    scheduler = Scheduler(decoder, capacity, max_seq_len or
                          decoder.target.cfg.max_position_embeddings,
                          prefill_chunk=prefill_chunk, prefix_cache_bytes=prefix_cache_bytes,
                          on_event=on_event, prefill_threads=prefill_threads)
    decoder.prepare_policy(capacity)  # timed at load, not inside served steps
    return scheduler


def external_verify(decoder: SpecDecoder, max_draft_len: int,
                    prefix_cache_bytes: int = 0) -> VerifyFn:
    """``draft_input_ids``: one ``SpecDecoder.verify`` with an ExternalDraftProposer; with a
    target-only prefix cache of ``prefix_cache_bytes`` (runtime/verify_cache.py; 0: none), so
    that the BLS loop's per-iteration calls prefill only the context's tail."""
    prefix = None
    if prefix_cache_bytes > 0:
        from specserve.runtime.verify_cache import VerifyPrefixCache

        plane = decoder.target.new_cache(1, 1).plane("target")
        prefix = VerifyPrefixCache(plane, prefix_cache_bytes, device=decoder.device)

    def verify(p: Pending, on_step: OnStep) -> GenerationResult:
        import torch

        from specserve.runtime.proposers import ExternalDraftProposer

        logits = None if p.req.draft_logits is None else torch.from_numpy(p.req.draft_logits)
        proposer = ExternalDraftProposer([p.req.draft_ids or ()], [logits],
                                         max_draft_len=max_draft_len)
        return decoder.verify([p.req.prompt], [p.params], proposer, on_step,
                              return_logits=[p.req.return_generation_logits],
                              prefix=prefix)[0]
    return verify
