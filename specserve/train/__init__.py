"""Training for the embedded demo model: a small code LM trained on the Python standard library,
a distilled draft model, and Medusa-1 heads (Cai et al. 2024) trained by self-distillation.

Modules: ``corpus`` (stdlib files, held-out split), ``tokenizer`` (byte-level BPE), ``lm``
(Llama training loop), ``distill`` (greedy continuations), ``medusa`` (heads, loss, layout),
``medusa_train`` (``specserve train-medusa``), ``evaluate`` (eval.json), ``demo`` (the pipeline).
"""
