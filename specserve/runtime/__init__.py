"""specserve.runtime: the PyTorch reference speculative decoder (CPU or CUDA).

- :mod:`.model`: Llama/Mistral/Qwen2 forward with a static KV cache (``load_model``).
- :mod:`.proposers`: ``DraftModelProposer``, ``NgramProposer``, ``MedusaProposer``,
  ``OracleProposer`` (benchmarks).
- :mod:`.decoder`: ``SpecDecoder.generate(prompts, params, on_step)``, ``SamplingParams``,
  ``GenerationResult``.
- :mod:`.loader`: ``build_decoder(model_dir, medusa_dir=..., draft_dir=..., ngram=...)``.
- :mod:`.checkpoint`: checks shared with ``specserve build``; :mod:`.engine`: engine dirs.

Nothing is imported here so that ``import specserve.runtime`` stays free of torch.
"""
