"""The engine every door serves (no Triton, torch imported lazily): its decoder and tokenizer
(:func:`load_decoder`) and the limits requests are checked against (:func:`engine_limits`).
Shared by the reference Triton model (``triton/models/llm.py``) and the Dynamo worker
(``frontends/dynamo_worker.py``), so both serve the same engine the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specserve.serving.request import PLAIN_ENGINE_MAX_DRAFT_LEN, EngineLimits

if TYPE_CHECKING:
    from specserve.engine_record import EngineRecord


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
