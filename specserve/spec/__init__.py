"""Pure speculative-decoding math: verification (greedy, rejection sampling), Medusa trees,
acceptance statistics and the speedup predictor. Tensors in, small dataclasses out, randomness
only from an explicit ``torch.Generator``; no models, files or network."""
