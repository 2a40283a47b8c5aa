"""Front doors other than our own Triton model: adapters from another serving runtime's request
to the reference model's request types and serving loop (:mod:`specserve.triton.llm_io`,
:mod:`specserve.triton.serving_loop`)."""
