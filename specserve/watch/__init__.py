"""``specserve watch``: a canary for silent acceptance collapse in production.

It polls each worker's Prometheus ``/metrics`` (:mod:`.series` reads the exposition text of
specserve's Triton model, vLLM, TensorRT-LLM 1.3 and SGLang), turns consecutive scrapes into
one interval's figures summed over the workers (:mod:`.interval`: counter resets handled),
compares each interval's acceptance rate and tokens per step with a baseline from a
``specserve bench`` summary or a ``specserve doctor`` probe (:mod:`.baseline`) under one rule
(:mod:`.rule`), and writes the same rule as Prometheus alerting rules (:mod:`.rules_yaml`).
:mod:`.run` is the only module that does I/O (HTTP, clock). Why: in field reports acceptance
falls to ~0 with no error, and no engine alarms.
"""
