"""specserve: speculative decoding (Medusa, draft model, n-gram) from Hugging Face checkpoints to
TensorRT-LLM engines or a PyTorch reference engine, served on Triton Inference Server, measured by a
client that records latency and acceptance statistics."""

__version__ = "0.1.0"
