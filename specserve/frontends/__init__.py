"""Front doors other than Triton: adapters from another serving runtime's request to the serving
core's request and serving loop (:mod:`specserve.serving.request`,
:mod:`specserve.serving.loop`), and the processes that run them. Nothing here imports
``specserve.triton``."""
