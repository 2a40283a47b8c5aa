"""``specserve conform``: does speculation change what the API returns?

The same requests go to a speculative server and to a no-speculation baseline; each check ends
in pass, fail (with the smallest request that shows it), refused (the server said no) or broken
(crash, hang, 5xx, wrong shape). Seams: ``probe`` (the protocol-neutral request and reply),
``targets`` (one adapter per protocol over ``specserve.client``), ``stats`` (pure statistics),
``checks`` (the registry), ``matrix`` (rows, Markdown, JSON, the summary) and ``run`` (budget,
progress, evidence files).
"""
