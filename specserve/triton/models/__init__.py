"""Triton Python models. ``preprocessing``, ``postprocessing`` and ``bls`` are self-contained files
copied into a repository as ``1/model.py``; ``llm`` is imported by the reference ``tensorrt_llm``
model's shim (it needs the installed ``specserve`` runtime)."""
