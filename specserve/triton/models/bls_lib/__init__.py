"""Self-contained helpers of the BLS model (stdlib only): copied into a repository as
``tensorrt_llm_bls/1/lib/``."""
