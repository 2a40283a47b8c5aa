"""Self-contained helpers of the BLS model (the standard library and numpy, no ``pb_utils``):
copied into a repository as ``tensorrt_llm_bls/1/lib/``."""
