"""The serving core shared by every front door: the request and its checks into
:class:`~specserve.runtime.params.SamplingParams` (:mod:`.request`, :mod:`.admission`), the
engine served and its parameters (:mod:`.engine`, :mod:`.engine_params`), the in-flight serving
loop (:mod:`.loop`) and its responses (:mod:`.responses`), incremental detokenization
(:mod:`.detok`) and finish reasons (:mod:`.finish`).

A door (the Triton models under ``specserve/triton/models/``, the Dynamo worker under
``specserve/frontends/``) maps its wire format to a :class:`~.request.LlmRequest` and the loop's
responses back, and nothing else. Nothing here imports Triton or Dynamo: the tests run without a
server."""
