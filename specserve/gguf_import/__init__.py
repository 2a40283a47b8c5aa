"""Importing GGUF checkpoints (llama.cpp's format) as Hugging Face directories the reference
decoder and ``specserve build`` read: :func:`import_gguf`."""

from specserve.gguf_import.convert import (
    ImportConfig,
    ImportResult,
    PreparedImport,
    import_gguf,
    prepare_import,
    write_import,
)

__all__ = ["ImportConfig", "ImportResult", "PreparedImport", "import_gguf", "prepare_import",
           "write_import"]
